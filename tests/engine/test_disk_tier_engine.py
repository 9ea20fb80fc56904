"""The KV disk tier end to end, on a tiny random Qwen2 served by the Engine.

A prefix computed by one Engine is read back by the next one on the same
folder (a restart), and after it was evicted from a small pool; greedy output
with a disk hit equals greedy output computed from scratch, and the hit is
reported per tier in meta_info. The KV accounting, pool and disk, is checked
after every request.
"""

from __future__ import annotations

import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from radixlm import Engine

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "entrypoints"))
from _tiny_checkpoints import build_qwen2  # noqa: E402

BLOCK = 16
GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(build_qwen2(tmp_path_factory.mktemp("tiny"), max_position_embeddings=2048))


def ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 250) for _ in range(n)]


def engine(model_dir: str, disk: Path | None, **kwargs: Any) -> Engine:
    extra = {} if disk is None else {"kv_cache_dir": str(disk),
                                     "kv_cache_disk_block_size": BLOCK}
    return Engine(model_path=model_dir, max_total_tokens=kwargs.pop("max_total_tokens", 4096),
                  **extra, **kwargs)


def generate(eng: Engine, input_ids: list[int]) -> dict[str, Any]:
    out = eng.generate(input_ids=input_ids, sampling_params=GREEDY)
    info = eng.get_server_info()
    assert info["kv_integrity"] == "ok"
    assert info["num_used_tokens"] == 0
    return out


def wait_written(eng: Engine) -> dict[str, Any]:
    deadline = time.monotonic() + 20
    while True:
        info = eng.get_server_info()
        if info["kv_disk_pending_blocks"] == 0:
            return info
        assert time.monotonic() < deadline, "the disk tier did not finish writing"
        time.sleep(0.02)


def full_blocks(prompt: list[int]) -> int:
    return (len(prompt) - 1) // BLOCK * BLOCK  # the last prompt token is always computed


def test_restart_and_eviction_load_the_prefix_back(model_dir: str, tmp_path: Path) -> None:
    disk = tmp_path / "kv"
    p, q = ids(1, 300), ids(2, 420)
    with engine(model_dir, disk) as first:
        out = generate(first, p)  # computed from scratch: the reference
        ref_p = out["output_ids"]
        assert out["meta_info"]["cached_tokens"] == out["meta_info"]["cached_tokens_disk"] == 0
        # no waiting for the writer: shutting down finishes the queued writes
    # A restart: the first request reads its prefix from disk.
    with engine(model_dir, disk, max_total_tokens=600) as second:
        assert second.get_server_info()["kv_disk_blocks"] >= len(p) // BLOCK
        out = generate(second, p)
        meta = out["meta_info"]
        assert out["output_ids"] == ref_p
        assert meta["cached_tokens"] == meta["cached_tokens_disk"] == full_blocks(p)
        assert meta["cached_tokens_pool"] == 0
        # q does not fit beside p in 600 slots: p leaves the pool, then comes back from disk.
        generate(second, q)
        again = generate(second, p + [7, 8])
        assert again["meta_info"]["cached_tokens_disk"] == full_blocks(p + [7, 8])
        info = wait_written(second)
        assert info["kv_disk_read_blocks_total"] >= 2 * (len(p) // BLOCK)
        assert info["num_cached_prompt_tokens_disk_total"] == (
            full_blocks(p) + full_blocks(p + [7, 8]))
        assert second.flush_cache()  # both tiers: the next request computes everything
        assert second.get_server_info()["kv_disk_blocks"] == 0
        recomputed = generate(second, p + [7, 8])
        assert recomputed["meta_info"]["cached_tokens"] == 0
        assert recomputed["output_ids"] == again["output_ids"]


def test_write_back_spills_only_what_the_pool_evicts(model_dir: str, tmp_path: Path) -> None:
    disk = tmp_path / "kv"
    p, q = ids(3, 300), ids(4, 420)
    with engine(model_dir, disk, max_total_tokens=600,
                kv_cache_disk_write_policy="write_back") as eng:
        ref_p = generate(eng, p)["output_ids"]
        assert wait_written(eng)["kv_disk_blocks"] == 0
        generate(eng, q)  # evicts p: its blocks are written now
        assert wait_written(eng)["kv_disk_blocks"] >= len(p) // BLOCK
        out = generate(eng, p)
        assert out["output_ids"] == ref_p
        meta = out["meta_info"]
        assert meta["cached_tokens"] == full_blocks(p)
        # q shares p's first token: that one stayed in the pool
        assert (meta["cached_tokens_pool"], meta["cached_tokens_disk"]) == (1, full_blocks(p) - 1)


def test_int8_pool_restarts_from_disk_and_never_shares_with_auto(model_dir: str,
                                                                 tmp_path: Path) -> None:
    """--kv-cache-dtype int8: a restart reads the int8 rows (scales included) back and
    greedy output equals the run that computed them; an auto pool on the same folder
    never reads int8 entries (the key holds the KV dtype), nor the other way round."""
    disk = tmp_path / "kv"
    p = ids(5, 300)
    with engine(model_dir, disk, kv_cache_dtype="int8") as first:
        info = first.get_server_info()
        assert info["kv_cache_dtype"] == "int8" and info["kv_tokens_vs_auto"] > 1.7
        ref = generate(first, p)["output_ids"]
    with engine(model_dir, disk) as auto:  # auto: the model's dtype
        assert auto.get_server_info()["kv_cache_dtype"] != "int8"
        out = generate(auto, p)
        assert out["meta_info"]["cached_tokens"] == 0  # int8 blocks are not its own
        wait_written(auto)
    with engine(model_dir, disk, kv_cache_dtype="int8") as second:
        out = generate(second, p)
        assert out["meta_info"]["cached_tokens_disk"] == full_blocks(p)  # its own, not auto's
        assert out["output_ids"] == ref
