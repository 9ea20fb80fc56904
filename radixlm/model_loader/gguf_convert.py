"""Convert a GGUF file into a cached Hugging Face folder, once.

The folder holds config.json, model.safetensors (every tensor dequantized to
float32) and the tokenizer files (tokenizer.json, tokenizer_config.json, the
chat template), so every later start loads it like any other checkpoint.

- Metadata and the tensor table are read with a small parser here: the `gguf`
  package's reader walks every vocabulary string through numpy and takes
  seconds. Tensor data is dequantized with `gguf.quants.dequantize`.
- llama.cpp stores the Q and K projections of `llama` models with the rows
  of each head interleaved for its rotary kernel; the conversion undoes that
  permutation so the weights fit the Hugging Face ("neox") rotary layout.
- The tokenizer comes from transformers' GGUF tokenizer conversion.
- The folder is written to a temporary name and renamed into place, so a
  reader never sees half a folder and two processes converting at once both
  end with one complete copy.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import re
import shutil
import struct
import tempfile
import time
from collections.abc import Container, Iterator
from math import prod
from typing import Any, NamedTuple

import numpy as np
import torch

logger = logging.getLogger(__name__)

# NOTE: bump when the folder's contents change, so old caches are not reused.
CONVERTER_VERSION = 1

# GGUF architecture → (transformers model_type, architectures entry)
_ARCHS = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
}
# Architectures whose attn_q / attn_k rows llama.cpp permuted.
_PERMUTED_ARCHS = {"llama"}

_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_SKIPPED_TENSORS = {"rope_freqs.weight"}  # llama3 rope factors; the config's rope scaling rules

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


def _dequantize(blob: np.ndarray, info: GgufTensorInfo) -> torch.Tensor:
    """One tensor as float32, in its torch shape."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    from gguf.quants import dequantize

    qtype = GGMLQuantizationType(info.ggml_type)
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    row_bytes = info.shape[-1] // block_size * type_size
    num_bytes = prod(info.shape[:-1]) * row_bytes
    raw = blob[info.offset : info.offset + num_bytes].reshape(*info.shape[:-1], row_bytes)
    values = dequantize(raw, qtype).astype(np.float32, copy=False).reshape(info.shape)
    if not values.flags.writeable:  # a float32 tensor is a view of the read-only map
        values = values.copy()
    return torch.from_numpy(values)


