from __future__ import annotations

import os

import pytest
import torch

from radixlm.mem_cache import ReqToTokenPool, TokenToKVPool


def make_pool(size: int = 8, debug: bool = True) -> TokenToKVPool:
    return TokenToKVPool(
        size, num_layers=2, num_kv_heads=2, head_dim=4, dtype=torch.float32, debug=debug
    )


def test_req_to_token_pool_alloc_free_exhaustion() -> None:
    pool = ReqToTokenPool(3, max_context_len=16)
    assert pool.req_to_token.shape == (3, 16) and pool.req_to_token.dtype == torch.int64
    rows = [pool.alloc() for _ in range(3)]
    assert sorted(r for r in rows if r is not None) == [0, 1, 2]
    assert pool.alloc() is None and pool.available_size() == 0
    pool.free(1)
    assert pool.available_size() == 1 and pool.alloc() == 1
    pool.check_integrity()


def test_req_to_token_pool_rejects_double_free() -> None:
    pool = ReqToTokenPool(2, max_context_len=4)
    row = pool.alloc()
    assert row is not None
    pool.free(row)
    with pytest.raises(ValueError, match="double free"):
        pool.free(row)
    with pytest.raises(ValueError, match="out of range"):
        pool.free(5)
    pool.clear()
    assert pool.available_size() == 2
    pool.check_integrity()


def test_kv_pool_alloc_free_exhaustion_clear() -> None:
    pool = make_pool(8)
    a = pool.alloc(5)
    assert a is not None and a.dtype == torch.int64 and a.shape == (5,)
    assert pool.alloc(4) is None  # only 3 left: nothing is taken
    assert pool.available_size() == 3
    b = pool.alloc(3)
    assert b is not None
    slots = torch.cat([a, b])
    assert sorted(slots.tolist()) == list(range(1, 9))  # slot 0 is never handed out
    assert pool.alloc(1) is None
    empty = pool.alloc(0)
    assert empty is not None and empty.numel() == 0
    pool.free(a[:2])
    pool.free(b)
    assert pool.available_size() == 5
    again = pool.alloc(5)  # needs the pending frees merged
    assert again is not None and sorted(again.tolist()) == sorted(a[:2].tolist() + b.tolist())
    pool.check_integrity()
    pool.clear()
    assert pool.available_size() == 8
    pool.check_integrity()


def test_kv_pool_free_copies_its_argument() -> None:
    pool = make_pool(4)
    a = pool.alloc(4)
    assert a is not None
    pool.free(a)
    a.fill_(0)  # the caller reuses its tensor
    assert sorted(pool.free_slots().tolist()) == [1, 2, 3, 4]


def test_kv_pool_debug_catches_double_free_and_bad_slots() -> None:
    pool = make_pool(4)
    a = pool.alloc(2)
    assert a is not None
    pool.free(a)
    with pytest.raises(ValueError, match="double free"):
        pool.free(a[:1])
    with pytest.raises(ValueError, match="outside"):
        pool.free(torch.tensor([0]))
    b = pool.alloc(2)
    assert b is not None
    with pytest.raises(ValueError, match="twice"):
        pool.free(torch.cat([b, b]))


def test_kv_pool_check_integrity_catches_double_free_without_debug() -> None:
    pool = make_pool(4, debug=False)
    a = pool.alloc(2)
    assert a is not None
    pool.free(a)
    pool.free(a)
    with pytest.raises(AssertionError):
        pool.check_integrity()


def test_kv_buffers() -> None:
    pool = make_pool(4)
    k, v = pool.get_kv_buffer(1)
    assert k.shape == v.shape == (5, 2, 4)
    loc = torch.tensor([3, 1])
    new_k = torch.randn(2, 2, 4, dtype=torch.float64)  # cast to the pool's dtype
    new_v = torch.randn(2, 2, 4)
    pool.set_kv_buffer(1, loc, new_k, new_v)
    k, v = pool.get_kv_buffer(1)
    torch.testing.assert_close(k[loc], new_k.float())
    torch.testing.assert_close(v[loc], new_v)
    assert pool.get_kv_buffer(0)[0].abs().sum() == 0


def test_bytes_per_token() -> None:
    assert TokenToKVPool.bytes_per_token(30, 3, 64, torch.float32) == 2 * 30 * 3 * 64 * 4
    assert TokenToKVPool.bytes_per_token(2, 1, 8, torch.bfloat16) == 2 * 2 * 8 * 2
    for name in ("bfloat16", "bf16"):  # half of float32's, as a bf16 run's auto
        assert TokenToKVPool.bytes_per_token(30, 3, 64, torch.float32, name) == 2 * 30 * 3 * 64 * 2


