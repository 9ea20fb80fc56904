"""Sliding windows inside the C++ paged kernel: Mistral (every layer windowed) and
Gemma 3 (windowed and global layers, Gemma's scale) at head dim 64, where every step,
long chunks included, runs in the kernel. Logits through the kernel equal transformers'
(float32, within 1e-4) over chunked prefill, a mixed batch and decode steps with
sequences several windows long (windows shorter and longer than a kernel block of 64
keys); the masked torch path is never taken. With an int8 pool, the kernel equals the
torch-native backend over the same stored rows (one layer).
"""

from __future__ import annotations

from typing import Any

import _scenarios as sc
import pytest
import torch
from _forward_harness import PoolRunner, build_and_load, hf_logits
from _kernels import requires_kernels

import radixlm.layers.cpu_attention as cpu_attention

pytestmark = requires_kernels()

_COMMON = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
               max_position_embeddings=512)
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "mistral_w20": ("mistral", dict(_COMMON, sliding_window=20)),
    "mistral_w90": ("mistral", dict(_COMMON, sliding_window=90)),
    "gemma3_w40": ("gemma3_text", dict(
        _COMMON, num_hidden_layers=3, sliding_window=40, query_pre_attn_scalar=48,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    model_type, overrides = MODELS[request.param]
    return build_and_load(model_type, overrides, tmp_path_factory.mktemp(request.param))


@pytest.fixture
def no_masked_path(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("a windowed layer left the kernel")

    monkeypatch.setattr(cpu_attention, "masked_attention", refuse)


def _steps(runner: PoolRunner, a: list[int], b: list[int]) -> list[torch.Tensor]:
    """Chunked prefill of a (70 + 60 rows), b fresh (100 rows) beside a's decode, then
    decodes of both: every step's logits, concatenated per request (a first)."""
    ra, rb = runner.new_request(), runner.new_request()
    out_a = runner.step([(ra, a[:70])]) + runner.step([(ra, a[70:130])])
    step = runner.step([(ra, a[130:131]), (rb, b[:100])])
    out_a.append(step[0])
    out_b = [step[1]]
    for i in range(3):
        da, db = runner.step([(ra, a[131 + i : 132 + i]), (rb, b[100 + i : 101 + i])])
        out_a.append(da)
        out_b.append(db)
    return [torch.cat(out_a), torch.cat(out_b)]


def test_window_in_kernel_equals_transformers(model, no_masked_path: None) -> None:
    hf, ours, config = model
    a, b = sc.prompt(134, seed=11), sc.prompt(103, seed=12)
    got_a, got_b = _steps(PoolRunner(ours, config, backend="cpu_paged"), a, b)
    sc.close(got_a, hf_logits(hf, a))
    sc.close(got_b, hf_logits(hf, b))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_window_in_kernel_over_int8_pool(name: str, tmp_path, no_masked_path: None) -> None:
    """int8 K/V under windows: the kernel reads the stored rows as the torch-native
    backend dequantizes them. One (windowed) layer, so that both backends store the same
    bytes: past it, last-bit differences in K can round to another int8 step."""
    model_type, overrides = MODELS[name]
    overrides = dict(overrides, num_hidden_layers=1)
    if "layer_types" in overrides:
        overrides["layer_types"] = ["sliding_attention"]
    _, ours, config = build_and_load(model_type, overrides, tmp_path)
    a, b = sc.prompt(134, seed=13), sc.prompt(103, seed=14)
    got = _steps(PoolRunner(ours, config, backend="cpu_paged", kv_cache_dtype="int8"), a, b)
    ref = _steps(PoolRunner(ours, config, backend="torch_native", kv_cache_dtype="int8"), a, b)
    for g, r in zip(got, ref):
        sc.close(g, r)
