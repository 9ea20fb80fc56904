"""Accuracy gate for reduced precision: the default model against its own float32 run.

Teacher-forced over a fixed text (tests/models/data/gate_text.txt, 813
tokens), in chunks of 256 through a real KV pool (so chunks after the first
attend over a cached prefix): at every position the reduced-precision model's
top-1 next token must equal float32's at >= 95% of positions, and the mean
KL(fp32 || reduced) of the next-token distributions must stay under KL_BOUND
(bfloat16's measured figure with room for other CPUs' kernels). Measured on
the AVX-512 machine (torch 2.13):

| precision                                   | top-1 agreement | mean KL (nats) |
|---------------------------------------------|-----------------|----------------|
| bfloat16 (oneDNN-packed)                    | 98.2%           | 0.0008         |
| w8a8_int8, SmoothQuant alpha 0.5 (as served)| 93.8%           | 0.0122         |
| w8a8_int8 without smoothing                 | 88.7%           | 0.031          |

int8 does not pass: per-token int8 activations cost the most (int8 weights
alone, float activations: 97.7% / 0.0025), spread over every projection kind
and layer (see radixlm/layers/smoothquant.py), so it is only guarded here
against getting worse.

Each precision the machine supports runs: bfloat16 only where the CPU computes it
natively, int8 everywhere (torch._int_mm).
"""

from __future__ import annotations

import os

import pytest
import torch
from _forward_harness import PoolRunner
from _kernels import requires_bf16w

from radixlm.layers.cpu_gemm import bf16w_supported, cpu_has_native_bf16
from radixlm.layers.cpu_kernels import load_cpu_kernels
from radixlm.layers.prepared_weight import prepare_model
from radixlm.model_executor.calibration import smooth_for_int8
from radixlm.model_loader.loader import load_model
from radixlm.model_loader.model_path import resolve_model_dir

TEXT = os.path.join(os.path.dirname(__file__), "data", "gate_text.txt")
CHUNK = 256
MIN_AGREEMENT = 0.95
KL_BOUND = 0.003  # bfloat16 measured 0.0008
# W8A8 int8 (with SmoothQuant) is outside the gate; these bounds guard its measured
# 93.8% / 0.0122 (without smoothing it was 88.7% / 0.031).
INT8_MIN_AGREEMENT, INT8_KL_BOUND = 0.92, 0.02
# (top-1 agreement, KL bound) per block format, the measured figures with some room
# (docs/quantization.md). Their int8 activations (as llama.cpp's) cost about what bf16
# does, so gguf and q8_0 stay near the bf16 gate; Q4_0, symmetric, quantizing the
# default model's asymmetric Q4_1 values again, fails it (72.8%, KL 0.24) and is only
# guarded against getting worse, like int8.
BLOCK_FORMAT_BOUNDS = {"gguf": (0.96, 0.004),  # measured 97.2%, 0.0024
                       "q8_0": (0.95, 0.005),  # 96.4%, 0.0034
                       "q4_k": (0.94, 0.011),  # 95.7%, 0.0077
                       "q4_0": (0.70, 0.30)}  # 72.8%, 0.243