def test_bf16_pool_under_a_float32_run() -> None:
    """--kv-cache-dtype bf16 with float32 compute: stored rounded to bf16, read back as
    float32, named bfloat16 (the disk tier's namespace: the bytes a bf16 run's auto
    stores), 2x the tokens of auto in the same memory."""
    pool = TokenToKVPool(8, 2, 2, 4, torch.float32, "cpu", kv_cache_dtype="bf16")
    assert pool.kv_cache_dtype == "bfloat16" and pool.tokens_vs_auto() == 2.0
    loc = torch.tensor([3, 1])
    new_k, new_v = torch.randn(2, 2, 4), torch.randn(2, 2, 4)
    pool.set_kv_buffer(0, loc, new_k, new_v)
    k, v = pool.get_kv_buffer(0)
    assert k.dtype == torch.bfloat16
    assert torch.equal(k[loc], new_k.to(torch.bfloat16)) and torch.equal(v[loc], new_v.to(torch.bfloat16))


def test_many_small_frees_stay_consistent() -> None:
    pool = make_pool(3000, debug=False)
    slots = pool.alloc(3000)
    assert slots is not None
    for s in slots.split(1):  # more frees than the pending-list bound
        pool.free(s)
    assert pool.available_size() == 3000
    pool.check_integrity()


def test_kv_pool_reuses_freed_slots_before_fresh_ones() -> None:
    pool = make_pool(16)
    a = pool.alloc(5)
    assert a is not None and a.tolist() == [1, 2, 3, 4, 5]  # lowest first
    pool.free(a[1:3])  # slots 2, 3: pending, not merged yet
    b = pool.alloc(4)  # the two freed slots first, then fresh ones
    assert b is not None and b.tolist() == [2, 3, 6, 7]
    pool.check_integrity()
    # Requests come and go, never more than 7 slots in use at once: nothing above 7 is
    # ever handed out, so no page of K/V above slot 7 is ever written.
    held = torch.cat([a[:1], a[3:], b])
    for _ in range(50):
        pool.free(held[:3])
        new = pool.alloc(3)
        assert new is not None and int(new.max()) <= 7
        held = torch.cat([held[3:], new])
    assert pool.available_size() == 16 - 7
    pool.check_integrity()
    pool.clear()
    again = pool.alloc(3)
    assert again is not None and again.tolist() == [1, 2, 3]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _resident_bytes(t: torch.Tensor) -> int:
    """Bytes of t's storage in pages present in memory (/proc/self/pagemap's bit 63)."""
    page = os.sysconf("SC_PAGE_SIZE")
    first = t.untyped_storage().data_ptr() // page
    end = -(-(t.untyped_storage().data_ptr() + t.untyped_storage().nbytes()) // page)
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = memoryview(f.read((end - first) * 8)).cast("Q")
    return sum(1 for e in entries if e >> 63) * page


@pytest.mark.skipif(not os.path.exists("/proc/self/pagemap"), reason="Linux /proc")
@pytest.mark.parametrize("kv_cache_dtype,dtype", [("auto", torch.bfloat16),
                                                  ("auto", torch.float32), ("int8", torch.bfloat16),
                                                  ("fp8_e4m3", torch.bfloat16)])
def test_kv_pool_memory_counts_in_rss_only_once_written(kv_cache_dtype: str,
                                                       dtype: torch.dtype) -> None:
    # 4 layers x 8 heads x head dim 64: 2-8 KiB of K plus V a slot, a pool of 256 MiB.
    per_token = TokenToKVPool.bytes_per_token(4, 8, 64, dtype, kv_cache_dtype)
    size = (256 << 20) // per_token
    before = _rss_bytes()
    pool = TokenToKVPool(size, num_layers=4, num_kv_heads=8, head_dim=64, dtype=dtype,
                         kv_cache_dtype=kv_cache_dtype)
    reqs = ReqToTokenPool(64, max_context_len=128 * 1024)  # 64 MiB of int64
    grown = _rss_bytes() - before
    assert grown < (16 << 20), f"allocating 320 MiB of pools made {grown >> 20} MiB resident"
    buffers = [b for _, b in pool.slot_buffers()]
    assert sum(_resident_bytes(b) for b in [*buffers, reqs.req_to_token]) == 0
    storage = pool.kv_format.storage
    for k, v in (pool.get_kv_buffer(i) for i in range(4)):
        assert k.dtype == v.dtype == storage and k.shape == (size + 1, 8, pool.kv_format.row_width)
        assert k.is_contiguous() and k.data_ptr() % 4096 == 0
        assert not k[-4:].float().any() and not v[:4].float().any()  # zeros
    assert not reqs.req_to_token[-1].any()
    # Writing 1,000 tokens makes their bytes resident (plus two pages a buffer at most,
    # and the pages read above).
    loc = pool.alloc(1000)
    assert loc is not None
    for i in range(4):
        kv = torch.randn(1000, 8, 64, dtype=dtype)
        pool.set_kv_buffer(i, loc, kv, kv)
    resident = sum(_resident_bytes(b) for b in buffers)
    assert 1000 * per_token <= resident <= 1000 * per_token + 8 * 4 * 4096
    k, _ = pool.get_kv_buffer(3)
    assert k[1 : 1001].float().abs().sum() > 0 and not k[1001:1010].float().any()