# ---------------------------------------------------------------- mapping


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a llama.cpp tensor; None for tensors the model does not use."""
    if gguf_name in _SKIPPED_TENSORS:
        return None
    base, _, suffix = gguf_name.rpartition(".")
    if base in _GLOBAL_TENSORS:
        return f"{_GLOBAL_TENSORS[base]}.{suffix}"
    m = re.fullmatch(r"blk\.(\d+)\.(\w+)", base)
    if m and m.group(2) in _LAYER_TENSORS:
        return f"model.layers.{m.group(1)}.{_LAYER_TENSORS[m.group(2)]}.{suffix}"
    raise ValueError(f"GGUF tensor {gguf_name!r} has no Hugging Face counterpart here")


def unpermute_qk(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's per-head row interleaving of a Q or K projection (weight or bias).

    llama.cpp stores each head's rows as (D/2 pairs, 2); Hugging Face as (2 halves, D/2).
    """
    head_dim = weight.shape[0] // num_heads
    rest = weight.shape[1:]
    w = weight.reshape(num_heads, head_dim // 2, 2, *rest)  # [H, D/2, 2, ...]
    return w.transpose(1, 2).reshape(weight.shape).contiguous()  # [H * D, ...]


def _arch_value(meta: dict[str, Any], key: str, default: Any = None) -> Any:
    return meta.get(f"{meta['general.architecture']}.{key}", default)


def hf_config_kwargs(gguf: GgufFile) -> tuple[str, dict[str, Any]]:
    """(model_type, config kwargs) for transformers' config of this GGUF model."""
    meta = gguf.metadata
    arch = meta["general.architecture"]
    if arch not in _ARCHS:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported (supported: {sorted(_ARCHS)})"
        )
    model_type, hf_arch = _ARCHS[arch]
    num_heads = int(_arch_value(meta, "attention.head_count"))
    hidden = int(_arch_value(meta, "embedding_length"))
    names = {t.name for t in gguf.tensors}
    vocab = _arch_value(meta, "vocab_size") or meta.get("tokenizer.ggml.tokens")
    if vocab is None:
        raise ValueError(f"{gguf.path}: no vocabulary size in the metadata")
    kwargs: dict[str, Any] = {
        "architectures": [hf_arch],
        "vocab_size": int(vocab),
        "hidden_size": hidden,
        "intermediate_size": int(_arch_value(meta, "feed_forward_length")),
        "num_hidden_layers": int(_arch_value(meta, "block_count")),
        "num_attention_heads": num_heads,
        "num_key_value_heads": int(_arch_value(meta, "attention.head_count_kv", num_heads)),
        "head_dim": int(
            _arch_value(meta, "attention.key_length")
            or _arch_value(meta, "rope.dimension_count")
            or hidden // num_heads
        ),
        "max_position_embeddings": int(_arch_value(meta, "context_length", 2048)),
        "rms_norm_eps": float(_arch_value(meta, "attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_arch_value(meta, "rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }
    scaling = _arch_value(meta, "rope.scaling.type")
    if scaling in ("linear", "yarn"):
        kwargs["rope_scaling"] = {
            "rope_type": scaling,
            "factor": float(_arch_value(meta, "rope.scaling.factor", 1.0)),
            "original_max_position_embeddings": int(
                _arch_value(
                    meta, "rope.scaling.original_context_length", kwargs["max_position_embeddings"]
                )
            ),
        }
    if "rope_freqs.weight" in names:
        logger.warning(
            "%s: ignoring rope_freqs (llama3 rope factors); positions beyond the "
            "original context may differ from llama.cpp",
            gguf.path,
        )
    return model_type, kwargs


def iterate_gguf_weights(gguf: GgufFile) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 tensor) for every tensor the model uses, Q/K unpermuted."""
    meta = gguf.metadata
    arch = meta["general.architecture"]
    num_heads = int(_arch_value(meta, "attention.head_count"))
    num_kv_heads = int(_arch_value(meta, "attention.head_count_kv", num_heads))
    blob = np.memmap(gguf.path, dtype=np.uint8, mode="r")
    for info in gguf.tensors:
        name = hf_tensor_name(info.name)
        if name is None:
            continue
        tensor = _dequantize(blob, info)
        if arch in _PERMUTED_ARCHS and ".q_proj." in name:
            tensor = unpermute_qk(tensor, num_heads)
        elif arch in _PERMUTED_ARCHS and ".k_proj." in name:
            tensor = unpermute_qk(tensor, num_kv_heads)
        yield name, tensor


# ---------------------------------------------------------------- the cached folder


def gguf_cache_dir(gguf_path: str, cache_root: str | None = None) -> str:
    """Where the conversion of this file lives: keyed by path, size, mtime and converter version.

    cache_root defaults to `$RADIXLM_CACHE_DIR/gguf`, else `~/.cache/radixlm/gguf`.
    """
    if cache_root is None:
        base = os.environ.get("RADIXLM_CACHE_DIR") or os.path.expanduser("~/.cache/radixlm")
        cache_root = os.path.join(base, "gguf")
    path = os.path.realpath(gguf_path)
    st = os.stat(path)
    key = f"{CONVERTER_VERSION}|{path}|{st.st_size}|{st.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    stem = os.path.basename(path).removesuffix(".gguf")
    return os.path.join(cache_root, f"{stem}-{digest}")


def convert_gguf(gguf_path: str, cache_root: str | None = None) -> str:
    """The Hugging Face folder for a GGUF file, converting it on first use."""
    out_dir = gguf_cache_dir(gguf_path, cache_root)
    if os.path.isfile(os.path.join(out_dir, "config.json")):
        return out_dir
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    _remove_stale_temp_dirs(parent)
    start = time.perf_counter()
    tmp_dir = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
        _write_hf_folder(gguf_path, tmp_dir)
        os.rename(tmp_dir, out_dir)
    except OSError:
        if not os.path.isfile(os.path.join(out_dir, "config.json")):
            raise
        # Another process finished the same conversion first: use its copy.
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("converted %s to %s in %.1f s", gguf_path, out_dir, time.perf_counter() - start)
    return out_dir


def _remove_stale_temp_dirs(parent: str, max_age_s: float = 3600.0) -> None:
    """Delete half-written folders that crashed conversions left behind."""
    now = time.time()
    for entry in os.scandir(parent):
        if entry.name.startswith(".tmp-") and now - entry.stat().st_mtime > max_age_s:
            shutil.rmtree(entry.path, ignore_errors=True)


def _write_hf_folder(gguf_path: str, out_dir: str) -> None:
    from safetensors.torch import save_file
    from transformers import AutoConfig

    gguf = read_gguf(gguf_path)
    model_type, kwargs = hf_config_kwargs(gguf)
    config = AutoConfig.for_model(model_type, **kwargs)
    config.dtype = torch.float32
    tensors = dict(iterate_gguf_weights(gguf))
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(gguf_path, out_dir, config.max_position_embeddings)
    # NOTE: config.json last: its presence marks a complete folder.
    config.save_pretrained(out_dir)


def _write_tokenizer(gguf_path: str, out_dir: str, max_length: int) -> None:
    """tokenizer.json, tokenizer_config.json and the chat template, from the GGUF metadata."""
    tokenizer: Any
    try:  # transformers >= 5: the tokenizer alone, without parsing the file twice more
        from transformers import PreTrainedTokenizerFast
        from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

        arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(gguf_path)
        backend, extra = convert_gguf_tokenizer(arch, tokenizer_dict)
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=backend, **{**tokenizer_config, **extra}
        )
    except ImportError:
        from transformers import AutoTokenizer

        folder, name = os.path.split(os.path.abspath(gguf_path))
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.model_max_length = max_length
    tokenizer.save_pretrained(out_dir)
