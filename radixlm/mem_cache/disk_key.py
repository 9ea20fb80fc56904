"""What a KV block on the disk tier is keyed by: the model, the KV layout, and the tokens.

A block is `block_size` consecutive tokens of a prefix, starting at a
multiple of `block_size`. Its key is a hash chain, as vLLM's prefix-cache
blocks and SGLang HiCache's storage pages are keyed:

    key(-1) = namespace
    key(j)  = H(key(j - 1) || token ids of block j)

so a block's key names its whole prefix, and the keys of a request's blocks
are computed from its tokens alone, without reading anything. The namespace
is a digest of everything else that decides the bytes of a block:

- the model's identity: the real path, size and modification time of every
  weight file and of the file the user named (a GGUF), and a digest of
  config.json;
- the precision that changes KV values (dtype, weight quantization);
- the KV pool's layout: every per-slot buffer's name, dtype and row shape,
  and the KV dtype's name (an int8 pool with scales has another layout);
- the block size and the key format's version.

So a restart of the same model computes the same keys, and another model,
another precision or another KV dtype never does.

Images. The radix tree sees an image as its pad value repeated (vocab_size
plus a 30-bit hash: see messages/mm_inputs.py), which is too few bits for
a store that outlives the process. The chain mixes in each image's full
64-bit content hash instead, from `PseudoTokenHashes`, which the scheduler
fills from the requests that carry the images. A block whose pseudo token
has no known hash (or two different ones) gets no key: it is neither stored
nor looked up.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
from array import array
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import torch

KEY_FORMAT_VERSION = 1
_KEY_BYTES = 16  # blake2b-128: collisions are out of reach for any cache size
_MAX_PSEUDO_TOKENS = 1 << 16  # images whose full hash is remembered (LRU)


class BufferSpec(NamedTuple):
    """One per-slot buffer of the KV pool, as the disk tier stores it."""

    name: str  # e.g. "k3" (layer 3's keys)
    dtype: str  # torch dtype name without "torch.", e.g. "bfloat16"
    row_shape: tuple[int, ...]  # shape of one slot's row, e.g. (num_kv_heads, head_dim)

    @property
    def row_bytes(self) -> int:
        numel = 1
        for n in self.row_shape:
            numel *= n
        return numel * _element_size(self.dtype)


@functools.cache
def _element_size(dtype: str) -> int:
    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def pool_layout(buffers: Sequence[tuple[str, torch.Tensor]]) -> tuple[BufferSpec, ...]:
    """The layout of a pool's `slot_buffers()`: each buffer is [num_slots, *row_shape]."""
    return tuple(BufferSpec(name, str(t.dtype).removeprefix("torch."), tuple(t.shape[1:]))
                 for name, t in buffers)


def model_identity(model_path: str | None, model_dir: str) -> dict[str, Any]:
    """What identifies a model's weights without reading them: the real path, size and
    mtime of each weight file (and of `model_path`, the file or folder the user named),
    and a digest of config.json."""
    files: list[list[Any]] = []
    named = [model_path] if model_path else []
    patterns = ("*.safetensors", "*.bin", "*.gguf", "*.pt")
    found = sorted({f for p in patterns for f in glob.glob(os.path.join(model_dir, p))})
    for path in [*named, *found]:
        real = os.path.realpath(path)
        try:
            st = os.stat(real)
        except OSError:
            continue
        files.append([real, st.st_size, st.st_mtime_ns])
    config = os.path.join(model_dir, "config.json")
    config_digest = ""
    if os.path.isfile(config):
        with open(config, "rb") as f:
            config_digest = hashlib.blake2b(f.read(), digest_size=16).hexdigest()
    return {"files": files, "config": config_digest}


def make_namespace(identity: dict[str, Any], precision: dict[str, str],
                   layout: Sequence[BufferSpec], kv_dtype: str, block_size: int) -> bytes:
    """The chain's seed: a digest of the model, its precision, the KV layout and the
    block size (see the module docstring)."""
    doc = {
        "version": KEY_FORMAT_VERSION,
        "model": identity,
        "precision": precision,
        "kv_dtype": kv_dtype,
        "layout": [[s.name, s.dtype, list(s.row_shape)] for s in layout],
        "block_size": block_size,
    }
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(blob, digest_size=_KEY_BYTES).digest()


class PseudoTokenHashes:
    """Image pad values (pseudo token ids) → the image's full 64-bit content hash.

    Filled from requests' multimodal items; a pad value seen with two different
    hashes (two images that collide in 30 bits) is remembered as ambiguous, and
    blocks holding it get no key. Bounded: the least recently added are forgotten.
    """

    def __init__(self, capacity: int = _MAX_PSEUDO_TOKENS) -> None:
        self.capacity = capacity
        self._hashes: OrderedDict[int, int | None] = OrderedDict()

    def add(self, pad_value: int, content_hash: int) -> None:
        known = self._hashes.get(pad_value, content_hash)
        self._hashes[pad_value] = content_hash if known == content_hash else None
        self._hashes.move_to_end(pad_value)
        while len(self._hashes) > self.capacity:
            self._hashes.popitem(last=False)

    def add_items(self, items: Iterable[Any]) -> None:
        """Record every `MultimodalItem` (pad_value, hash) of a request."""
        for item in items:
            self.add(int(item.pad_value), int(item.hash))

    def get(self, pad_value: int) -> int | None:
        """The full hash, or None when unknown or ambiguous."""
        return self._hashes.get(pad_value)


class BlockHasher:
    """Computes the chain keys of a token sequence's full blocks."""

    def __init__(self, namespace: bytes, block_size: int, vocab_size: int,
                 pseudo: PseudoTokenHashes) -> None:
        if block_size < 1:
            raise ValueError(f"block size must be at least 1, got {block_size}")
        self.namespace = namespace
        self.block_size = block_size
        self.vocab_size = vocab_size
        self.pseudo = pseudo

    def keys(self, tokens: Sequence[int], num_blocks: int | None = None) -> list[bytes]:
        """Keys of blocks 0, 1, ... of `tokens` (full blocks only, at most num_blocks).

        Shorter than asked when a block holds an image pseudo token whose full
        hash is unknown: that block and every later one have no key.
        """
        bs = self.block_size
        n = len(tokens) // bs if num_blocks is None else min(num_blocks, len(tokens) // bs)
        keys: list[bytes] = []
        prev = self.namespace
        for j in range(n):
            block = tokens[j * bs : (j + 1) * bs]
            h = hashlib.blake2b(prev, digest_size=_KEY_BYTES)
            h.update(array("q", block).tobytes())
            if max(block) >= self.vocab_size:
                extra = self._pseudo_bytes(block)
                if extra is None:
                    break
                h.update(extra)
            prev = h.digest()
            keys.append(prev)
        return keys

    def _pseudo_bytes(self, block: Sequence[int]) -> bytes | None:
        """The full hashes of the block's pseudo tokens, in order of first appearance."""
        seen: dict[int, int] = {}
        for t in block:
            if t >= self.vocab_size and t not in seen:
                full = self.pseudo.get(t)
                if full is None:
                    return None
                seen[t] = full
        return b"".join(int(t).to_bytes(8, "little", signed=True)
                        + (int(h) & 0xFFFF_FFFF_FFFF_FFFF).to_bytes(8, "little")
                        for t, h in seen.items())
