"""`QuantWeight`: a weight in a GGUF block format, repacked once for the kernels.

The C++ side (csrc/quant/) repacks GGUF rows into groups of 16 output columns
whose levels sit as the CPU's integer dot products want them
(csrc/quant/quant_layout.h), and multiplies by them with the input rows quantized
to int8 per block as llama.cpp does (Q8_0 for Q4_0..Q8_0, Q8_K for the
K-quants): one pass over the weight for every tile of rows, on the ISA level
the CPU has (csrc/isa.h). A packed weight may hold several segments in different
formats (a fused q/k/v whose v is Q6_K while q and k are Q4_K).

The same packed table serves a tied embedding lookup (`embed`) and the LM head.
"""

from __future__ import annotations

import torch

from radixlm.layers.cpu_kernels import load_cpu_kernels
from radixlm.layers.prepared_weight import CPP_QUANT, PreparedWeight
from radixlm.layers.quant.quant_tensor import QUANT_TYPES, QuantTensor, type_name


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
