"""Which precision a run uses, decided from the flags and what the device has.

`--dtype auto` with `--quantization auto` (the defaults) pick, on the CPU:

- bfloat16 weights, activations and KV cache, oneDNN-packed, where the CPU
  computes bfloat16 natively (avx512_bf16 or AMX);
- float32 elsewhere (there bfloat16 matmuls run at a small fraction of
  float32's speed). W8A8 int8 would be the faster choice there, but on the
  default model it fails the accuracy gate even with SmoothQuant (93.8% top-1
  agreement with float32, mean KL 0.012, where the gate asks >= 95% and
  < 0.003; tests/models/test_accuracy_gate.py), so it runs only when asked
  for (`--quantization w8a8_int8`);

and bfloat16 on CUDA. An explicit `--dtype` or `--quantization` wins;
`--dtype float32 --quantization none` is the exact mode the equality tests use.

The environment variable `RADIXLM_AUTO_PRECISION=float32` makes "auto" mean
float32 without quantization (the test suite sets it, so tests that predate
reduced precision keep their exact references).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from radixlm.layers.cpu_gemm import cpu_has_native_bf16

_AUTO_ENV = "RADIXLM_AUTO_PRECISION"


class Precision(NamedTuple):
    dtype: torch.dtype  # weights (unless quantized), activations, KV cache
    quantization: str  # "none" | "w8a8_int8"
    reason: str  # why, for the start-up log

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        if self.quantization == "w8a8_int8":
            what = f"int8 linear layers (W8A8, per-channel weights, per-token activations), {name} activations"
        else:
            what = f"{name} weights and activations"
        return f"{what}: {self.reason}"


def resolve_precision(dtype: str, quantization: str, device: str) -> Precision:
    """The precision for `--dtype` / `--quantization` values ("auto" allowed) on `device`."""
    auto_dtype, auto_quant, reason = _auto(device)
    if dtype != "auto":
        reason = f"--dtype {dtype}"
    if quantization != "auto":
        reason += f", --quantization {quantization}"
        auto_quant = quantization
    elif dtype != "auto":
        auto_quant = "none"  # an explicit dtype alone means no quantization
    chosen = getattr(torch, dtype) if dtype != "auto" else auto_dtype
    return Precision(chosen, auto_quant, reason)


def _auto(device: str) -> tuple[torch.dtype, str, str]:
    forced = os.environ.get(_AUTO_ENV, "")
    if forced == "float32":
        return torch.float32, "none", f"{_AUTO_ENV}=float32"
    if forced:
        raise ValueError(f"{_AUTO_ENV} must be 'float32' or unset, not {forced!r}")
    if device == "cuda":
        return torch.bfloat16, "none", "--dtype auto on CUDA"
    if cpu_has_native_bf16():
        return torch.bfloat16, "none", "--dtype auto, and the CPU computes bfloat16 natively"
    return (
        torch.float32,
        "none",
        "--dtype auto, and the CPU has no native bfloat16 (int8 fails the accuracy gate: "
        "93.8% top-1)",
    )
