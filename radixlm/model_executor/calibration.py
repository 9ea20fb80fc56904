"""Calibration for W8A8 int8: one float forward over a built-in text, then SmoothQuant.

`smooth_for_int8` runs at load, before `prepare_model` quantizes: it tokenizes
radixlm/layers/data/calibration_text.txt (chat turns, prose, code and
arithmetic; 714 tokens for SmolLM2, and not the accuracy gate's text, which stays a
held-out measurement), runs the still-float model over it through a small KV
pool of its own, records each smoothable projection's per-input-channel
max |x|, and folds the SmoothQuant scales into the weights
(layers/smoothquant.py). Deterministic (a fixed text, no sampling) and, for
the default model, about 2 s at load.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from torch import nn

from radixlm.layers.attention import create_attention_backend
from radixlm.layers.smoothquant import (
    DEFAULT_ALPHA,
    apply_smoothing,
    lm_head_of,
    smooth_targets,
    smoothing_scales,
)
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.model_executor.forward_batch import ForwardBatch
from radixlm.model_loader.model_path import resolve_model_dir
from radixlm.models.base import CausalLM

logger = logging.getLogger(__name__)

CALIBRATION_TEXT = os.path.join(os.path.dirname(__file__), "..", "layers", "data",
                                "calibration_text.txt")
_CHUNK = 256  # tokens per calibration step, so later chunks attend over a cached prefix


class SmoothingReport(NamedTuple):
    num_smoothed: int  # projections whose scales were folded (LM head included)
    num_tokens: int
    seconds: float


def calibration_ids(model_dir: str) -> list[int]:
    """The calibration text in the model's tokens (the `tokenizers` file when there is one)."""
    with open(CALIBRATION_TEXT) as f:
        text = f.read()
    path = os.path.join(model_dir, "tokenizer.json")
    if os.path.isfile(path):
        from tokenizers import Tokenizer

        return list(Tokenizer.from_file(path).encode(text).ids)
    from radixlm.tokenizer_utils import load_tokenizer

    return list(load_tokenizer(model_dir).encode(text))


@torch.no_grad()
def input_absmax(model: CausalLM, config: Any, ids: list[int],
                 modules: Mapping[str, nn.Module]) -> dict[str, torch.Tensor]:
    """Per-input-channel max |x| [K] of each module's input over a forward of `ids`
    (the LM head's under the name "lm_head": its input is what compute_logits gets)."""
    absmax: dict[str, torch.Tensor] = {}

    def record(name: str, x: torch.Tensor) -> None:
        m = x.detach().abs().reshape(-1, x.shape[-1]).amax(dim=0).float()  # [K]
        absmax[name] = torch.maximum(absmax[name], m) if name in absmax else m

    hooks = [module.register_forward_pre_hook(lambda _m, args, n=name: record(n, args[0]))
             for name, module in modules.items() if name != "lm_head"]
    try:
        hidden = _forward(model, config, ids)  # [T, hidden]
    finally:
        for hook in hooks:
            hook.remove()
    if "lm_head" in modules:
        record("lm_head", hidden)
    return absmax


def _forward(model: CausalLM, config: Any, ids: list[int]) -> torch.Tensor:
    """Final hidden states [len(ids), hidden] of one request, chunk by chunk, CPU."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    num_kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dtype = next(model.parameters()).dtype
    kv = TokenToKVPool(len(ids) + 1, config.num_hidden_layers, num_kv_heads, head_dim, dtype,
                       "cpu")
    rows = ReqToTokenPool(1, len(ids) + 1, "cpu")
    row = rows.alloc()
    assert row is not None
    backend = create_attention_backend("torch_native", model)
    parts = []
    for start in range(0, len(ids), _CHUNK):
        chunk = ids[start : start + _CHUNK]
        slots = kv.alloc(len(chunk))
        assert slots is not None
        rows.req_to_token[row, start : start + len(chunk)] = slots
        batch = ForwardBatch(
            input_ids=torch.tensor(chunk), positions=torch.arange(start, start + len(chunk)),
            out_cache_loc=slots, req_pool_indices=torch.tensor([row]),
            req_to_token=rows.req_to_token, token_to_kv_pool=kv, prefix_lens=[start],
            extend_lens=[len(chunk)], attn_backend=backend)
        backend.init_forward_metadata(batch)
        parts.append(model(batch.input_ids, batch.positions, batch))  # [chunk, hidden]
    return torch.cat(parts)


def smooth_for_int8(model: CausalLM, config: Any, model_dir: str,
                    alpha: float = DEFAULT_ALPHA) -> SmoothingReport:
    """Fold SmoothQuant scales into a loaded float model before it is quantized to int8.

    Modifies RMSNorm weights, projection weights (see layers/smoothquant.py) and
    sets the LM head's `int8_smoothing`; a model without the Llama layout is left as is.
    """
    start = time.perf_counter()
    targets = smooth_targets(model)
    head = lm_head_of(model)
    modules: dict[str, nn.Module] = {t.name: t.linear for t in targets}
    if head is not None:
        modules["lm_head"] = head
    if not modules:
        return SmoothingReport(0, 0, 0.0)
    ids = calibration_ids(resolve_model_dir(model_dir))
    absmax = input_absmax(model, config, ids, modules)
    apply_smoothing(targets, absmax, alpha)
    if head is not None:
        head.int8_smoothing = smoothing_scales(absmax["lm_head"], head.weight, alpha)
    report = SmoothingReport(len(modules), len(ids), time.perf_counter() - start)
    logger.info("SmoothQuant (alpha %.2f) over %d calibration tokens: %d projections in %.2f s",
                alpha, report.num_tokens, report.num_smoothed, report.seconds)
    return report
