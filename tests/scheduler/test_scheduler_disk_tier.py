"""The scheduler with a disk tier (`--kv-cache-dir`) against a fake runner whose KV is in
the pool: a slot's K row holds the token computed there, so a block written to disk and
read back wrong, or installed into the wrong slots, changes the next tokens.

The next token is a pure function of the whole sequence, so every output is compared
with running the request alone; the KV accounting (pool and disk) is checked after every
step.
"""

from __future__ import annotations

import gc
import logging
import os
import time
from pathlib import Path

import pytest
import torch

from radixlm.mem_cache.disk_block_file import SUFFIX
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.messages.forward_step import ForwardStep, StepResult
from radixlm.messages.io_struct import TokenizedGenerateReq
from radixlm.messages.sampling_params import SamplingParams
from radixlm.model_executor.precision import Precision
from radixlm.scheduler.scheduler import Scheduler
from radixlm.server_args import ServerArgs

VOCAB = 97
EOS = 0
BLOCK = 8


def next_token(seq: list[int]) -> int:
    return (sum(seq) * 31 + len(seq)) % (VOCAB - 1) + 1  # never EOS


class FakeTokenizer:
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) for i in ids)


class PoolRunner:
    """A fake model whose "KV" of a slot is the token written there, kept in the pool's
    layer-0 K buffer (and its negation in V), read back through the request's row."""

    is_generation = True
    needs_whole_prompt = False
    model = None
    config = None
    grammar_mask_seconds = 0.0
    num_grammar_mask_steps = 0

    def __init__(self, num_tokens: int, model_dir: str) -> None:
        self.token_to_kv_pool = TokenToKVPool(num_tokens, 2, 1, 2, torch.float32, debug=True)
        self.req_to_token_pool = ReqToTokenPool(16, 1024)
        self.eos_token_ids = {EOS}
        self.context_len = 1000
        self.vocab_size = VOCAB
        self.precision = Precision(torch.float32, "none", "test")
        self.model_path = model_dir
        self.num_forward_tokens = 0

    def update_weights_from_disk(self, model_path: str, load_format: str | None
                                 ) -> tuple[bool, str]:
        self.model_path = model_path
        return True, "ok"

    def forward(self, step: ForwardStep) -> StepResult:
        pool = self.token_to_kv_pool
        slots = step.out_cache_loc
        offset, ids = 0, []
        for item in step.items:
            loc = slots[offset : offset + item.extend_len]
            tokens = torch.tensor(item.input_ids, dtype=torch.float32)
            for layer in range(pool.num_layers):
                pool.k_buffers[layer][loc] = tokens.view(-1, 1, 1).expand(-1, 1, 2)
                pool.v_buffers[layer][loc] = -tokens.view(-1, 1, 1).expand(-1, 1, 2)
            offset += item.extend_len
            self.num_forward_tokens += item.extend_len
            if item.num_sample_rows:
                row = self.req_to_token_pool.req_to_token[item.req_pool_idx]
                end = item.prefix_len + item.extend_len
                seq = [int(x) for x in pool.k_buffers[1][row[:end], 0, 1].tolist()]
                assert all(s > 0 for s in seq), "a position's KV was never written"
                ids.append(next_token(seq))
        n = len(ids)
        return StepResult(ids, [None] * n, [None] * n, [None] * len(step.items))


@pytest.fixture
def model_dir(tmp_path: Path) -> str:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text('{"model_type": "fake"}')
    (path / "model.safetensors").write_bytes(b"weights")
    return str(path)


def make(disk: Path, model_dir: str, num_tokens: int = 512, **kwargs: object) -> Scheduler:
    args = ServerArgs(kv_cache_dir=str(disk), kv_cache_disk_block_size=BLOCK,
                      **kwargs)  # type: ignore[arg-type]
    return Scheduler(args, PoolRunner(num_tokens, model_dir), FakeTokenizer())  # type: ignore[arg-type]


def submit(s: Scheduler, rid: str, prompt: list[int], n: int = 6) -> None:
    sp = SamplingParams(max_new_tokens=n, temperature=0.0)
    s.add_request(TokenizedGenerateReq(rid=rid, input_ids=prompt, sampling_params=sp))


