"""Reading a GGUF file: its metadata and tensor table, and its tensors' data.

Metadata and the tensor table are read with a small parser here: the `gguf`
package's reader walks every vocabulary string through numpy and takes
seconds. Tensor data stays in the file: `GgufData` maps it (private,
copy-on-write, never written) and hands out each tensor as a view, a float
tensor for F32/F16/BF16 and a `QuantTensor` for block formats, without
copying; `release` lets the kernel drop a tensor's pages once it has been
repacked, so a loaded model does not keep the file's pages besides its own
copy.
"""

from __future__ import annotations

import logging
import mmap
import struct
from collections.abc import Container
from math import prod
from typing import Any, NamedTuple

import torch

from radixlm.layers.quant.quant_tensor import GGML_TYPES, QuantTensor, row_bytes, type_name

logger = logging.getLogger(__name__)

_FLOAT_DTYPES = {0: torch.float32, 1: torch.float16, 30: torch.bfloat16}

# Fixed-size metadata value types: GGUF type id → struct format.
_SCALAR_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


class GgufTensorInfo(NamedTuple):
    name: str
    shape: tuple[int, ...]  # torch order (slowest dimension first)
    ggml_type: int
    offset: int  # absolute byte offset in the file


class GgufFile(NamedTuple):
    path: str
    metadata: dict[str, Any]  # string arrays not asked for are replaced by their length
    tensors: list[GgufTensorInfo]



# ---------------------------------------------------------------- reading


def _read_str(blob: mmap.mmap, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", blob, pos)
    pos += 8
    return bytes(blob[pos : pos + n]).decode("utf-8", errors="replace"), pos + n


def _read_value(blob: mmap.mmap, pos: int, vtype: int, keep_strings: bool) -> tuple[Any, int]:
    if vtype in _SCALAR_FORMATS:
        fmt = _SCALAR_FORMATS[vtype]
        return struct.unpack_from(fmt, blob, pos)[0], pos + struct.calcsize(fmt)
    if vtype == _GGUF_STRING:
        return _read_str(blob, pos)
    if vtype != _GGUF_ARRAY:
        raise ValueError(f"unknown GGUF metadata type {vtype}")
    etype, count = struct.unpack_from("<IQ", blob, pos)
    pos += 12
    if etype in _SCALAR_FORMATS:
        fmt = _SCALAR_FORMATS[etype]
        values = struct.unpack_from(f"<{count}{fmt[1]}", blob, pos)
        return list(values), pos + count * struct.calcsize(fmt)
    if etype != _GGUF_STRING:
        raise ValueError(f"GGUF arrays of type {etype} are not supported")
    strings: list[str] = []
    for _ in range(count):
        if keep_strings:
            s, pos = _read_str(blob, pos)
            strings.append(s)
        else:
            pos += 8 + struct.unpack_from("<Q", blob, pos)[0]
    return (strings if keep_strings else count), pos


def read_gguf(path: str, string_arrays: Container[str] = ()) -> GgufFile:
    """Metadata and tensor table of a GGUF (v2/v3) file; tensor data stays on disk.

    String arrays (the vocabulary, the merges) are read only when named in string_arrays.
    """
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as blob:
        metadata, table, end = _read_header(blob, path, string_arrays)
    alignment = int(metadata.get("general.alignment", 32))
    data_start = -(-end // alignment) * alignment
    tensors = [GgufTensorInfo(n, s, t, data_start + o) for n, s, t, o in table]
    return GgufFile(path, metadata, tensors)


def _read_header(
    blob: mmap.mmap, path: str, string_arrays: Container[str]
) -> tuple[dict[str, Any], list[tuple[str, tuple[int, ...], int, int]], int]:
    """(metadata, [(name, torch shape, ggml type, data offset)], end of the tensor table)."""
    if blob[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    version, num_tensors, num_kv = struct.unpack_from("<IQQ", blob, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported")
    pos = 24
    metadata: dict[str, Any] = {}
    table: list[tuple[str, tuple[int, ...], int, int]] = []
    for _ in range(num_kv):
        key, pos = _read_str(blob, pos)
        (vtype,) = struct.unpack_from("<I", blob, pos)
        metadata[key], pos = _read_value(blob, pos + 4, vtype, key in string_arrays)
    for _ in range(num_tensors):
        name, pos = _read_str(blob, pos)
        (ndim,) = struct.unpack_from("<I", blob, pos)
        dims = struct.unpack_from(f"<{ndim}Q", blob, pos + 4)
        ggml_type, offset = struct.unpack_from("<IQ", blob, pos + 4 + 8 * ndim)
        pos += 4 + 8 * ndim + 12
        table.append((name, tuple(reversed(dims)), ggml_type, offset))
    return metadata, table, pos


class GgufData:
    """The tensor data of a GGUF file, mapped (see the module docstring). Use as a
    context manager, or call close(); views handed out must not outlive it."""

    def __init__(self, path: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self._bytes: torch.Tensor | None = torch.frombuffer(self._map, dtype=torch.uint8)

    def __enter__(self) -> GgufData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def nbytes(self, info: GgufTensorInfo) -> int:
        return prod(info.shape[:-1]) * row_bytes(info.ggml_type, info.shape[-1])

    def tensor(self, info: GgufTensorInfo) -> torch.Tensor | QuantTensor:
        """A float view [*shape] (F32, F16, BF16) or a QuantTensor (block formats)."""
        assert self._bytes is not None, "GgufData is closed"
        if info.ggml_type not in GGML_TYPES:
            raise ValueError(f"{self.path}: tensor {info.name!r} has unknown GGML type "
                             f"{info.ggml_type}")
        raw = self._bytes.narrow(0, info.offset, self.nbytes(info))
        if info.ggml_type in _FLOAT_DTYPES:
            return raw.view(_FLOAT_DTYPES[info.ggml_type]).view(info.shape)
        rows = raw.view(*info.shape[:-1], row_bytes(info.ggml_type, info.shape[-1]))
        return QuantTensor(rows, info.ggml_type, info.shape, info.name)

    def release(self, info: GgufTensorInfo) -> None:
        """Drop the tensor's pages from this process (they are read again on use)."""
        page = mmap.PAGESIZE
        start = info.offset // page * page
        end = min(-(-(info.offset + self.nbytes(info)) // page) * page, len(self._map))
        if end > start:
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)

    def close(self) -> None:
        self._bytes = None
        try:
            self._map.close()
        except BufferError:  # a view still alive: the map goes when the last view does
            logger.debug("%s: tensor views outlive the mapping", self.path)


def describe_types(gguf: GgufFile) -> str:
    """'Q4_K x 97, F32 x 33, ...': the tensor types of a file."""
    counts: dict[str, int] = {}
    for t in gguf.tensors:
        counts[type_name(t.ggml_type)] = counts.get(type_name(t.ggml_type), 0) + 1
    return ", ".join(f"{n} x {c}" for n, c in sorted(counts.items(), key=lambda kv: -kv[1]))
