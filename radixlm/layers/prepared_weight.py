"""One owner of "which format, which kernel" for a linear weight: `PreparedWeight`.

After loading, every linear layer and the LM head hold their weight as a
`PreparedWeight`: the tensors in the layout one kernel wants, and `apply(x, bias)`
that runs that kernel. Linear layers (linear.py), the LM head
(vocab_embedding.py) and the C++ layer stack (models/layer_stack.py, through
`cpp_kind` / `cpp_tensor` and csrc/prepared_linear.cpp) all go through it, so a
new format is one class here (and one case in csrc/prepared_linear.cpp).

Formats (see cpu_gemm.py for the kernels and their measurements):

- `DenseWeight`: the weight as loaded, `F.linear` (CUDA, or what no kernel takes).
- `PairsWeight`: bf16 weights packed in pairs (csrc/bf16_gemm.cpp: bf16 arithmetic
  for bf16 activations; csrc/bf16w_gemm.cpp: float32 arithmetic for float32 ones).
- `OneDnnWeight`: oneDNN-packed float32/bfloat16, with the plain copy that the
  small-batch kernel streams for 1-2 rows where kept.
- `Int8PreparedWeight`: W8A8 (per-channel int8 weights, per-token activations).
- `QuantWeight`: GGUF block formats (Q4_0 .. Q8_0, Q2_K .. Q6_K), repacked once for
  csrc/quant's int8 dot-product kernels; the same packed table serves a tied
  embedding lookup (`embed`) and the LM head. The checkpoint side, a tensor still in
  its block format, is layers/quant/quant_tensor.py.

`prepare_weight` picks one for a float weight and a `--quantization` mode;
`prepare_model` prepares every layer of a loaded model.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.layers.cpu_gemm import (
    MAX_PLAIN_COPY_BYTES,
    Int8Weight,
    bf16w_capable,
    can_pack,
    int8_linear,
    pack_pairs,
    pack_weight,
    packed_linear,
    pairs_capable,
    pairs_linear,
    small_batch_linear,
    wants_plain_copy,
)
from radixlm.layers.cpu_kernels import load_cpu_kernels
from radixlm.layers.quant.quant_tensor import QUANT_TYPES, QuantTensor, type_name

logger = logging.getLogger(__name__)

# How csrc/prepared_linear.cpp runs a weight (PreparedWeight.cpp_kind).
CPP_PAIRS, CPP_ONEDNN, CPP_QUANT = 0, 1, 2

# "gguf": a GGUF file's block formats as they are (layers loaded them quantized; its
# float tensors are prepared as for "none"); "q8_0" | "q4_0" | "q4_k": float weights
# quantized at load into those formats (the LM head into Q8_0, as llama.cpp keeps it
# at 6-8 bits).
QUANTIZATIONS = ("none", "w8a8_int8", "bf16_weights", "gguf", "q8_0", "q4_0", "q4_k")
BLOCK_QUANTIZATIONS = {"q8_0": 8, "q4_0": 2, "q4_k": 12}  # → GGML type
# Modes whose float32 norms, rotary and SiLU take the fused kernels (not the exact mode).
FUSED_FLOAT32_MODES = ("bf16_weights", "gguf", *BLOCK_QUANTIZATIONS)


class PreparedWeight(ABC):
    """A weight [out_features, in_features] in its kernel's layout.

    `format` and `kernel` name the layout and the kernel (the start-up log prints
    them); `cpp_kind` is how the C++ layer stack runs it (None: it cannot, the
    Python loop runs the layer) with `cpp_tensor` as its weight argument.
    """

    format: str
    kernel: str
    category: str  # what prepare_model counts: "dense" | "packed" | "int8" | "quantized"
    cpp_kind: int | None = None  # (a class attribute some instances override)

    def __init__(self, out_features: int, in_features: int) -> None:
        self.out_features, self.in_features = out_features, in_features

    @abstractmethod
    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x [..., in_features] → x W^T + bias [..., out_features]."""

    @property
    def cpp_tensor(self) -> torch.Tensor:
        raise NotImplementedError(f"{self.format} weights do not run in the C++ layer stack")

    def describe(self) -> str:
        return f"{self.format} ({self.kernel})"


