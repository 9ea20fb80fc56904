"""A GGUF file as a cached Hugging Face folder, once: config and tokenizer only.

The folder holds config.json, generation_config.json (end-of-turn tokens: eos,
eot, eom), the tokenizer files (tokenizer.json, tokenizer_config.json, the chat
template) and `model.gguf`, a link to the file itself; the weights stay in the
GGUF file and are read from it at every start (`iterate_gguf_weights`): kept in
their block formats for radixlm's quantized kernels (`--quantization gguf`, the
CPU default), or dequantized tensor by tensor for the float modes and CUDA.
Nothing else is written.

- The file is read by gguf_file.py and mapped onto Hugging Face names and
  config by gguf_arch.py (`plan_gguf`), which also says how to undo what
  llama.cpp's converter did to some tensors (the Q/K row permutation of
  `llama` models, Gemma's 1 + w norms, MoE experts stacked in 3D tensors).
  A block-quantized tensor takes the expert slice and the Q/K permutation as
  they are (they select whole rows), so every family loads quantized.
- The tokenizer comes from transformers' GGUF tokenizer conversion.
- The folder is written to a temporary name and renamed into place, so a
  reader never sees half a folder and two processes converting at once both
  end with one complete copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import torch

from radixlm.layers.quant.quant_tensor import FLOAT_TYPES, QUANT_TYPES, QuantTensor, type_name
from radixlm.model_loader.gguf_arch import (
    UNPERMUTE,
    GgufPlan,
    TensorPlan,
    apply_plan,
    complete_config,
    plan_gguf,
)
from radixlm.model_loader.gguf_file import GgufData, GgufFile, GgufTensorInfo, read_gguf

logger = logging.getLogger(__name__)

# NOTE: bump when the folder's contents change, so old caches are not reused.
CONVERTER_VERSION = 3  # 3: no model.safetensors, a link to the file
GGUF_LINK = "model.gguf"  # the folder's link to its GGUF file

Weight = torch.Tensor | QuantTensor


# ---------------------------------------------------------------- weights


def qk_row_order(num_rows: int, num_heads: int) -> torch.Tensor:
    """The row order `gguf_arch.unpermute_qk` gives: row i of the result is row order[i]
    of a llama.cpp Q or K projection."""
    head_dim = num_rows // num_heads
    rows = torch.arange(num_rows).reshape(num_heads, head_dim // 2, 2)
    return rows.transpose(1, 2).reshape(-1)


def _apply_quant_plan(tensor: QuantTensor, plan: TensorPlan) -> Weight:
    """apply_plan for a block-quantized tensor: whole rows move, blocks stay intact."""
    if plan.expert is not None:
        tensor = tensor[plan.expert]
    if plan.fix is None:
        return tensor
    if plan.fix[0] == UNPERMUTE:
        return tensor.index_rows(qk_row_order(tensor.shape[0], int(plan.fix[1])))
    return apply_plan(tensor.dequantize(), plan._replace(expert=None))  # (a norm: never seen)


def _float32(data: GgufData, info: GgufTensorInfo) -> torch.Tensor:
    tensor = data.tensor(info)
    if isinstance(tensor, QuantTensor):
        return tensor.dequantize()
    return tensor.to(torch.float32, copy=True)  # (a float view of the file: copied out)


def _read(data: GgufData, info: GgufTensorInfo, keep_quantized: bool) -> Weight:
    return data.tensor(info) if keep_quantized else _float32(data, info)


def iterate_gguf_weights(gguf: GgufFile | str, plan: GgufPlan | None = None,
                         keep_quantized: bool = False) -> Iterator[tuple[str, Weight]]:
    """(Hugging Face name, tensor) for every tensor the model uses, with llama.cpp's
    fix-ups undone (gguf_arch.py).

    keep_quantized: block-quantized tensors come as QuantTensors (views of the file),
    float ones as float views; raises ValueError naming the tensor for a block format the
    kernels do not run. Else every tensor comes as float32. Each GGUF tensor's pages are
    released once the consumer has moved on to the next one."""
    gguf = read_gguf(gguf) if isinstance(gguf, str) else gguf
    plan = plan or plan_gguf(gguf.metadata, gguf.tensors)
    if keep_quantized:
        _check_types(gguf, plan)
    infos = {t.name: t for t in gguf.tensors}
    with GgufData(gguf.path) as data:
        current: tuple[str, Weight] | None = None
        for tensor_plan in plan.tensors:  # a 3D expert tensor's slices follow each other
            if current is None or current[0] != tensor_plan.gguf_name:
                if current is not None:
                    data.release(infos[current[0]])
                current = (tensor_plan.gguf_name,
                           _read(data, infos[tensor_plan.gguf_name], keep_quantized))
            tensor = current[1]
            if isinstance(tensor, QuantTensor):
                yield tensor_plan.hf_name, _apply_quant_plan(tensor, tensor_plan)
            else:
                yield tensor_plan.hf_name, apply_plan(tensor, tensor_plan)
        current = None
        for info in gguf.tensors:
            data.release(info)


def _check_types(gguf: GgufFile, plan: GgufPlan) -> None:
    used = {p.gguf_name for p in plan.tensors}
    for info in gguf.tensors:
        if info.name in used and info.ggml_type not in QUANT_TYPES | FLOAT_TYPES:
            raise ValueError(
                f"{gguf.path}: tensor {info.name!r} is {type_name(info.ggml_type)}, which "
                "radixlm's quantized kernels do not run (they run Q4_0, Q4_1, Q5_0, Q5_1, "
                "Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, F16, BF16, F32); "
                "--quantization none runs the model dequantized")


def gguf_config(gguf: GgufFile, plan: GgufPlan) -> dict[str, Any]:
    """The transformers config kwargs, with the values of the plan's config tensors."""
    infos = {t.name: t for t in gguf.tensors}
    with GgufData(gguf.path) as data:
        values = {name: _float32(data, infos[name]).numpy() for name in plan.config_tensors}
    return complete_config(plan, values)