def text_ids(model_dir: str, text: str = TEXT, min_tokens: int = 512) -> list[int]:
    """The tokens of `text` (a file) by the model's tokenizer, at least `min_tokens`."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    with open(text) as f:
        ids = tokenizer.encode(f.read()).ids
    assert len(ids) >= min_tokens
    return ids


def teacher_forced_logits(
    model_dir: str, ids: list[int], dtype: torch.dtype, quantization: str, backend: str
) -> torch.Tensor:
    """Logits [len(ids), vocab] float32 of the model in this precision, chunk by chunk."""
    model, config = load_model(model_dir, dtype, "cpu", keep_quantized=quantization == "gguf")
    if quantization == "w8a8_int8":
        smooth_for_int8(model, config, model_dir)  # as the model runner does at load
    prepare_model(model, quantization)
    runner = PoolRunner(model, config, num_slots=len(ids) + 8, max_requests=1,
                        max_context=len(ids) + 8, dtype=dtype, backend=backend)
    row = runner.new_request()
    parts = [runner.step([(row, ids[i : i + CHUNK])])[0] for i in range(0, len(ids), CHUNK)]
    return torch.cat(parts).float()


def agreement_and_kl(reference: torch.Tensor, other: torch.Tensor) -> tuple[float, float]:
    """(share of positions with the same argmax, mean KL(reference || other) in nats)."""
    top1 = (reference.argmax(-1) == other.argmax(-1)).float().mean().item()
    log_p = torch.log_softmax(reference, dim=-1)
    log_q = torch.log_softmax(other, dim=-1)
    kl = (log_p.exp() * (log_p - log_q)).sum(-1).mean().item()
    return top1, kl


@pytest.fixture(scope="module")
def model_dir() -> str:
    return resolve_model_dir(None)


@pytest.fixture(scope="module")
def fp32_logits(model_dir: str) -> torch.Tensor:
    return teacher_forced_logits(model_dir, text_ids(model_dir), torch.float32, "none",
                                 "torch_native")


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="the CPU has no native bfloat16")
def test_bfloat16_passes_gate(model_dir: str, fp32_logits: torch.Tensor) -> None:
    ids = text_ids(model_dir)
    logits = teacher_forced_logits(model_dir, ids, torch.bfloat16, "none", "cpu_paged")
    top1, kl = agreement_and_kl(fp32_logits, logits)
    print(f"\nbfloat16: top-1 agreement {top1:.4f}, mean KL {kl:.5f} over {len(ids)} tokens")
    assert top1 >= MIN_AGREEMENT and kl < KL_BOUND, (top1, kl)


@requires_bf16w()
def test_bf16_weights_pass_gate(model_dir: str, fp32_logits: torch.Tensor) -> None:
    """float32 arithmetic over weights rounded to bfloat16 (--quantization bf16_weights):
    what "auto" runs on CPUs without native bfloat16."""
    ids = text_ids(model_dir)
    logits = teacher_forced_logits(model_dir, ids, torch.float32, "bf16_weights", "cpu_paged")
    top1, kl = agreement_and_kl(fp32_logits, logits)
    print(f"\nbf16_weights: top-1 agreement {top1:.4f}, mean KL {kl:.5f} over {len(ids)} tokens")
    assert top1 >= MIN_AGREEMENT and kl < KL_BOUND, (top1, kl)


def test_int8_accuracy_stays_as_measured(model_dir: str, fp32_logits: torch.Tensor) -> None:
    ids = text_ids(model_dir)
    logits = teacher_forced_logits(model_dir, ids, torch.float32, "w8a8_int8", "torch_native")
    top1, kl = agreement_and_kl(fp32_logits, logits)
    print(f"\nw8a8_int8: top-1 agreement {top1:.4f}, mean KL {kl:.5f} over {len(ids)} tokens")
    assert top1 >= INT8_MIN_AGREEMENT and kl < INT8_KL_BOUND, (top1, kl)


@pytest.mark.skipif(load_cpu_kernels() is None, reason="the quantized kernels are not built")
@pytest.mark.parametrize("quantization", ["gguf", "q8_0", "q4_0", "q4_k"])
def test_block_formats_pass_gate(model_dir: str, fp32_logits: torch.Tensor,
                                 quantization: str) -> None:
    """The GGUF block-format kernels (layers/quant): "gguf" runs the default model's own
    Q4_1 file as it is (against float32 over the same values, so only the int8
    activations differ); q8_0 | q4_0 | q4_k quantize those float32 values again at load."""
    ids = text_ids(model_dir)
    logits = teacher_forced_logits(model_dir, ids, torch.float32, quantization, "cpu_paged")
    top1, kl = agreement_and_kl(fp32_logits, logits)
    print(f"\n{quantization}: top-1 agreement {top1:.4f}, mean KL {kl:.5f} over {len(ids)} tokens")
    min_top1, kl_bound = BLOCK_FORMAT_BOUNDS[quantization]
    assert top1 >= min_top1 and kl < kl_bound, (top1, kl)


def test_auto_precision_follows_the_gate() -> None:
    """"auto" picks only what passes the gate: bfloat16 on native-bf16 CPUs, else float32
    over bfloat16 weights (plain float32 where the kernels are not built)."""
    from radixlm.model_executor.precision import resolve_precision

    env = os.environ.pop("RADIXLM_AUTO_PRECISION", None)
    try:
        precision = resolve_precision("auto", "auto", "cpu")
    finally:
        if env is not None:
            os.environ["RADIXLM_AUTO_PRECISION"] = env
    if cpu_has_native_bf16():
        assert precision == (torch.bfloat16, "none", precision.reason)
    else:
        expected = "bf16_weights" if bf16w_supported() else "none"
        assert precision == (torch.float32, expected, precision.reason)


def test_gate_detects_a_broken_model(model_dir: str, fp32_logits: torch.Tensor) -> None:
    """The gate can fail: float32 with every down_proj weight 25% too large does not pass."""
    ids = text_ids(model_dir)
    model, config = load_model(model_dir, torch.float32, "cpu")
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(1.25)
    runner = PoolRunner(model, config, num_slots=len(ids) + 8, max_requests=1,
                        max_context=len(ids) + 8)
    row = runner.new_request()
    logits = torch.cat([runner.step([(row, ids[i : i + CHUNK])])[0]
                        for i in range(0, len(ids), CHUNK)])
    top1, kl = agreement_and_kl(fp32_logits, logits)
    assert top1 < MIN_AGREEMENT or kl >= KL_BOUND
