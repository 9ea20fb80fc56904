"""Convert a GGUF file into a cached Hugging Face folder, once.

The folder holds config.json, model.safetensors (every tensor dequantized to
float32) and the tokenizer files (tokenizer.json, tokenizer_config.json, the
chat template), so every later start loads it like any other checkpoint.

- The file is read by gguf_file.py and mapped onto Hugging Face names and
  config by gguf_arch.py (`plan_gguf`), which also says how to undo what
  llama.cpp's converter did to some tensors (the Q/K row permutation of
  `llama` models, Gemma's 1 + w norms, MoE experts stacked in 3D tensors);
  tensor data is dequantized with `gguf.quants.dequantize`.
- End-of-turn tokens (eos, eot, eom) go into generation_config.json.
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

import numpy as np
import torch

from radixlm.model_loader.gguf_arch import GgufPlan, apply_plan, complete_config, plan_gguf
from radixlm.model_loader.gguf_file import GgufFile, dequantize_tensor, read_gguf

logger = logging.getLogger(__name__)

# NOTE: bump when the folder's contents change, so old caches are not reused.
CONVERTER_VERSION = 2


# ---------------------------------------------------------------- weights


def iterate_gguf_weights(gguf: GgufFile, plan: GgufPlan | None = None
                         ) -> Iterator[tuple[str, torch.Tensor]]:
    """(Hugging Face name, float32 tensor) for every tensor the model uses, with
    llama.cpp's fix-ups undone (gguf_arch.py)."""
    plan = plan or plan_gguf(gguf.metadata, gguf.tensors)
    infos = {t.name: t for t in gguf.tensors}
    blob = np.memmap(gguf.path, dtype=np.uint8, mode="r")
    current: tuple[str, torch.Tensor] | None = None
    for tensor_plan in plan.tensors:  # a 3D expert tensor's slices follow each other
        if current is None or current[0] != tensor_plan.gguf_name:
            current = (tensor_plan.gguf_name, dequantize_tensor(blob, infos[tensor_plan.gguf_name]))
        yield tensor_plan.hf_name, apply_plan(current[1], tensor_plan).contiguous()


def gguf_config(gguf: GgufFile, plan: GgufPlan) -> dict[str, Any]:
    """The transformers config kwargs, with the values of the plan's config tensors."""
    blob = np.memmap(gguf.path, dtype=np.uint8, mode="r")
    infos = {t.name: t for t in gguf.tensors}
    values = {name: dequantize_tensor(blob, infos[name]).numpy() for name in plan.config_tensors}
    return complete_config(plan, values)


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
    plan = plan_gguf(gguf.metadata, gguf.tensors)
    config = AutoConfig.for_model(plan.model_type, **gguf_config(gguf, plan))
    config.dtype = torch.float32
    tensors = dict(iterate_gguf_weights(gguf, plan))
    save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(gguf_path, out_dir, config.max_position_embeddings)
    if plan.generation_config:
        with open(os.path.join(out_dir, "generation_config.json"), "w") as f:
            json.dump(plan.generation_config, f, indent=2)
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
