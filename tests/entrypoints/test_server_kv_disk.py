"""The KV disk tier through the HTTP server: a prefix evicted from a small pool comes back
from disk, hits are split per tier in meta_info and /metrics, the OpenAI usage counts
them, and /flush_cache empties both tiers. (Restarts: tests/engine/test_disk_tier_engine.py.)"""

from __future__ import annotations

import random
from pathlib import Path

import httpx
from _server_process import running_server
from _tiny_checkpoints import build_qwen2

BLOCK = 16


def ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(1, 250) for _ in range(n)]


def test_an_evicted_prefix_comes_back_and_flush_cache_empties_both_tiers(tmp_path: Path
                                                                         ) -> None:
    model = build_qwen2(tmp_path / "tiny", max_position_embeddings=1024)
    a, b = [1] + ids(0, 199), [2] + ids(1, 199)
    greedy = {"temperature": 0, "max_new_tokens": 4}
    with running_server(tmp_path / "server.log", "--model-path", str(model),
                        "--max-total-tokens", "300", "--kv-cache-dir", str(tmp_path / "kv"),
                        "--kv-cache-disk-block-size", str(BLOCK), "--enable-metrics") as srv:
        def generate(prompt: list[int]) -> dict:
            r = httpx.post(srv.url + "/generate", timeout=60,
                           json={"input_ids": prompt, "sampling_params": greedy})
            assert r.status_code == 200, r.text
            return r.json()

        first = generate(a)
        assert first["meta_info"]["cached_tokens_disk"] == 0
        generate(b)  # a and b do not fit together: a leaves the pool
        out = generate(a)
        hit = (len(a) - 1) // BLOCK * BLOCK
        assert out["output_ids"] == first["output_ids"]
        meta = out["meta_info"]
        assert (meta["cached_tokens"], meta["cached_tokens_pool"],
                meta["cached_tokens_disk"]) == (hit, 0, hit)
        completion = httpx.post(srv.url + "/v1/completions", timeout=60, json={
            "prompt": a, "max_tokens": 2, "temperature": 0}).json()
        assert completion["usage"]["prompt_tokens_details"]["cached_tokens"] == len(a) - 1
        metrics = httpx.get(srv.url + "/metrics", timeout=10).text
        assert f'radixlm:cache_hit_tokens_total{{model_name="tiny",tier="disk"}} {hit}.0' in metrics
        assert 'radixlm:kv_disk_loaded_blocks_total{model_name="tiny"}' in metrics
        info = httpx.get(srv.url + "/get_server_info", timeout=10).json()
        assert info["kv_integrity"] == "ok" and info["kv_disk_blocks"] > 0
        assert httpx.post(srv.url + "/flush_cache", timeout=10).status_code == 200
        info = httpx.get(srv.url + "/get_server_info", timeout=10).json()
        assert info["kv_disk_blocks"] == 0 and info["num_cached_tokens"] == 0
        assert info["kv_integrity"] == "ok"
    assert not list((tmp_path / "kv").rglob("*.kvb"))