def _flat(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """x [..., K] as [M, K] and the leading shape to restore."""
    return (x, ()) if x.dim() == 2 else (x.reshape(-1, x.shape[-1]), tuple(x.shape[:-1]))


def _unflat(out: torch.Tensor, lead: tuple[int, ...]) -> torch.Tensor:
    return out if not lead else out.reshape(*lead, out.shape[-1])


class DenseWeight(PreparedWeight):
    """The weight as loaded; `transposed` (CPU LM heads): multiply by a [K, N] copy,
    about twice as fast for a decode step's logits as F.linear over [N, K]."""

    format = "dense"
    category = "dense"

    def __init__(self, weight: torch.Tensor, transposed: bool = False) -> None:
        super().__init__(weight.shape[0], weight.shape[1])
        self.weight = weight
        self.weight_t = weight.detach().t().contiguous() if transposed else None
        self.kernel = "matmul over W^T" if transposed else "F.linear"

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if self.weight_t is None:
            return F.linear(x, self.weight, bias)  # [..., N]
        out = x @ self.weight_t  # [..., N]
        return out if bias is None else out + bias


class PairsWeight(PreparedWeight):
    """bf16 weights in pairs (cpu_gemm.pack_pairs): bf16 activations run the bf16 dot
    products, float32 ones float32 arithmetic over the bf16 weights."""

    format = "bf16 pairs"
    category = "packed"
    cpp_kind: int | None = CPP_PAIRS

    def __init__(self, weight: torch.Tensor, float32_activations: bool) -> None:
        super().__init__(weight.shape[0], weight.shape[1])
        self.packed = pack_pairs(weight.detach().to(torch.bfloat16))  # [N / 16, K / 2, 32]
        self.kernel = "bf16w_linear" if float32_activations else "bf16_pairs_linear"

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2, lead = _flat(x)
        return _unflat(pairs_linear(x2, self.packed, bias), lead)  # [..., N]

    @property
    def cpp_tensor(self) -> torch.Tensor:
        return self.packed


class OneDnnWeight(PreparedWeight):
    """oneDNN-packed float32 or bfloat16; `plain`: the weight as loaded, which 1-2 rows
    stream through the small-batch kernel (cpu_gemm.small_batch_linear)."""

    format = "oneDNN packed"
    category = "packed"
    cpp_kind: int | None = CPP_ONEDNN

    def __init__(self, weight: torch.Tensor, plain: torch.Tensor | None = None) -> None:
        super().__init__(weight.shape[0], weight.shape[1])
        self.packed = pack_weight(weight)
        self.plain = plain
        self.kernel = "mkldnn._linear_pointwise" + (", small_batch_linear for 1-2 rows"
                                                    if plain is not None else "")
        if plain is not None:
            self.cpp_kind = None  # the C++ loop has no small-batch path: Python runs it

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2, lead = _flat(x)
        out = small_batch_linear(x2, self.plain, bias)  # 1-2 rows: stream the plain copy
        if out is None:
            out = packed_linear(x2, self.packed, bias)
        return _unflat(out, lead)  # [..., N]

    @property
    def cpp_tensor(self) -> torch.Tensor:
        return self.packed


class Int8PreparedWeight(PreparedWeight):
    """W8A8: int8 weights per output channel, activations quantized per row at run time."""

    format = "int8 (W8A8)"
    category = "int8"
    kernel = "int8_linear"

    def __init__(self, weight: torch.Tensor, smoothing: torch.Tensor | None = None) -> None:
        super().__init__(weight.shape[0], weight.shape[1])
        self.int8 = Int8Weight.quantize(weight, smoothing)

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        x2, lead = _flat(x)
        return _unflat(int8_linear(x2, self.int8, bias), lead)  # [..., N]


# `QuantWeight`: the C++ side (csrc/quant/) repacks GGUF rows into groups of 16 output
# columns whose levels sit as the CPU's integer dot products want them
# (csrc/quant/quant_layout.h), and multiplies by them with the input rows quantized to
# int8 per block as llama.cpp does (Q8_0 for Q4_0..Q8_0, Q8_K for the K-quants): one
# pass over the weight for every tile of rows, on the ISA level the CPU has (csrc/isa.h).
# A packed weight may hold several segments in different formats (a fused q/k/v whose v
# is Q6_K while q and k are Q4_K).
class QuantWeight(PreparedWeight):
    """A packed quantized weight [out_features, in_features]; `logits`: outputs in
    float32 whatever the input dtype (an LM head)."""

    category = "quantized"
    cpp_kind = CPP_QUANT
    kernel = "q_linear (int8 dot products)"

    def __init__(self, blob: torch.Tensor, types: list[int], out_features: int,
                 in_features: int, logits: bool = False) -> None:
        super().__init__(out_features, in_features)
        self.blob, self.types, self.logits = blob, types, logits
        names = sorted({type_name(t) for t in types})
        self.format = "+".join(names)

    @classmethod
    def from_parts(cls, parts: list[QuantTensor], name: str = "") -> QuantWeight:
        """Stack `parts` (each [n_i, K], the same K) along the output features."""
        k = parts[0].shape[-1]
        for part in parts:
            if part.ggml_type not in QUANT_TYPES:
                raise ValueError(f"{part.name or name}: GGML type {part.type_name} is not "
                                 "supported (radixlm runs Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, "
                                 "Q3_K, Q4_K, Q5_K, Q6_K, F16, BF16 and F32)")
            if part.dim() != 2 or part.shape[-1] != k:
                raise ValueError(f"{name}: parts {[list(p.shape) for p in parts]} do not stack")
        if load_cpu_kernels() is None:
            raise RuntimeError("quantized weights need radixlm's CPU kernels, which are not "
                               "built here (python -m radixlm.layers.cpu_kernels)")
        types = [p.ggml_type for p in parts]
        blob = torch.ops.radixlm.q_pack([p.rows_2d() for p in parts], types, k)
        return cls(blob, types, sum(p.shape[0] for p in parts), k)

    @classmethod
    def quantize(cls, weight: torch.Tensor, ggml_type: int) -> QuantWeight:
        """A float weight [N, K] quantized to `ggml_type` (Q8_0, Q4_0 or Q4_K) as llama.cpp's
        reference quantizers do (csrc/quant/quantize.cpp)."""
        load_cpu_kernels()
        raw = torch.ops.radixlm.q_quantize(weight.detach().float().contiguous(), ggml_type)
        return cls.from_parts([QuantTensor(raw, ggml_type, tuple(weight.shape))])

    def as_logits(self) -> QuantWeight:
        """The same packed weight, computing float32 outputs (an LM head)."""
        return QuantWeight(self.blob, self.types, self.out_features, self.in_features, True)

    def apply(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        if x2.dtype not in (torch.float32, torch.bfloat16):
            x2 = x2.float()
        if x2.stride(-1) != 1:
            x2 = x2.contiguous()
        out = torch.ops.radixlm.q_linear(x2, self.blob, bias, self.logits)  # [M, N]
        if not self.logits and out.dtype != x.dtype:
            out = out.to(x.dtype)
        return out.reshape(*lead, out.shape[-1])

    @property
    def cpp_tensor(self) -> torch.Tensor:
        return self.blob

    def embed(self, ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Rows `ids` [T] of the weight (an embedding table) → [T, in_features] in dtype."""
        out = torch.ops.radixlm.q_embedding(self.blob, ids, dtype == torch.bfloat16)
        return out if out.dtype == dtype else out.to(dtype)

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The whole weight [out_features, in_features] (tests, CUDA)."""
        return torch.ops.radixlm.q_dequantize(self.blob).to(dtype)

    @property
    def nbytes(self) -> int:
        return self.blob.numel()


def prepare_weight(weight: torch.Tensor, quantization: str, keep_plain: bool = False,
                   smoothing: torch.Tensor | None = None,
                   lm_head: bool = False) -> PreparedWeight:
    """The fastest form of a float weight [N, K] for `quantization`: a GGUF block format
    ("q8_0", "q4_0", "q4_k"; an LM head Q8_0), int8 ("w8a8_int8", with SmoothQuant's
    `smoothing`), bf16 pairs (bf16_weights over float32, or bf16 where the CPU has bf16
    dot products), oneDNN-packed (with the plain copy for 1-2 rows where `keep_plain`),
    else the weight as it is (an LM head: a [K, N] copy)."""
    quantized = _block_quantized(weight, quantization, lm_head)
    if quantized is not None:
        return quantized
    if quantization == "w8a8_int8":
        return Int8PreparedWeight(weight, smoothing)
    if quantization == "bf16_weights" and bf16w_capable(weight):
        return PairsWeight(weight, float32_activations=True)
    if pairs_capable(weight):
        return PairsWeight(weight, float32_activations=False)
    if can_pack(weight):
        plain = weight.detach().contiguous() if keep_plain and wants_plain_copy(weight) else None
        return OneDnnWeight(weight, plain)
    return DenseWeight(weight, transposed=lm_head and weight.device.type == "cpu")


def _block_quantized(weight: torch.Tensor, quantization: str,
                     lm_head: bool) -> PreparedWeight | None:
    """`weight` quantized for --quantization q8_0 | q4_0 | q4_k where its K allows (Q4_K
    needs K % 256 == 0, else Q8_0; the LM head takes Q8_0); None otherwise."""
    ggml_type = BLOCK_QUANTIZATIONS.get(quantization)
    if ggml_type is None or weight.device.type != "cpu" or load_cpu_kernels() is None:
        return None
    k = weight.shape[1]
    if lm_head or (ggml_type == 12 and k % 256):
        ggml_type = 8
    if k % 32:
        return None
    quant = QuantWeight.quantize(weight, ggml_type)
    return quant.as_logits() if lm_head else quant


def prepare_model(model: nn.Module, quantization: str = "none") -> tuple[int, int]:
    """Call `prepare_weights(quantization, keep_plain)` on every module that has one,
    after loading; keep_plain: whether packed weights keep their plain copy for
    `small_batch_linear` (see cpu_gemm.py). Logs the format and kernel of each kind of
    layer.

    Returns (number of weights quantized to int8 or a block format, number packed, for
    oneDNN or the bf16 pairs kernel).
    """
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"unknown quantization {quantization!r}; choose from {QUANTIZATIONS}")
    modules: list[Any] = [m for m in model.modules()
                          if callable(getattr(m, "prepare_weights", None))]
    # Modules with keeps_dense_weight (a tied output layer) keep their weight anyway.
    plain_bytes = sum(w.numel() * w.element_size() for m in modules
                      if isinstance(w := getattr(m, "weight", None), torch.Tensor)
                      and not getattr(m, "keeps_dense_weight", False)
                      and getattr(m, "prepared", None) is None and wants_plain_copy(w))
    keep_plain = quantization == "none" and 0 < plain_bytes <= MAX_PLAIN_COPY_BYTES
    if keep_plain:
        logger.info("Small-batch kernel for 1-2 rows: plain copies of packed weights kept "
                    "(%.0f MB)", plain_bytes / 2**20)
    elif plain_bytes > MAX_PLAIN_COPY_BYTES:
        logger.info("Small-batch kernel off: plain copies would take %.1f GB (at most %.1f)",
                    plain_bytes / 2**30, MAX_PLAIN_COPY_BYTES / 2**30)
    counts = {"int8": 0, "packed": 0, "dense": 0, "quantized": 0}
    float_mode = "none" if quantization == "gguf" else quantization
    for module in modules:
        counts[module.prepare_weights(float_mode, keep_plain)] += 1
    # bf16_weights and the block formats are not the exact mode: their float32 norms,
    # rotary and SiLU may take
    # the fused kernels (cpu_kernels.use_fused_cpu_kernel) instead of torch's ~15
    # operators a layer, a third of a one-request step.
    for module in model.modules():
        if hasattr(module, "fuse_float32"):
            setattr(module, "fuse_float32", quantization in FUSED_FLOAT32_MODES)  # noqa: B010
    log_weight_formats(model)
    return counts["int8"] + counts["quantized"], counts["packed"]


def log_weight_formats(model: nn.Module) -> None:
    """One start-up line per kind of layer (its name without the layer number): the
    format and kernel its weights run in, and how many layers."""
    kinds: Counter[tuple[str, str]] = Counter()
    for name, module in model.named_modules():
        kind = ".".join(p for p in name.split(".") if not p.isdigit())
        prepared = getattr(module, "prepared", None)
        if isinstance(prepared, PreparedWeight):
            kinds[(kind, prepared.describe())] += 1
        table = getattr(module, "quant", None)  # a quantized embedding table
        if isinstance(table, PreparedWeight):
            kinds[(kind, f"{table.format} (q_embedding lookup)")] += 1
    for (kind, described), num in sorted(kinds.items()):
        logger.info("Weights %s: %s x %d", kind, described, num)
