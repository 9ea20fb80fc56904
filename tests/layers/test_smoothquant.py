"""SmoothQuant's folds leave a float model's logits unchanged; its scales help int8."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))

from _forward_harness import PoolRunner, build_hf_model  # noqa: E402

from radixlm.layers.cpu_gemm import Int8Weight, int8_linear  # noqa: E402
from radixlm.layers.smoothquant import (  # noqa: E402
    apply_smoothing,
    lm_head_of,
    smooth_targets,
    smoothing_scales,
)
from radixlm.model_executor.calibration import input_absmax  # noqa: E402
from radixlm.model_loader.loader import load_model  # noqa: E402

IDS = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(0)).tolist()


def _logits(model: torch.nn.Module, config: object) -> torch.Tensor:
    runner = PoolRunner(model, config, num_slots=64, max_requests=1, max_context=64)
    return runner.step([(runner.new_request(), IDS)])[0]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> str:
    # Biases on the MLP: the up_proj fold must divide the up bias as well.
    hf: Any = build_hf_model("llama", tie_word_embeddings=True, mlp_bias=True, attention_bias=True)
    with torch.no_grad():  # a massive-activation channel, as real checkpoints have
        for layer in hf.model.layers:
            layer.post_attention_layernorm.weight[3] = 40.0
    path = str(tmp_path_factory.mktemp("smooth"))
    hf.save_pretrained(path)
    return path


def _smoothed(path: str, alpha: float) -> tuple[Any, Any]:
    model, config = load_model(path, torch.float32, "cpu")
    targets = smooth_targets(model)
    head = lm_head_of(model)
    assert head is not None and len(targets) == 3 * config.num_hidden_layers
    modules = {t.name: t.linear for t in targets} | {"lm_head": head}
    absmax = input_absmax(model, config, IDS, modules)
    apply_smoothing(targets, absmax, alpha)
    head.int8_smoothing = smoothing_scales(absmax["lm_head"], head.weight, alpha)
    return model, config


def test_folds_are_exact_in_float(model_path: str) -> None:
    model, config = load_model(model_path, torch.float32, "cpu")
    expected = _logits(model, config)
    smoothed, config = _smoothed(model_path, alpha=0.5)
    torch.testing.assert_close(_logits(smoothed, config), expected, atol=1e-4, rtol=1e-4)


def test_smoothing_reduces_int8_error_on_outlier_channels() -> None:
    """Inputs whose channels 3 and 17 run 50x the rest (as SmolLM2's do): W8A8 with the
    scales moved into the weight is several times closer to the float result."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(32, 128, generator=g)  # [M, K]
    x[:, [3, 17]] *= 50.0
    weight = torch.randn(96, 128, generator=g) * 0.05  # [N, K]
    expected = x @ weight.t()
    plain = int8_linear(x, Int8Weight.quantize(weight), None)
    s = smoothing_scales(x.abs().amax(0), weight, alpha=0.5)  # [K]
    smoothed = int8_linear(x / s, Int8Weight.quantize(weight * s), None)
    via_input_scales = int8_linear(x, Int8Weight.quantize(weight, smooth=s), None)
    torch.testing.assert_close(via_input_scales, smoothed, atol=1e-4, rtol=1e-4)
    assert (smoothed - expected).norm() < 0.5 * (plain - expected).norm()