def run(s: Scheduler) -> dict[str, tuple[list[int], int, int]]:
    """Run to completion: rid -> (output ids, cached tokens, of which from disk)."""
    out: dict[str, tuple[list[int], int, int]] = {}
    acc: dict[str, list[int]] = {}
    deadline = time.monotonic() + 30
    while s.has_work:
        assert time.monotonic() < deadline, "scheduler did not finish"
        if not s.can_step_now:
            time.sleep(0.001)  # only loads from disk in flight
        for o in s.step():
            acc.setdefault(o.rid, []).extend(o.new_token_ids)
            if o.finished_reason is not None:
                out[o.rid] = (acc.pop(o.rid), o.cached_tokens, o.cached_tokens_disk)
        s.check_integrity()
    return out


def drain(s: Scheduler) -> None:
    assert s.kv.disk is not None
    assert s.kv.disk.tier.store.wait_idle(10)
    s.check_integrity()


def expected(prompt: list[int], n: int = 6) -> list[int]:
    seq = list(prompt)
    for _ in range(n):
        seq.append(next_token(seq))
    return seq[len(prompt):]


def prompt(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 104729) % (VOCAB - 1) + 1 for i in range(n)]


def test_eviction_spills_and_a_later_request_loads_it_back(tmp_path: Path, model_dir: str
                                                           ) -> None:
    """A small pool: a prefix evicted by other requests comes back from disk, and the
    output is what recomputing gives."""
    s = make(tmp_path / "kv", model_dir, num_tokens=96,
             kv_cache_disk_write_policy="write_back")
    a = prompt(1, 61)
    submit(s, "a", a)
    assert run(s)["a"][0] == expected(a)
    drain(s)
    assert s.kv.disk is not None and s.kv.disk.tier.store.stats()["kv_disk_blocks"] == 0
    for i in range(3):  # push a's prefix out of the 96-slot pool
        b = prompt(10 + i, 70)
        submit(s, "b", b)
        assert run(s)["b"][0] == expected(b)
    drain(s)
    assert s.kv.cache.match_prefix(a).kv_indices.numel() == 0, "a should be evicted"
    stats = s.kv.stats()
    assert stats["kv_disk_blocks"] > 0 and stats["kv_disk_written_blocks_total"] > 0
    before = s.runner.num_forward_tokens
    submit(s, "a2", a + [5, 6, 7])
    ids, cached, disk = run(s)["a2"]
    assert ids == expected(a + [5, 6, 7])
    assert disk == cached == 56  # 7 blocks of 8 (the 61 prompt tokens' full blocks)
    assert s.runner.num_forward_tokens - before == len(a) + 3 - 56 + 5
    assert s.kv.stats()["kv_disk_read_blocks_total"] == 7


def test_restart_finds_its_prefixes_on_the_first_request(tmp_path: Path, model_dir: str
                                                         ) -> None:
    s = make(tmp_path / "kv", model_dir)  # write-through: no eviction needed
    a = prompt(3, 45)
    submit(s, "a", a)
    assert run(s)["a"][0] == expected(a)
    s.close()
    s2 = make(tmp_path / "kv", model_dir)
    submit(s2, "again", a)
    ids, cached, disk = run(s2)["again"]
    assert ids == expected(a)
    assert cached == disk == 40  # max_prefix_len 44: the 5 full blocks
    s2.close()


def test_another_model_never_sees_the_blocks(tmp_path: Path, model_dir: str) -> None:
    s = make(tmp_path / "kv", model_dir)
    a = prompt(4, 40)
    submit(s, "a", a)
    run(s)
    s.close()
    with open(os.path.join(model_dir, "model.safetensors"), "ab") as f:
        f.write(b"new weights")  # other weights: another namespace
    s2 = make(tmp_path / "kv", model_dir)
    submit(s2, "a", a)
    assert run(s2)["a"][1:] == (0, 0)
    s2.close()


