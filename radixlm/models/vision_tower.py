"""The vision side of LLaVA-family models: a CLIP or SigLIP ViT and the projector.

The ViT is transformers' own vision model (`AutoModel.from_config(vision_config)`),
cut after the deepest layer the model reads: LLaVA takes the hidden states of
`vision_feature_layer` (-2 for LLaVA-1.5: the last layer is never used), so
that layer, the final layer norm and SigLIP's pooling head are not built, and
their checkpoint weights are skipped.

`vision_feature_select_strategy`: "default" drops the first token of each
tile (CLIP's CLS), "full" keeps every token.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

# Checkpoint names of the parts VisionTower does not build.
_UNUSED = re.compile(r"^(post_layernorm|head)\.")
_LAYER = re.compile(r"^encoder\.layers\.(\d+)\.")


class VisionTower(nn.Module):
    """pixel_values [N, 3, S, S] → selected hidden states [N, P, D * num_layers]: P is
    side² (+1 for CLIP's CLS with the "full" strategy), side = image_size // patch_size."""

    def __init__(
        self,
        vision_config: Any,
        feature_layer: int | list[int],
        select_strategy: str,
        dtype: torch.dtype,
    ) -> None:
        super().__init__()
        from transformers import AutoModel
        from transformers.initialization import no_init_weights

        if select_strategy not in ("default", "full"):
            raise ValueError(f"unknown vision_feature_select_strategy {select_strategy!r}")
        num_layers = int(vision_config.num_hidden_layers)
        layers = [feature_layer] if isinstance(feature_layer, int) else list(feature_layer)
        # Index into hidden_states (embeddings, then one entry per layer), made non-negative.
        self.layer_indices = [i if i >= 0 else num_layers + 1 + i for i in layers]
        self.num_kept_layers = max(max(self.layer_indices), 1)
        config = copy.deepcopy(vision_config)
        config.num_hidden_layers = self.num_kept_layers
        if hasattr(config, "vision_use_head"):
            config.vision_use_head = False  # SigLIP's pooling head: LLaVA never uses it
        with no_init_weights():
            self.model = AutoModel.from_config(config, attn_implementation="sdpa", dtype=dtype)
        self.model.requires_grad_(False)
        inner = getattr(self.model, "vision_model", self.model)  # transformers < 5 nests it
        # last_hidden_state is then the last kept layer's output, as hidden_states[-1] is.
        inner.post_layernorm = nn.Identity()
        self.drop_cls = select_strategy == "default"
        self.feature_dim = int(vision_config.hidden_size) * len(layers)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        pixel_values = pixel_values.to(next(self.model.parameters()).dtype)  # [N, 3, S, S]
        if self.layer_indices == [self.num_kept_layers]:
            hidden = self.model(pixel_values).last_hidden_state  # [N, 1? + side * side, D]
        else:
            states = self.model(pixel_values, output_hidden_states=True).hidden_states
            hidden = torch.cat([states[i] for i in self.layer_indices], dim=-1)  # [N, P, D * L]
        return hidden[:, 1:] if self.drop_cls else hidden  # [N, tokens_per_tile, D * L]

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy tensors named as in transformers' vision model, with or without its
        "vision_model." prefix; those of unbuilt parts are skipped. Raises on an
        unknown name or a missing weight."""
        params = dict(self.model.named_parameters())
        nested = next(iter(params)).startswith("vision_model.")  # older transformers
        loaded: set[str] = set()
        for name, tensor in weights:
            name = name.removeprefix("vision_model.")
            layer = _LAYER.match(name)
            if _UNUSED.match(name) or (layer and int(layer.group(1)) >= self.num_kept_layers):
                continue
            key = f"vision_model.{name}" if nested else name
            if key not in params:
                raise ValueError(f"checkpoint weight vision_tower.{name} matches no parameter")
            with torch.no_grad():
                params[key].copy_(tensor)
            loaded.add(key)
        missing = sorted(set(params) - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} vision weights, e.g. {missing[:5]}")


class MultiModalProjector(nn.Module):
    """Vision features [.., D_vision * L] → language embeddings [.., hidden].

    transformers' LLaVA projector is the 2-layer MLP linear_1 → act → linear_2;
    original LLaVA checkpoints with `mm_projector_type: "linear"` have linear_1 only.
    """

    def __init__(self, config: Any, in_features: int, dtype: torch.dtype) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        hidden = int(config.text_config.hidden_size)
        bias = bool(getattr(config, "multimodal_projector_bias", True))
        self.linear_1 = nn.Linear(in_features, hidden, bias=bias, dtype=dtype)
        self.linear_2: nn.Linear | None = None
        if getattr(config, "mm_projector_type", "mlp2x_gelu") != "linear":
            self.act = ACT2FN[getattr(config, "projector_hidden_act", "gelu")]
            self.linear_2 = nn.Linear(hidden, hidden, bias=bias, dtype=dtype)
        self.requires_grad_(False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        hidden = self.linear_1(features)  # [.., hidden]
        if self.linear_2 is None:
            return hidden
        return self.linear_2(self.act(hidden))  # [.., hidden]
