"""Build a model from a Hugging Face folder (or a GGUF file, converted once and cached).

The folder holds config.json and the weights as `*.safetensors` (one file, or
shards listed by `model.safetensors.index.json`); `pytorch_model*.bin` is read
when there are no safetensors. The model is built with uninitialized
parameters on the target device, then `model.load_weights()` copies each
checkpoint tensor into place by its Hugging Face name.
"""

from __future__ import annotations

import glob
import json
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import torch

from radixlm.model_loader.model_path import resolve_model_dir
from radixlm.models.base import CausalLM, PoolingModel
from radixlm.models.pooler import read_pooling_config
from radixlm.models.registry import get_model_class

logger = logging.getLogger(__name__)


def _weight_files(model_dir: str) -> tuple[list[str], str]:
    """(files, "safetensors" | "bin"); raises FileNotFoundError when there are none."""
    for index_name, kind in (
        ("model.safetensors.index.json", "safetensors"),
        ("pytorch_model.bin.index.json", "bin"),
    ):
        index_path = os.path.join(model_dir, index_name)
        if os.path.isfile(index_path):
            with open(index_path) as f:
                shards = sorted(set(json.load(f)["weight_map"].values()))
            return [os.path.join(model_dir, s) for s in shards], kind
    files = sorted(glob.glob(os.path.join(model_dir, "*.safetensors")))
    if files:
        return files, "safetensors"
    files = sorted(glob.glob(os.path.join(model_dir, "pytorch_model*.bin")))
    if files:
        return files, "bin"
    raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin weights in {model_dir}")


class LazyWeight:
    """A checkpoint tensor not read yet: `narrow()` reads only the part asked for.

    Stands in for a torch.Tensor in the layers' weight loaders (linear.py), which
    call only `shape`, `narrow` and, through default_weight_loader, `materialize`.
    Valid while the weight iterator that yielded it has not moved on.
    """

    def __init__(self, tensor_slice: Any) -> None:
        self._slice = tensor_slice  # safetensors' PySafeSlice
        self.shape = torch.Size(tensor_slice.get_shape())

    def dim(self) -> int:
        return len(self.shape)

    def narrow(self, dim: int, start: int, length: int) -> torch.Tensor:
        index = [slice(None)] * dim + [slice(start, start + length)]
        return self._slice[tuple(index)]  # type: ignore[no-any-return]

    def materialize(self) -> torch.Tensor:
        return self._slice[:]  # type: ignore[no-any-return]


def iterate_weights(model_dir: str, lazy: bool = False) -> Iterator[tuple[str, Any]]:
    """Yield (Hugging Face name, CPU tensor) for every tensor of the checkpoint in model_dir;
    with `lazy`, safetensors tensors come as LazyWeights (read when narrowed)."""
    files, kind = _weight_files(model_dir)
    for path in files:
        if kind == "safetensors":
            from safetensors import safe_open

            with safe_open(path, framework="pt", device="cpu") as f:
                for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                    yield name, LazyWeight(f.get_slice(name)) if lazy else f.get_tensor(name)
        else:
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            yield from state.items()


class CheckpointShapes(dict[str, tuple[int, ...]]):
    """Every tensor of a checkpoint: its name → shape (recorded while loading)."""

    def first_difference(self, other: CheckpointShapes) -> str | None:
        """A sentence naming the first tensor that differs from `other`, or None."""
        for name in sorted(set(self) | set(other)):
            if name not in other:
                return f"the new checkpoint lacks {name!r}"
            if name not in self:
                return f"the new checkpoint has {name!r}, which the served model lacks"
            if self[name] != other[name]:
                return (f"{name!r} has shape {list(other[name])} in the new checkpoint, "
                        f"{list(self[name])} in the served model")
        return None


def _recording(weights: Iterator[tuple[str, torch.Tensor]], shapes: CheckpointShapes
               ) -> Iterator[tuple[str, torch.Tensor]]:
    for name, tensor in weights:
        shapes[name] = tuple(tensor.shape)
        yield name, tensor


def load_model(model_path: str, dtype: torch.dtype, device: str, is_embedding: bool = False,
               shapes: CheckpointShapes | None = None,
               shard_only: bool = False) -> tuple[CausalLM, Any]:
    """(model in eval mode, its transformers config) for a Hugging Face folder or a GGUF
    file; `shapes`, when given, receives every checkpoint tensor's shape.

    The model class is picked by `config.architectures` (see models/registry.py);
    `is_embedding` serves a causal LM for embeddings. A pooling model pools as the
    folder's sentence-transformers files say (models/pooler.py). `shard_only` (a TP
    rank): read only the parts of the weights this rank's layers keep.
    """
    from transformers import AutoConfig

    start = time.perf_counter()
    model_dir = resolve_model_dir(model_path)
    config = AutoConfig.from_pretrained(model_dir)
    model_cls = get_model_class(config, is_embedding)
    with torch.device(device):
        model = model_cls(config, dtype)
    if isinstance(model, PoolingModel) and model.num_labels == 0:
        model.pooling = read_pooling_config(model_dir, model.default_pooling)
    weights = iterate_weights(model_dir, lazy=shard_only)
    model.load_weights(weights if shapes is None else _recording(weights, shapes))
    model.eval()
    logger.info(
        "loaded %s (%s, %s) in %.2f s",
        model_dir,
        model_cls.__name__,
        dtype,
        time.perf_counter() - start,
    )
    return model, config
