"""Loading Hugging Face checkpoints into the fused decoder layers (models/decoder.py).

The model fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj`; a
checkpoint names them apart (Llama, Qwen, Gemma: q_proj, k_proj, ...), fused
(Phi-3: qkv_proj, gate_up_proj), per expert (Qwen3-MoE:
`mlp.experts.{e}.gate_proj`) or as transformers' 3D expert tensors
(`mlp.experts.gate_up_proj` [E, 2I, H], `mlp.experts.down_proj` [E, H, I]).
Every form goes through the layers' own weight loaders, which copy this
tensor-parallel rank's part only.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from radixlm.layers.linear import get_weight_loader

# (fused parameter, Hugging Face projection, shard id)
STACKED_PARAMS: list[tuple[str, str, str | int]] = [
    ("qkv_proj", "q_proj", "q"),
    ("qkv_proj", "k_proj", "k"),
    ("qkv_proj", "v_proj", "v"),
    ("gate_up_proj", "gate_proj", 0),
    ("gate_up_proj", "up_proj", 1),
]
# transformers' in-memory expert tensors: "...mlp.experts.gate_up_proj" (no ".weight")
_EXPERTS_3D = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<proj>gate_up_proj|down_proj)$")


def load_decoder_weights(module: nn.Module, weights: Iterable[tuple[str, Any]],
                         rename: Callable[[str], str | None]) -> None:
    """Copy Hugging Face-named tensors into `module` (see the module docstring).

    `rename` maps a checkpoint name to the module's (None skips the tensor).
    Raises ValueError on a name that matches no parameter, a shape that differs,
    or a parameter the checkpoint lacks.
    """
    params = dict(module.named_parameters())
    loaded: set[str] = set()
    for hf_name, tensor in weights:
        if "rotary_emb.inv_freq" in hf_name:
            continue
        name = rename(hf_name)
        if name is None:
            continue
        loaded.update(_load_one(params, name, tensor))
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:5]}")


def _load_one(params: dict[str, nn.Parameter], name: str, tensor: Any) -> list[str]:
    """Load one checkpoint tensor; returns the parameter names it filled."""
    experts = _EXPERTS_3D.match(name)
    if experts is not None:
        return _load_experts_3d(params, experts.group("prefix"), experts.group("proj"), tensor)
    for fused, hf_proj, shard_id in STACKED_PARAMS:
        if f".{hf_proj}." in name:
            name = name.replace(f".{hf_proj}.", f".{fused}.")
            get_weight_loader(_param(params, name))(params[name], tensor, shard_id)
            return [name]
    param = _param(params, name)
    if ".qkv_proj." in name or ".gate_up_proj." in name:
        _fused_loader(param)(param, tensor)  # a checkpoint with the projections fused
    else:
        get_weight_loader(param)(param, tensor)
    return [name]


def _fused_loader(param: nn.Parameter) -> Callable[[nn.Parameter, Any], None]:
    layer = getattr(getattr(param, "weight_loader", None), "__self__", None)
    loader = getattr(layer, "load_fused_weight", None)
    if loader is None:
        raise ValueError("a fused checkpoint tensor for a layer that is not fused")
    return loader  # type: ignore[no-any-return]


def _load_experts_3d(params: dict[str, nn.Parameter], prefix: str, proj: str,
                     tensor: Any) -> list[str]:
    """[E, out, in] expert tensors, one expert at a time into `{prefix}.{e}.{proj}.weight`."""
    if not isinstance(tensor, torch.Tensor):
        tensor = tensor.materialize()
    names = []
    for e in range(tensor.shape[0]):
        name = f"{prefix}.{e}.{proj}.weight"
        param = _param(params, name)
        if proj == "gate_up_proj":
            _fused_loader(param)(param, tensor[e])
        else:
            get_weight_loader(param)(param, tensor[e])
        names.append(name)
    return names


def _param(params: dict[str, nn.Parameter], name: str) -> nn.Parameter:
    if name not in params:
        raise ValueError(f"checkpoint weight {name!r} matches no parameter of the model")
    return params[name]