def test_a_damaged_block_is_skipped_with_a_warning(tmp_path: Path, model_dir: str,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    s = make(tmp_path / "kv", model_dir)
    a = prompt(5, 41)
    submit(s, "a", a)
    run(s)
    s.close()
    s2 = make(tmp_path / "kv", model_dir)
    assert s2.kv.disk is not None
    keys = s2.kv.disk.tier.hasher.keys(a)
    path = s2.kv.disk.tier.store.path(s2.kv.disk.tier.namespace, keys[2])
    data = bytearray(Path(path).read_bytes())
    data[-20] ^= 0x01  # one flipped bit in the payload (the digest is the last 16 bytes)
    Path(path).write_bytes(data)
    with caplog.at_level(logging.WARNING):
        submit(s2, "a", a)
        ids, cached, disk = run(s2)["a"]
    assert ids == expected(a)
    assert cached == disk == 2 * BLOCK  # blocks 0 and 1; block 2 is damaged: stop there
    assert "damaged block file" in caplog.text and "checksum" in caplog.text
    assert s2.kv.stats()["kv_disk_damaged_blocks_total"] == 1
    s2.close()  # the recomputed blocks were written again: a restart gets them all
    s3 = make(tmp_path / "kv", model_dir)
    submit(s3, "b", a)
    assert run(s3)["b"] == (expected(a), 5 * BLOCK, 5 * BLOCK)
    s3.close()


def test_a_partial_file_is_never_served(tmp_path: Path, model_dir: str,
                                        caplog: pytest.LogCaptureFixture) -> None:
    s = make(tmp_path / "kv", model_dir)
    a = prompt(6, 33)
    submit(s, "a", a)
    run(s)
    s.close()
    files = sorted(tmp_path.rglob("*" + SUFFIX))
    assert len(files) == 4
    for f in files:  # every file cut short, as a crash mid-write without rename would
        f.write_bytes(f.read_bytes()[:-10])
    s2 = make(tmp_path / "kv", model_dir)
    with caplog.at_level(logging.WARNING):
        submit(s2, "a", a)
        ids, cached, disk = run(s2)["a"]
    assert ids == expected(a) and cached == disk == 0
    assert "cut short" in caplog.text
    s2.close()


def test_flush_cache_empties_both_tiers(tmp_path: Path, model_dir: str) -> None:
    from radixlm.scheduler import control

    s = make(tmp_path / "kv", model_dir)
    a = prompt(7, 40)
    submit(s, "a", a)
    run(s)
    drain(s)
    assert control.flush_cache(s).success
    assert s.kv.cache.total_size() == 0
    assert s.kv.stats()["kv_disk_blocks"] == 0
    assert not list(tmp_path.rglob("*" + SUFFIX))
    submit(s, "a", a)
    assert run(s)["a"][1:] == (0, 0)
    s.close()


def test_many_requests_sharing_a_disk_prefix(tmp_path: Path, model_dir: str) -> None:
    """Requests that arrive together with the same stored prefix: each output is right,
    and the pool keeps one copy of the prefix."""
    s = make(tmp_path / "kv", model_dir)
    base = prompt(8, 48)
    submit(s, "seed", base)
    run(s)
    s.close()
    s2 = make(tmp_path / "kv", model_dir, num_tokens=256)
    prompts = {f"r{i}": base + prompt(20 + i, 5 + i) for i in range(5)}
    for rid, p in prompts.items():
        submit(s2, rid, p)
    results = run(s2)
    for rid, p in prompts.items():
        assert results[rid][0] == expected(p)
    assert sum(r[2] for r in results.values()) == 48  # installed once, then pool hits
    stats = s2.kv.stats()
    assert stats["kv_disk_loads_total"] == 1 and stats["kv_disk_read_blocks_total"] == 6
    s2.close()


def test_loads_stay_within_their_byte_bound(tmp_path: Path, model_dir: str) -> None:
    """Two prefixes on disk, room for one load at a time: the second waits, then loads."""
    s = make(tmp_path / "kv", model_dir)
    a, b = prompt(30, 40), prompt(31, 40)
    submit(s, "a", a)
    submit(s, "b", b)
    run(s)
    s.close()
    s2 = make(tmp_path / "kv", model_dir)
    assert s2.kv.disk is not None
    s2.kv.disk.max_load_bytes = 1
    submit(s2, "a", a)
    submit(s2, "b", b)
    s2.step()  # a starts its load; b waits for room
    assert [s2.kv.is_loading(r) for r in s2.waiting] == [True, True]
    assert len(s2.kv.disk._loads) == 1
    results = run(s2)
    assert results["a"] == (expected(a), 32, 32) and results["b"] == (expected(b), 32, 32)
    s2.close()


def test_an_aborted_request_leaves_its_load_behind(tmp_path: Path, model_dir: str) -> None:
    from radixlm.messages.io_struct import AbortReq

    s = make(tmp_path / "kv", model_dir)
    a = prompt(32, 60)
    submit(s, "a", a)
    run(s)
    s.close()
    s2 = make(tmp_path / "kv", model_dir)
    submit(s2, "a", a)
    s2.step()
    assert s2.kv.is_loading(s2.waiting[0])
    future = s2.waiting[0].disk_load.future
    s2.abort(AbortReq(rid="a"))
    assert run(s2)["a"][0] == []
    future.result(timeout=10)  # the read finishes; then nothing holds the load's rows
    gc.collect()
    assert s2.kv.disk is not None and not s2.kv.disk._loads
    submit(s2, "a", a)  # loads again, completes normally
    assert run(s2)["a"] == (expected(a), 56, 56)
    s2.close()


def test_a_load_waits_for_room_without_churning(tmp_path: Path, model_dir: str) -> None:
    """A running request holds most of a small pool: the loaded prefix is installed once
    the rest of the prompt fits (not installed, evicted and installed again every step)."""
    s = make(tmp_path / "kv", model_dir)
    a = prompt(33, 70)
    submit(s, "a", a)
    run(s)
    s.close()
    s2 = make(tmp_path / "kv", model_dir, num_tokens=120, schedule_conservativeness=0.0)
    long = prompt(34, 50)
    submit(s2, "long", long, n=40)
    for _ in range(3):
        s2.step()  # long is decoding, holding ~55 slots
    submit(s2, "a", a)
    results = run(s2)
    assert results["long"][0] == expected(long, 40)
    assert results["a"] == (expected(a), 64, 64)
    stats = s2.kv.stats()
    assert stats["kv_disk_installed_tokens_total"] == 64 and stats["kv_disk_loads_total"] == 1
    s2.close()


def test_new_weights_key_new_blocks(tmp_path: Path, model_dir: str) -> None:
    """/update_weights_from_disk: the old weights' blocks are never served for the new."""
    from radixlm.messages.io_struct import UpdateWeightsFromDiskReq
    from radixlm.scheduler import control

    other = tmp_path / "other"
    other.mkdir()
    (other / "model.safetensors").write_bytes(b"other weights")
    s = make(tmp_path / "kv", model_dir)
    a = prompt(40, 40)
    submit(s, "a", a)
    run(s)
    drain(s)
    assert control.update_weights_from_disk(s, UpdateWeightsFromDiskReq(str(other))).success
    submit(s, "a", a)
    assert run(s)["a"][1:] == (0, 0)
    s.close()


def test_data_parallel_replicas_get_their_own_folder(tmp_path: Path) -> None:
    from radixlm.scheduler.process import _replica_disk_tier

    args = ServerArgs(kv_cache_dir=str(tmp_path), kv_cache_disk_bytes=1000, dp_size=2)
    replica = _replica_disk_tier(args, 1)
    assert replica.kv_cache_dir == str(tmp_path / "dp1")
    assert replica.kv_cache_disk_bytes == 500


def test_disk_tier_refuses_bad_flags(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="radix cache"):
        ServerArgs(kv_cache_dir=str(tmp_path), disable_radix_cache=True)
    with pytest.raises(ValueError, match="tp-size"):
        ServerArgs(kv_cache_dir=str(tmp_path), tp_size=2)
    with pytest.raises(ValueError, match="disk-bytes"):
        ServerArgs(kv_cache_disk_bytes=0)
    with pytest.raises(ValueError, match="block-size"):
        ServerArgs(kv_cache_disk_block_size=0)


def test_an_unusable_folder_is_a_clear_error(tmp_path: Path, model_dir: str) -> None:
    (tmp_path / "file").write_text("not a folder")
    with pytest.raises(ValueError, match="--kv-cache-dir .* cannot be used"):
        make(tmp_path / "file", model_dir)
