"""Which precision a run uses, decided from the flags and what the device has.

`--dtype auto` with `--quantization auto` (the defaults) pick, on the CPU:

- bfloat16 weights, activations and KV cache, oneDNN-packed, where the CPU
  computes bfloat16 natively (avx512_bf16 or AMX);
- elsewhere (there bfloat16 matmuls run at a small fraction of float32's
  speed) float32 activations, arithmetic and KV cache over linear weights
  rounded to bfloat16 (`bf16_weights`, csrc/bf16w_gemm.cpp) where the kernels
  are built for the CPU (AVX2 and FMA): half the weight bytes, so a decode
  step of a few rows runs its linear layers 2-3x faster than oneDNN's float32;
  on the default model 99.75% top-1 agreement with float32, mean KL 0.00004
  (tests/models/test_accuracy_gate.py asks >= 95% and < 0.003); plain float32
  where the kernels are not built. W8A8 int8 fails that gate even with
  SmoothQuant (93.8% top-1, mean KL 0.012), so it runs only when asked for
  (`--quantization w8a8_int8`);

and for a GGUF file on the CPU, its block formats as they are (`gguf`: the
quantized kernels of layers/quant over float32 activations; docs/quantization.md);
bfloat16 on CUDA (a GGUF file dequantized to bfloat16 at load). `q8_0`, `q4_0`
and `q4_k` quantize a float checkpoint at load into those GGUF formats. An
explicit `--dtype` or `--quantization` wins; `--dtype float32 --quantization
none` is the exact mode the equality tests use (a GGUF file then runs
dequantized to float32).

The environment variable `RADIXLM_AUTO_PRECISION=float32` makes "auto" mean
float32 without quantization (the test suite sets it, so tests that predate
reduced precision keep their exact references).
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from radixlm.layers.cpu_gemm import bf16w_supported, cpu_has_native_bf16

_AUTO_ENV = "RADIXLM_AUTO_PRECISION"


class Precision(NamedTuple):
    dtype: torch.dtype  # weights (unless quantized), activations, KV cache
    quantization: str  # "none" | "w8a8_int8" | "bf16_weights" | "gguf" | "q8_0" | "q4_0" | "q4_k"
    reason: str  # why, for the start-up log

    def describe(self) -> str:
        name = str(self.dtype).removeprefix("torch.")
        if self.quantization == "w8a8_int8":
            what = f"int8 linear layers (W8A8, per-channel weights, per-token activations), {name} activations"
        elif self.quantization == "bf16_weights":
            what = f"bfloat16 linear weights, {name} activations and arithmetic"
        elif self.quantization == "gguf":
            what = f"the GGUF file's block formats as stored (int8 dot products), {name} activations"
        elif self.quantization in _BLOCK_FORMATS:
            what = (f"linear weights quantized at load to {self.quantization.upper()} "
                    f"(int8 dot products), {name} activations")
        else:
            what = f"{name} weights and activations"
        return f"{what}: {self.reason}"


_BLOCK_FORMATS = ("q8_0", "q4_0", "q4_k")


def resolve_precision(dtype: str, quantization: str, device: str,
                      gguf: bool = False) -> Precision:
    """The precision for `--dtype` / `--quantization` values ("auto" allowed) on `device`;
    gguf: the model is a GGUF file with block-quantized tensors."""
    _check_block_modes(quantization, device, gguf)
    auto_dtype, auto_quant, reason = _auto(device, gguf)
    if dtype != "auto":
        reason = f"--dtype {dtype}"
    if quantization != "auto":
        reason += f", --quantization {quantization}"
        auto_quant = quantization
    elif dtype != "auto":
        auto_quant = "none"  # an explicit dtype alone means no quantization
    chosen = getattr(torch, dtype) if dtype != "auto" else auto_dtype
    if dtype == "auto" and (quantization == "gguf" or quantization in _BLOCK_FORMATS):
        chosen = torch.float32  # the quantized kernels' activations (see _auto)
    if quantization == "bf16_weights" and device != "cpu":
        raise ValueError("--quantization bf16_weights is for the CPU (its kernel is "
                         "csrc/bf16w_gemm.cpp); on CUDA use --dtype bfloat16")
    if auto_quant == "bf16_weights" and chosen != torch.float32:
        if quantization == "bf16_weights":
            raise ValueError("--quantization bf16_weights runs float32 activations over "
                             f"bfloat16 weights: it needs --dtype float32, not {dtype}")
        auto_quant = "none"  # an explicit --dtype bfloat16 with auto quantization
    return Precision(chosen, auto_quant, reason)


def _check_block_modes(quantization: str, device: str, gguf: bool) -> None:
    if quantization == "gguf" and not gguf:
        raise ValueError("--quantization gguf runs a GGUF file's block formats: the model is "
                         "not a block-quantized GGUF file")
    if (quantization == "gguf" or quantization in _BLOCK_FORMATS) and device != "cpu":
        raise ValueError(f"--quantization {quantization} runs on the CPU's integer dot products; "
                         "on CUDA a GGUF file is dequantized to bfloat16 (--quantization auto)")
    if quantization in _BLOCK_FORMATS and not bf16w_supported():
        raise ValueError(f"--quantization {quantization} needs the CPU kernels (csrc/quant), "
                         "which are not built here")


def _auto(device: str, gguf: bool = False) -> tuple[torch.dtype, str, str]:
    forced = os.environ.get(_AUTO_ENV, "")
    if forced == "float32":
        return torch.float32, "none", f"{_AUTO_ENV}=float32"
    if forced:
        raise ValueError(f"{_AUTO_ENV} must be 'float32' or unset, not {forced!r}")
    if device == "cuda":
        return torch.bfloat16, "none", "--dtype auto on CUDA"
    if gguf and bf16w_supported():
        # NOTE: float32 activations: the kernels quantize them to int8 per block anyway,
        # and the residual stream keeps llama.cpp's precision (its agreement with
        # llama.cpp: docs/quantization.md).
        return (torch.float32, "gguf",
                "a GGUF file on the CPU: its block formats as stored, float32 activations")
    if cpu_has_native_bf16():
        return torch.bfloat16, "none", "--dtype auto, and the CPU computes bfloat16 natively"
    if device == "cpu" and bf16w_supported():
        return (
            torch.float32,
            "bf16_weights",
            "--dtype auto, and the CPU has no native bfloat16: float32 arithmetic over "
            "bfloat16 weights (99.75% top-1 agreement with float32; int8 fails the "
            "accuracy gate: 93.8%)",
        )
    return (
        torch.float32,
        "none",
        "--dtype auto, the CPU has no native bfloat16 and the kernels for bfloat16 "
        "weights are not built",
    )