def gguf_shapes(path: str) -> dict[str, tuple[int, ...]]:
    """Hugging Face name → shape of every tensor the model uses (no data read)."""
    gguf = read_gguf(path)
    infos = {t.name: t for t in gguf.tensors}
    return {p.hf_name: infos[p.gguf_name].shape[1:] if p.expert is not None
            else infos[p.gguf_name].shape
            for p in plan_gguf(gguf.metadata, gguf.tensors).tensors}


def gguf_is_quantized(model_dir: str) -> bool:
    """Whether model_dir is a GGUF folder whose file holds block-quantized tensors."""
    path = gguf_in_folder(model_dir)
    return path is not None and any(t.ggml_type not in FLOAT_TYPES for t in read_gguf(path).tensors)


def gguf_in_folder(model_dir: str) -> str | None:
    """The GGUF file a converted folder links to, or None for another folder."""
    path = os.path.join(model_dir, GGUF_LINK)
    return path if os.path.exists(path) else None


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
    """The Hugging Face folder for a GGUF file, writing it on first use."""
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
    logger.info("Read the config and tokenizer of %s into %s in %.1f s", gguf_path, out_dir,
                time.perf_counter() - start)
    return out_dir


def _remove_stale_temp_dirs(parent: str, max_age_s: float = 3600.0) -> None:
    """Delete half-written folders that crashed conversions left behind."""
    now = time.time()
    for entry in os.scandir(parent):
        if entry.name.startswith(".tmp-") and now - entry.stat().st_mtime > max_age_s:
            shutil.rmtree(entry.path, ignore_errors=True)


def _write_hf_folder(gguf_path: str, out_dir: str) -> None:
    gguf = read_gguf(gguf_path)
    plan = plan_gguf(gguf.metadata, gguf.tensors)
    config = _hf_config(gguf, plan)
    _write_tokenizer(gguf_path, out_dir, config.max_position_embeddings)
    _write_config_and_link(gguf, plan, config, out_dir)


def _hf_config(gguf: GgufFile, plan: GgufPlan) -> Any:
    from transformers import AutoConfig

    config = AutoConfig.for_model(plan.model_type, **gguf_config(gguf, plan))
    config.dtype = torch.float32
    return config


def write_config_and_link(gguf_path: str, out_dir: str) -> None:
    """config.json, generation_config.json and the link to the file in out_dir: all that
    loading needs (the tokenizer files are for serving)."""
    gguf = read_gguf(gguf_path)
    plan = plan_gguf(gguf.metadata, gguf.tensors)
    _write_config_and_link(gguf, plan, _hf_config(gguf, plan), out_dir)


def _write_config_and_link(gguf: GgufFile, plan: GgufPlan, config: Any, out_dir: str) -> None:
    if plan.generation_config:
        with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
            json.dump(plan.generation_config, f, indent=2)
    os.symlink(os.path.realpath(gguf.path), os.path.join(out_dir, GGUF_LINK))
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
