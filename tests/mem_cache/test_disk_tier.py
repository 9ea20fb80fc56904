"""The disk tier's parts without a scheduler: keys, the block file format, the store (LRU,
byte bound, restart, flush, damaged files) and the tier over a real pool and radix tree."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch

from radixlm.mem_cache.disk_block_file import (
    SUFFIX,
    BlockFileError,
    BlockMeta,
    read_block,
    write_block,
)
from radixlm.mem_cache.disk_key import (
    BlockHasher,
    BufferSpec,
    PseudoTokenHashes,
    make_namespace,
    model_identity,
    pool_layout,
)
from radixlm.mem_cache.disk_store import DiskStore, PendingBlock
from radixlm.mem_cache.disk_tier import KVDiskTier
from radixlm.mem_cache.memory_pool import TokenToKVPool
from radixlm.mem_cache.radix_cache import RadixCache

VOCAB = 1000
NS = b"\x01" * 16


def hasher(block: int = 4, ns: bytes = NS, pseudo: PseudoTokenHashes | None = None
           ) -> BlockHasher:
    return BlockHasher(ns, block, VOCAB, pseudo or PseudoTokenHashes())


# ---------------------------------------------------------------------- keys


def test_keys_are_a_chain_over_the_whole_prefix() -> None:
    h = hasher()
    tokens = list(range(1, 15))
    keys = h.keys(tokens)
    assert len(keys) == 3  # full blocks only
    assert h.keys(tokens[:9]) == keys[:2] and h.keys(tokens, 1) == keys[:1]
    assert len(set(keys)) == 3
    other = h.keys([99] + tokens[1:])  # a change in block 0 changes every later key
    assert not set(other) & set(keys)
    assert not set(hasher(ns=b"\x02" * 16).keys(tokens)) & set(keys)


def test_image_pseudo_tokens_are_keyed_by_the_full_image_hash() -> None:
    pseudo = PseudoTokenHashes()
    h = hasher(pseudo=pseudo)
    pad = VOCAB + 7
    tokens = [1, 2, 3, 4, pad, pad, pad, pad, 5, 6, 7, 8]
    assert h.keys(tokens) == h.keys(tokens[:4])  # unknown image: no key from its block on
    pseudo.add(pad, 1111)
    first = h.keys(tokens)
    assert len(first) == 3
    other = PseudoTokenHashes()
    other.add(pad, 2222)  # another image with the same 30-bit pad value
    assert hasher(pseudo=other).keys(tokens)[1:] != first[1:]
    pseudo.add(pad, 2222)  # both seen here: ambiguous, never keyed
    assert h.keys(tokens) == first[:1]


def test_namespace_depends_on_model_precision_and_layout(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"x")
    ident = model_identity(None, str(tmp_path))
    layout = pool_layout(TokenToKVPool(4, 1, 1, 2, torch.float32).slot_buffers())
    base = make_namespace(ident, {"dtype": "float32"}, layout, "float32", 64)
    assert base == make_namespace(model_identity(None, str(tmp_path)), {"dtype": "float32"},
                                  layout, "float32", 64)
    bf16 = pool_layout(TokenToKVPool(4, 1, 1, 2, torch.bfloat16).slot_buffers())
    assert make_namespace(ident, {"dtype": "float32"}, bf16, "bfloat16", 64) != base
    assert make_namespace(ident, {"dtype": "bfloat16"}, layout, "float32", 64) != base
    assert make_namespace(ident, {"dtype": "float32"}, layout, "float32", 32) != base
    time.sleep(0.01)
    (tmp_path / "model.safetensors").write_bytes(b"y")
    assert make_namespace(model_identity(None, str(tmp_path)), {"dtype": "float32"}, layout,
                          "float32", 64) != base


# ---------------------------------------------------------------------- block files

LAYOUT = (BufferSpec("k0", "bfloat16", (2, 3)), BufferSpec("k0_scale", "float32", (2,)),
          BufferSpec("v0", "int8", (2, 3)))


def rows(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, 2, 3, generator=g).to(torch.bfloat16),
            torch.rand(n, 2, generator=g),
            torch.randint(-128, 127, (n, 2, 3), generator=g, dtype=torch.int8)]


def empty(n: int) -> list[torch.Tensor]:
    return [torch.empty(n, *s.row_shape, dtype=getattr(torch, s.dtype)) for s in LAYOUT]


def test_block_file_round_trip_keeps_every_buffer_bit_exact(tmp_path: Path) -> None:
    meta = BlockMeta(NS, b"\x09" * 16, [5, 6, 7, 8], LAYOUT)
    src = rows(4)
    path = str(tmp_path / ("b" + SUFFIX))
    size = write_block(path, meta, src)
    assert size == os.path.getsize(path) == meta.file_bytes
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]
    dest = empty(4)
    assert read_block(path, meta, dest) == size
    for a, b in zip(src, dest, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:-1], "cut short"),
    (lambda d: d + b"\0", "padded"),
    (lambda d: d[:-30] + bytes([d[-30] ^ 4]) + d[-29:], "checksum"),
    (lambda d: b"XXXXXXXX" + d[8:], "not a version"),
    (lambda d: d[:12] + d[12:40].replace(b"namespace", b"namespacX") + d[40:], "namespace"),
    (lambda d: d[:12] + b"!" + d[13:], "unreadable header"),
])
def test_a_damaged_block_file_is_refused(tmp_path: Path, damage: object, message: str) -> None:
    meta = BlockMeta(NS, b"\x09" * 16, [5, 6, 7, 8], LAYOUT)
    path = str(tmp_path / ("b" + SUFFIX))
    write_block(path, meta, rows(4))
    data = Path(path).read_bytes()
    Path(path).write_bytes(damage(data))  # type: ignore[operator]
    with pytest.raises(BlockFileError, match=message):
        read_block(path, meta, empty(4))


def test_a_block_file_answers_only_for_its_own_key_tokens_and_model(tmp_path: Path) -> None:
    meta = BlockMeta(NS, b"\x09" * 16, [5, 6, 7, 8], LAYOUT)
    path = str(tmp_path / ("b" + SUFFIX))
    write_block(path, meta, rows(4))
    for other, message in [
        (BlockMeta(NS, b"\x08" * 16, [5, 6, 7, 8], LAYOUT), "key differs"),
        (BlockMeta(NS, b"\x09" * 16, [5, 6, 7, 9], LAYOUT), "token ids"),
        (BlockMeta(b"\x02" * 16, b"\x09" * 16, [5, 6, 7, 8], LAYOUT), "namespace"),
        (BlockMeta(NS, b"\x09" * 16, [5, 6, 7, 8], LAYOUT[:2]), "layout"),
    ]:
        with pytest.raises(BlockFileError, match=message):
            read_block(path, other, empty(4))


# ---------------------------------------------------------------------- the store


def block(key: int, n: int = 4) -> PendingBlock:
    meta = BlockMeta(NS, bytes([key]) * 16, list(range(key, key + n)), LAYOUT)
    return PendingBlock(meta, rows(n, seed=key), meta.payload_bytes)


def read(store: DiskStore, b: PendingBlock) -> list[torch.Tensor] | None:
    dest = empty(len(b.meta.tokens))
    return dest if store.read(b.meta, dest) else None


def test_store_writes_in_the_background_and_reads_back(tmp_path: Path) -> None:
    store = DiskStore(str(tmp_path), 1 << 20)
    b = block(1)
    assert store.put(b) and store.contains(b.meta.key)
    got = read(store, b)  # pending or written: readable at once
    assert got is not None and all(torch.equal(x, y) for x, y in zip(got, b.rows))
    assert store.wait_idle(5)
    assert os.path.exists(store.path(NS, b.meta.key))
    assert store.stats()["kv_disk_blocks"] == 1 and store.stats()["kv_disk_pending_blocks"] == 0
    store.check_integrity()
    store.close()


def test_store_keeps_its_byte_bound_least_recently_used_first(tmp_path: Path) -> None:
    size = block(1).meta.file_bytes
    store = DiskStore(str(tmp_path), 3 * size + 10)
    for k in (1, 2, 3):
        store.put(block(k))
        assert store.wait_idle(5)
    store.touch([block(1).meta.key])  # 1 is now the most recently used
    store.put(block(4))
    assert store.wait_idle(5)
    held = [k for k in (1, 2, 3, 4) if store.contains(block(k).meta.key)]
    assert held == [1, 3, 4]
    assert store.stats()["kv_disk_bytes"] <= store.max_bytes
    assert store.stats()["kv_disk_evicted_blocks_total"] == 1
    assert not os.path.exists(store.path(NS, block(2).meta.key))
    store.check_integrity()
    store.close()


def test_a_chain_is_dropped_from_its_tail(tmp_path: Path) -> None:
    """touch() of a chain leaves its first block the most recently used."""
    size = block(1).meta.file_bytes
    store = DiskStore(str(tmp_path), 3 * size + 10)
    for k in (1, 2, 3):
        store.put(block(k))
    assert store.wait_idle(5)
    store.touch([block(k).meta.key for k in (1, 2, 3)])
    store.put(block(9))
    assert store.wait_idle(5)
    assert [k for k in (1, 2, 3) if store.contains(block(k).meta.key)] == [1, 2]
    store.close()


def test_a_restart_finds_the_blocks_in_their_lru_order(tmp_path: Path) -> None:
    size = block(1).meta.file_bytes
    store = DiskStore(str(tmp_path), 3 * size + 10)
    for k in (1, 2, 3):
        store.put(block(k))
        assert store.wait_idle(5)
        time.sleep(0.01)  # distinct modification times
    assert read(store, block(1)) is not None  # a read marks the file as used (mtime)
    store.close()
    (tmp_path / "stale.kvb.123.tmp").write_bytes(b"half")
    old = time.time() - 3600
    os.utime(tmp_path / "stale.kvb.123.tmp", (old, old))
    again = DiskStore(str(tmp_path), 3 * size + 10)
    assert again.stats()["kv_disk_blocks"] == 3
    assert not (tmp_path / "stale.kvb.123.tmp").exists()
    again.put(block(4))
    assert again.wait_idle(5)
    assert [k for k in (1, 2, 3, 4) if again.contains(block(k).meta.key)] == [1, 3, 4]
    got = read(again, block(3))
    assert got is not None and torch.equal(got[0], block(3).rows[0])
    again.check_integrity()
    again.close()


def test_a_full_write_queue_drops_blocks_instead_of_waiting(tmp_path: Path) -> None:
    b = block(1)
    store = DiskStore(str(tmp_path), 1 << 20, max_pending_bytes=b.num_bytes)
    store._lock.acquire()  # hold the writer: the first block stays pending
    try:
        store._pending[b.meta.key] = b
        store._num_pending_bytes += b.num_bytes
    finally:
        store._lock.release()
    assert not store.put(block(2))
    assert store.stats()["kv_disk_dropped_blocks_total"] == 1
    store._pending.clear()
    store._num_pending_bytes = 0
    store.close()


def test_flush_deletes_one_model_s_blocks(tmp_path: Path) -> None:
    store = DiskStore(str(tmp_path), 1 << 20)
    other = PendingBlock(BlockMeta(b"\x02" * 16, b"\x07" * 16, [1, 2, 3, 4], LAYOUT),
                         rows(4), block(1).num_bytes)
    for b in (block(1), block(2), other):
        store.put(b)
    assert store.wait_idle(5)
    store.flush(NS)
    assert not store.contains(block(1).meta.key) and store.contains(other.meta.key)
    assert [p.name for p in tmp_path.rglob("*" + SUFFIX)] == [other.meta.key.hex() + SUFFIX]
    store.check_integrity()
    store.close()


def test_a_missing_file_is_a_miss_and_fails_the_integrity_check(tmp_path: Path) -> None:
    store = DiskStore(str(tmp_path), 1 << 20)
    b = block(1)
    store.put(b)
    assert store.wait_idle(5)
    os.unlink(store.path(NS, b.meta.key))
    with pytest.raises(AssertionError, match="missing"):
        store.check_integrity()
    assert read(store, b) is None and not store.contains(b.meta.key)
    store.check_integrity()
    store.close()


# ---------------------------------------------------------------------- the tier


class ScaledPool(TokenToKVPool):
    """An int8 pool with per-token scales, as a quantized KV cache keeps them: the tier
    stores whatever `slot_buffers()` lists, bytes as they are."""

    def __init__(self, size: int) -> None:
        super().__init__(size, 2, 2, 4, torch.int8)
        self.scales = [torch.zeros(size + 1, 2) for _ in range(2)]

    def slot_buffers(self) -> list[tuple[str, torch.Tensor]]:
        return super().slot_buffers() + [(f"s{i}", s) for i, s in enumerate(self.scales)]


@pytest.mark.parametrize("pool_cls", [TokenToKVPool, ScaledPool])
def test_evicted_blocks_come_back_into_other_slots(tmp_path: Path, pool_cls: type) -> None:
    pool = (pool_cls(64, 2, 2, 4, torch.bfloat16) if pool_cls is TokenToKVPool
            else pool_cls(64))
    layout = pool_layout(pool.slot_buffers())
    tier = KVDiskTier(pool, DiskStore(str(tmp_path), 1 << 20),
                      make_namespace({}, {}, layout, pool.kv_cache_dtype, 4), 4, VOCAB)
    cache = RadixCache(pool, eviction_sink=tier)
    tokens = list(range(1, 11))  # two full blocks and 2 tokens
    slots = pool.alloc(10)
    assert slots is not None
    g = torch.Generator().manual_seed(0)
    for _, buf in pool.slot_buffers():
        buf[slots] = (torch.randn(10, *buf.shape[1:], generator=g) * 50).to(buf.dtype)
    original = [buf[slots].clone() for _, buf in pool.slot_buffers()]
    cache.cache_finished(tokens, slots, None)
    assert cache.evict(10) == 10
    assert tier.store.wait_idle(5)
    assert tier.store.stats()["kv_disk_blocks"] == 2
    hit = tier.lookup(tokens + [77], 0)
    assert hit is not None and (hit.start, hit.end) == (0, 8)
    assert tier.lookup(tokens, 5) == hit._replace(start=4, keys=hit.keys[1:],
                                                   tokens=hit.tokens[4:])
    load = tier.load(hit)
    load.future.result(timeout=5)
    assert load.num_tokens() == 8
    new = pool.alloc(6)
    assert new is not None
    tier.write_to_pool(load, 2, new)  # tokens [2, 8) into fresh slots
    for (_, buf), orig in zip(pool.slot_buffers(), original, strict=True):
        assert torch.equal(buf[new], orig[2:8])
    pool.free(new)
    tier.check_integrity()
    tier.close()


def test_tier_metrics_split_hits_by_tier() -> None:
    from radixlm.metrics import Metrics

    m = Metrics("m")
    m.update_from_server_info({"num_cached_prompt_tokens_total": 30,
                               "num_cached_prompt_tokens_disk_total": 12,
                               "kv_disk_max_bytes": 100, "kv_disk_bytes": 40,
                               "kv_disk_written_blocks_total": 3, "kv_disk_read_bytes_total": 9})
    text = m.render().decode()
    assert 'radixlm:cache_hit_tokens_total{model_name="m",tier="pool"} 18.0' in text
    assert 'radixlm:cache_hit_tokens_total{model_name="m",tier="disk"} 12.0' in text
    assert 'radixlm:kv_disk_bytes{model_name="m"} 40.0' in text
    assert 'radixlm:kv_disk_spilled_blocks_total{model_name="m"} 3.0' in text
    assert 'radixlm:kv_disk_loaded_bytes_total{model_name="m"} 9.0' in text
    m.update_from_server_info({})
    assert "kv_disk_bytes" not in m.render().decode()
