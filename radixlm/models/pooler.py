"""Pooling: one vector per prompt from a model's hidden states.

    last   the final prompt token's hidden state (decoder embedding models:
           gte-Qwen2, e5-mistral; the `*ForSequenceClassification` heads)
    mean   the average over every prompt token (many sentence-transformers)
    cls    the first token's (BERT's [CLS])

How a checkpoint pools comes from its sentence-transformers files when it has
them (`modules.json` naming a `Pooling` module whose folder holds
`config.json` with `pooling_mode_*` flags, and a `Normalize` module for unit
vectors), else from the architecture's default (decoders: last token,
normalized; BERT: CLS, normalized).

NOTE: last-token pooling only needs the final row of a prompt's last chunk, so
those prompts are chunked and share the prefix cache like generation; mean and
CLS pooling need every row of the prompt, so such prompts are computed in one
step from position 0 (`PoolingConfig.needs_whole_prompt`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

import torch

POOLING_METHODS = ("last", "mean", "cls")

# sentence-transformers' Pooling flags → our method names, in its order of preference.
_ST_MODES = (
    ("pooling_mode_lasttoken", "last"),
    ("pooling_mode_cls_token", "cls"),
    ("pooling_mode_mean_tokens", "mean"),
)


@dataclass(frozen=True)
class PoolingConfig:
    method: str  # one of POOLING_METHODS
    normalize: bool  # L2-normalize the (possibly truncated) vector

    @property
    def needs_whole_prompt(self) -> bool:
        return self.method != "last"


def read_pooling_config(model_dir: str, default: PoolingConfig) -> PoolingConfig:
    """The pooling a sentence-transformers folder declares, or `default`.

    Raises ValueError for a Pooling module whose mode radixlm does not implement
    (max, weighted mean, ...): serving it with another method would be wrong.
    """
    modules_path = os.path.join(model_dir, "modules.json")
    if not os.path.isfile(modules_path):
        return default
    with open(modules_path) as f:
        modules = json.load(f)
    method = default.method
    normalize = False
    for module in modules:
        kind = str(module.get("type", ""))
        if kind.endswith("Normalize"):
            normalize = True
        elif kind.endswith("Pooling"):
            method = _st_pooling_method(os.path.join(model_dir, module.get("path", "")))
    return PoolingConfig(method, normalize)


def _st_pooling_method(pooling_dir: str) -> str:
    path = os.path.join(pooling_dir, "config.json")
    with open(path) as f:
        cfg: dict[str, Any] = json.load(f)
    for flag, method in _ST_MODES:
        if cfg.get(flag):
            return method
    mode = cfg.get("pooling_mode")  # newer sentence-transformers write one string
    if mode in ("lasttoken", "cls", "mean"):
        return {"lasttoken": "last", "cls": "cls", "mean": "mean"}[mode]
    on = sorted(k for k, v in cfg.items() if k.startswith("pooling_mode") and v)
    raise ValueError(f"{path}: pooling {on or mode!r} is not supported "
                     f"(supported: last token, CLS, mean)")


def pool(hidden: torch.Tensor, extend_lens: list[int], method: str) -> torch.Tensor:
    """hidden [T, H] flattened request-major, each request's whole prompt (or, for
    `last`, at least its final row) → pooled [B, H] in float32."""
    ends = torch.tensor(extend_lens, device=hidden.device).cumsum(0)  # [B]
    if method == "last":
        return hidden[ends - 1].float()  # [B, H]
    starts = ends - torch.tensor(extend_lens, device=hidden.device)  # [B]
    if method == "cls":
        return hidden[starts].float()  # [B, H]
    assert method == "mean", method
    return torch.stack([seg.float().mean(0) for seg in hidden.split(extend_lens)])  # [B, H]


def finish_vector(vector: torch.Tensor, dimensions: int | None, normalize: bool) -> list[float]:
    """vector [H] → the first `dimensions` values (Matryoshka), then L2-normalized."""
    if dimensions is not None:
        vector = vector[:dimensions]
    if normalize:
        vector = torch.nn.functional.normalize(vector, p=2, dim=-1)
    return [float(x) for x in vector.tolist()]
