"""A checkpoint tensor still in its GGUF block format.

`QuantTensor` stands in for a torch.Tensor in the layers' weight loaders
(layers/linear.py, layers/vocab_embedding.py), which call `shape`, `narrow`
and `dim` on it: narrowing rows (output features, vocabulary rows) is free,
narrowing the input dimension (a row-parallel layer's shard) works at block
boundaries only. The loaders keep it instead of copying it into a float
parameter; `QuantWeight` repacks it once for the kernels.

`raw` is a view of the file's bytes, [*leading dims, bytes per row]: one GGUF
row (K inputs, K / block blocks) per output feature.
"""

from __future__ import annotations

import numpy as np
import torch

# GGML type id → (name, inputs per block, bytes per block); gguf's GGML_QUANT_SIZES
# and GGMLQuantizationType, kept here so the loader needs no gguf import.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66), 17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50), 20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82), 23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2),
    26: ("I32", 1, 4), 27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2), 34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
# The block formats radixlm's kernels run (csrc/quant/quant_layout.h).
QUANT_TYPES = {2, 3, 6, 7, 8, 10, 11, 12, 13, 14}
# Float formats, read as float tensors (no kernel of their own).
FLOAT_TYPES = {0, 1, 30}
TYPE_IDS = {name: type_id for type_id, (name, _, _) in GGML_TYPES.items()}


def type_name(ggml_type: int) -> str:
    return GGML_TYPES.get(ggml_type, (f"type {ggml_type}", 0, 0))[0]


def row_bytes(ggml_type: int, k: int) -> int:
    """Bytes of one row of k inputs; raises ValueError when k is not whole blocks."""
    if ggml_type not in GGML_TYPES:
        raise ValueError(f"unknown GGML type {ggml_type}")
    _, block, size = GGML_TYPES[ggml_type]
    if k % block:
        raise ValueError(f"{k} inputs are not whole {type_name(ggml_type)} blocks of {block}")
    return k // block * size


class QuantTensor:
    """A block-quantized tensor of logical `shape` [..., K] (see the module docstring)."""

    def __init__(self, raw: torch.Tensor, ggml_type: int, shape: tuple[int, ...],
                 name: str = "") -> None:
        if raw.dtype != torch.uint8 or raw.shape[:-1] != tuple(shape[:-1]) or (
                raw.shape[-1] != row_bytes(ggml_type, shape[-1])):
            raise ValueError(f"{name or 'tensor'}: {tuple(raw.shape)} bytes do not hold "
                             f"{type_name(ggml_type)} {list(shape)}")
        self.raw, self.ggml_type, self.name = raw, ggml_type, name
        self.shape = torch.Size(shape)

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    @property
    def block(self) -> int:
        return GGML_TYPES[self.ggml_type][1]

    def dim(self) -> int:
        return len(self.shape)

    def size(self, dim: int) -> int:
        return int(self.shape[dim])

    def narrow(self, dim: int, start: int, length: int) -> QuantTensor:
        dim = dim % self.dim()
        shape = list(self.shape)
        shape[dim] = length
        if dim < self.dim() - 1:
            return QuantTensor(self.raw.narrow(dim, start, length), self.ggml_type, tuple(shape),
                               self.name)
        if start % self.block or length % self.block:
            raise ValueError(
                f"{self.name}: a shard of inputs [{start}, {start + length}) does not fall on "
                f"{self.type_name} block boundaries (every {self.block}); choose a --tp-size "
                "that splits this layer at whole blocks")
        per_block = GGML_TYPES[self.ggml_type][2]
        raw = self.raw.narrow(dim, start // self.block * per_block, length // self.block * per_block)
        return QuantTensor(raw, self.ggml_type, tuple(shape), self.name)

    def __getitem__(self, index: int) -> QuantTensor:
        """The index-th slice of the first dimension (an expert of a 3D expert tensor)."""
        return QuantTensor(self.raw[index], self.ggml_type, tuple(self.shape[1:]), self.name)

    def index_rows(self, order: torch.Tensor) -> QuantTensor:
        """Rows (first dimension) in `order` (a copy of those bytes): Q/K un-permutation."""
        return QuantTensor(self.raw.index_select(0, order), self.ggml_type, tuple(self.shape),
                           self.name)

    def rows_2d(self) -> torch.Tensor:
        """The raw bytes as [rows, bytes per row] (rows may be strided)."""
        return self.raw.reshape(-1, self.raw.shape[-1]) if self.dim() != 2 else self.raw

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The values, [*shape] in dtype (the kernels' C++ dequantizer where they run
        this type, else gguf-py's)."""
        from radixlm.layers.cpu_kernels import load_cpu_kernels

        rows = self.rows_2d()
        if self.ggml_type in QUANT_TYPES and load_cpu_kernels() is not None:
            blob = torch.ops.radixlm.q_pack([rows], [self.ggml_type], self.shape[-1])
            values = torch.ops.radixlm.q_dequantize(blob)
        else:
            values = _gguf_dequantize(rows, self.ggml_type)
        return values.reshape(self.shape).to(dtype)

    materialize = dequantize  # what default_weight_loader calls on a lazy tensor

    def __repr__(self) -> str:
        return f"QuantTensor({self.name!r}, {self.type_name}, {list(self.shape)})"


def _gguf_dequantize(rows: torch.Tensor, ggml_type: int) -> torch.Tensor:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    try:
        qtype = GGMLQuantizationType(ggml_type)
    except ValueError as e:
        raise ValueError(f"GGML type {ggml_type} is unknown to gguf-py") from e
    values = dequantize(np.ascontiguousarray(rows.numpy()), qtype)
    return torch.from_numpy(np.asarray(values, dtype=np.float32).copy())

