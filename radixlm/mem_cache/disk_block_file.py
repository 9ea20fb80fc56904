"""One KV block as a file of the disk tier: header, payload, checksum.

    magic    8 bytes   b"RLXKVB" and the format version (uint16, little endian)
    length   4 bytes   length H of the header (uint32, little endian)
    header   H bytes   JSON: the namespace and key (hex), the block's token ids, the layout
    payload            for each buffer of the layout, in order, the block's rows
                       (num_tokens * row_bytes bytes: the pool's own bytes, any dtype)
    digest   16 bytes  blake2b-128 of everything before it

`write_block` writes under a temporary name in the final folder and renames
the file into place (atomic on POSIX), so a block is never visible half
written under its real name. `read_block` checks everything before it hands
out a byte: the magic, the header against what the caller expects (so a
renamed file, a hash collision or another model's block is refused too), the
file's length, and the digest; a failure raises `BlockFileError` saying what
is wrong, and the caller must not use what was read.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import threading
from collections.abc import Sequence
from typing import Any, BinaryIO

import torch

from radixlm.mem_cache.disk_key import BufferSpec

FORMAT_VERSION = 1
MAGIC = b"RLXKVB" + struct.pack("<H", FORMAT_VERSION)
_PREFIX = struct.Struct("<8sI")
_DIGEST_BYTES = 16
_MAX_HEADER_BYTES = 1 << 24
SUFFIX = ".kvb"
TMP_SUFFIX = ".tmp"


class BlockFileError(Exception):
    """A block file that must not be served (damaged, cut short, or not the block asked for)."""


class BlockMeta:
    """What a block file must say about itself."""

    __slots__ = ("namespace", "key", "tokens", "layout")

    def __init__(self, namespace: bytes, key: bytes, tokens: Sequence[int],
                 layout: Sequence[BufferSpec]) -> None:
        self.namespace = namespace
        self.key = key
        self.tokens = list(tokens)
        self.layout = tuple(layout)

    def header(self) -> bytes:
        return json.dumps({
            "namespace": self.namespace.hex(), "key": self.key.hex(), "tokens": self.tokens,
            "layout": [[s.name, s.dtype, list(s.row_shape)] for s in self.layout],
        }, separators=(",", ":")).encode()

    @property
    def payload_bytes(self) -> int:
        return len(self.tokens) * sum(s.row_bytes for s in self.layout)

    @property
    def file_bytes(self) -> int:
        return _PREFIX.size + len(self.header()) + self.payload_bytes + _DIGEST_BYTES


def _byte_view(t: torch.Tensor) -> Any:
    """A writable 1-D byte view of a contiguous CPU tensor (any dtype, bfloat16 included)."""
    assert t.is_contiguous() and t.device.type == "cpu"
    return t.view(torch.uint8).reshape(-1).numpy()


def write_block(path: str, meta: BlockMeta, rows: Sequence[torch.Tensor]) -> int:
    """Write one block: rows[i] is buffer i's [num_tokens, *row_shape] (contiguous, on the
    CPU). Atomic: a temporary file renamed into place. Returns the file's size."""
    if len(rows) != len(meta.layout):
        raise ValueError(f"{len(rows)} buffers for a layout of {len(meta.layout)}")
    header = meta.header()
    digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}{TMP_SUFFIX}"
    try:
        with open(tmp, "wb") as f:
            for part in (_PREFIX.pack(MAGIC, len(header)), header):
                digest.update(part)
                f.write(part)
            for t in rows:
                if t.numel():
                    view = _byte_view(t)
                    digest.update(view)
                    f.write(view)
            f.write(digest.digest())
            size = f.tell()
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return size


def read_block(path: str, meta: BlockMeta, dest: Sequence[torch.Tensor]) -> int:
    """Read the block `meta` names into dest[i] (buffer i's [num_tokens, *row_shape],
    contiguous, on the CPU); returns the file's size. Raises BlockFileError when the file
    is not exactly that block, intact; FileNotFoundError when it is gone."""
    with open(path, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        digest = hashlib.blake2b(digest_size=_DIGEST_BYTES)
        prefix = _read_exact(f, _PREFIX.size, "prefix")
        magic, header_len = _PREFIX.unpack(prefix)
        if magic != MAGIC:
            raise BlockFileError(f"not a version-{FORMAT_VERSION} KV block file")
        if header_len > _MAX_HEADER_BYTES:
            raise BlockFileError(f"header of {header_len} bytes")
        header = _read_exact(f, header_len, "header")
        _check_header(header, meta)
        expected = _PREFIX.size + header_len + meta.payload_bytes + _DIGEST_BYTES
        if size != expected:
            raise BlockFileError(f"{size} bytes, expected {expected} (cut short or padded)")
        digest.update(prefix)
        digest.update(header)
        for t in dest:
            if t.numel():
                view = _byte_view(t)
                _readinto_exact(f, view)
                digest.update(view)
        if _read_exact(f, _DIGEST_BYTES, "checksum") != digest.digest():
            raise BlockFileError("checksum mismatch (damaged)")
    return size


def _read_exact(f: BinaryIO, n: int, what: str) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise BlockFileError(f"{what} cut short")
    return data


def _readinto_exact(f: io.RawIOBase, view: Any) -> None:
    mv = memoryview(view).cast("B")
    done = 0
    while done < mv.nbytes:
        n = f.readinto(mv[done:])
        if not n:
            raise BlockFileError("payload cut short")
        done += n


def _check_header(raw: bytes, meta: BlockMeta) -> None:
    try:
        header = json.loads(raw)
    except ValueError as e:
        raise BlockFileError(f"unreadable header: {e}") from None
    if not isinstance(header, dict):
        raise BlockFileError("unreadable header")
    if header.get("namespace") != meta.namespace.hex():
        raise BlockFileError("another model or KV layout (namespace differs)")
    if header.get("key") != meta.key.hex():
        raise BlockFileError("another block (key differs)")
    if header.get("tokens") != meta.tokens:
        raise BlockFileError("other token ids than its key names")
    layout = [[s.name, s.dtype, list(s.row_shape)] for s in meta.layout]
    if header.get("layout") != layout:
        raise BlockFileError("another KV layout")
