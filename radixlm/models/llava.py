"""LLaVA-family vision-language models: LLaVA-1.5, LLaVA-NeXT (anyres), LLaVA-OneVision.

Each composes a vision tower (transformers' CLIP or SigLIP ViT), the
multimodal projector, and a language model from the registry built from
`config.text_config` (Llama, Mistral, Qwen2, ...). The model sees one flat
batch of tokens; image placeholders carry pad ids >= vocab_size (see
messages/mm_inputs.py). `forward`:

1. embeds the tokens, pad ids replaced by 0 (never looked up);
2. for each request with multimodal items and each item overlapping the
   positions this step extends, takes the item's features [num_tokens, hidden]
   (from the feature cache keyed by the item's hash, or by running the tower)
   and writes the overlapping rows over the placeholder embeddings, so a
   chunked prefill that cuts an image in two writes each half in its step;
3. runs the language model on those embeddings.

A step without multimodal items goes straight to the language model.

Features per item, as transformers computes them:
- LLaVA-1.5: one tile → tower → projector.
- LLaVA-NeXT: every anyres tile → tower → projector → packed (multimodal/anyres.py).
- OneVision: as NeXT with `anyres_max_N` shrinking; a prompt with several
  images encodes each image's base tile only (+ one newline); a video's frames
  are pooled 2x2 (bilinear), then one newline follows the last frame.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from radixlm.messages.mm_inputs import MultimodalItem
from radixlm.model_executor.forward_batch import ForwardBatch
from radixlm.models.base import CausalLM
from radixlm.models.registry import get_model_class
from radixlm.models.vision_tower import MultiModalProjector, VisionTower
from radixlm.multimodal import anyres
from radixlm.multimodal.feature_cache import FeatureCache


@dataclass(frozen=True)
class VisionSpec:
    """What the pipeline needs to know about a vision model, from its config alone.

    The counts equal those of transformers' processor for the architecture.
    """

    image_token_id: int  # the placeholder the chat template / prompt carries
    video_token_id: int | None  # None: the model takes no video
    tile_size: int  # pixels per side of one tile (vision_config.image_size)
    tokens_per_side: int  # feature grid side of one tile (image_size // patch_size)
    tokens_per_tile: int  # feature rows of one tile (side², +1 for a kept CLS)
    grid_pinpoints: tuple[tuple[int, int], ...] | None = None  # None: one fixed tile
    max_num_tiles: int | None = None  # OneVision's anyres_max_N
    base_tile_when_several: bool = False  # OneVision: several images → base tile only

    def num_image_tokens(self, image_size: tuple[int, int], num_images: int = 1) -> int:
        """Placeholder tokens of an image of image_size (height, width) in a prompt
        holding num_images images."""
        if self.grid_pinpoints is None:
            return self.tokens_per_tile
        if self.base_tile_when_several and num_images > 1:
            return self.tokens_per_tile + 1  # + image_newline
        return anyres.num_anyres_tokens(
            image_size,
            self.grid_pinpoints,
            self.tile_size,
            self.tokens_per_side,
            self.tokens_per_tile,
            self.max_num_tiles,
        )

    def num_video_tokens(self, num_frames: int) -> int:
        """Placeholder tokens of a video of num_frames frames (each pooled 2x2, + one newline)."""
        if self.video_token_id is None:
            raise ValueError("this model takes no video input")
        return num_frames * math.ceil(self.tokens_per_side / 2) ** 2 + 1


def _token_id(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return None


def _language_model_class(text_config: Any) -> type[CausalLM]:
    """The registry's class for text_config (by its architectures, else its model_type)."""
    architectures = list(getattr(text_config, "architectures", None) or [])
    if not architectures:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

        arch = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(getattr(text_config, "model_type", ""))
        architectures = [arch] if arch else []
    return get_model_class(SimpleNamespace(architectures=architectures))


def _canonical_name(name: str) -> str:
    """Checkpoint names of every transformers version → "language_model.model.*",
    "language_model.lm_head.*", "vision_tower.*", "multi_modal_projector.*", "image_newline"."""
    if name.startswith("model.language_model."):
        return "language_model.model." + name.removeprefix("model.language_model.")
    if name.startswith("lm_head."):
        return "language_model." + name
    return name.removeprefix("model.")


class LlavaForConditionalGeneration(CausalLM):
    """LLaVA-1.5: one fixed-size image through a CLIP (or SigLIP) ViT and the projector."""

    has_vision: ClassVar[bool] = True
    uses_image_newline: ClassVar[bool] = False

    def __init__(self, config: Any, dtype: torch.dtype | None = None) -> None:
        super().__init__(config, dtype)
        dtype = dtype or torch.get_default_dtype()
        text_config = copy.deepcopy(config.text_config)
        # NOTE: transformers ties the head to the embedding by the top-level flag only.
        text_config.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        self.language_model = _language_model_class(text_config)(text_config, dtype)
        self.vocab_size = int(text_config.vocab_size)
        self.vision_tower = VisionTower(
            config.vision_config,
            config.vision_feature_layer,
            getattr(config, "vision_feature_select_strategy", "default"),
            dtype,
        )
        self.multi_modal_projector = MultiModalProjector(
            config, self.vision_tower.feature_dim, dtype
        )
        if self.uses_image_newline:
            hidden = int(text_config.hidden_size)
            self.image_newline = nn.Parameter(torch.empty(hidden, dtype=dtype), requires_grad=False)
        self.vision_spec = self.get_vision_spec(config)
        self.feature_cache = FeatureCache()

    @classmethod
    def get_vision_spec(cls, config: Any) -> VisionSpec:
        """Placeholder ids and token counts, from the config (no weights needed)."""
        vision = config.vision_config
        tokens_per_side = int(vision.image_size) // int(vision.patch_size)
        has_cls = getattr(vision, "model_type", "") == "clip_vision_model"
        drop_cls = getattr(config, "vision_feature_select_strategy", "default") == "default"
        image_token_id = _token_id(config, "image_token_id", "image_token_index")
        if image_token_id is None:
            raise ValueError("the config has no image_token_id / image_token_index")
        return VisionSpec(
            image_token_id=image_token_id,
            video_token_id=None,
            tile_size=int(vision.image_size),
            tokens_per_side=tokens_per_side,
            tokens_per_tile=tokens_per_side**2 + int(has_cls) - int(drop_cls),
        )

    # ------------------------------------------------------------------ forward

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch: ForwardBatch,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions [T] → hidden states [T, hidden]; writes the features of
        the multimodal items this step extends over their placeholder embeddings."""
        if input_embeds is None and any(forward_batch.mm_inputs or ()):
            input_embeds = self._embed_with_features(input_ids, forward_batch)
        return self.language_model(input_ids, positions, forward_batch, input_embeds)

    def _embed_with_features(self, input_ids: torch.Tensor, batch: ForwardBatch) -> torch.Tensor:
        text_ids = input_ids.masked_fill(input_ids >= self.vocab_size, 0)  # [T]
        embeds = self.language_model.embed_input_ids(text_ids)  # [T, hidden]
        assert batch.mm_inputs is not None
        for mm, row0, start, num in zip(
            batch.mm_inputs, batch.extend_start_loc, batch.prefix_lens, batch.extend_lens
        ):
            if mm is None:
                continue
            end = start + num  # this step extends positions [start, end)
            for item in mm.overlapping(start, end):
                lo, hi = max(item.offset, start), min(item.end, end)
                rows = self.item_features(item)[lo - item.offset : hi - item.offset]
                embeds[row0 + lo - start : row0 + hi - start] = rows.to(embeds.dtype)
        return embeds

    def item_features(self, item: MultimodalItem) -> torch.Tensor:
        """The item's features [num_tokens, hidden], from the cache or the vision tower.

        Raises ValueError when the features do not have item.num_tokens rows.
        """
        key = (item.hash, item.num_tokens)
        features = self.feature_cache.get(key)
        if features is None:
            device = self.multi_modal_projector.linear_1.weight.device
            if item.modality == "video":
                features = self.video_features(item, device)
            else:
                features = self.image_features(item, device)
            if features.shape[0] != item.num_tokens:
                raise ValueError(
                    f"{item.modality} at offset {item.offset} has {item.num_tokens} "
                    f"placeholder tokens but {features.shape[0]} feature rows "
                    f"(image_size={item.image_size}, pixel_values {tuple(item.pixel_values.shape)})"
                )
            self.feature_cache.put(key, features)
        return features

    def encode_tiles(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values [N, 3, S, S] → projected features [N, tokens_per_tile, hidden]."""
        return self.multi_modal_projector(self.vision_tower(pixel_values))

    def image_features(self, item: MultimodalItem, device: torch.device) -> torch.Tensor:
        pixel_values = item.pixel_values.reshape(-1, *item.pixel_values.shape[-3:])  # [1, 3, S, S]
        return self.encode_tiles(pixel_values[:1].to(device))[0]  # [tokens_per_tile, hidden]

    def video_features(self, item: MultimodalItem, device: torch.device) -> torch.Tensor:
        raise ValueError(f"{type(self).__name__} takes no video input")

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [M, hidden] → float32 logits [M, vocab_size]."""
        return self.language_model.compute_logits(hidden)

    def set_context_length(self, context_len: int) -> None:
        self.language_model.set_context_length(context_len)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] (each < vocab_size) → token embeddings [T, hidden]."""
        return self.language_model.embed_input_ids(input_ids)

    # ------------------------------------------------------------------ weights

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load a LLaVA checkpoint saved by any transformers version (names such as
        "language_model.model.*" or "model.language_model.*"); raises on an unknown
        name or a missing weight."""
        vision: list[tuple[str, torch.Tensor]] = []  # the tower is small: loaded after
        own = {  # the projector and image_newline
            n: p
            for n, p in self.named_parameters()
            if not n.startswith(("language_model.", "vision_tower."))
        }
        loaded: set[str] = set()

        def language_weights() -> Iterator[tuple[str, torch.Tensor]]:
            for raw_name, tensor in weights:
                name = _canonical_name(raw_name)
                if name.startswith("language_model."):
                    yield name.removeprefix("language_model."), tensor
                elif name.startswith("vision_tower."):
                    vision.append((name.removeprefix("vision_tower."), tensor))
                elif name in own:
                    with torch.no_grad():
                        own[name].copy_(tensor)
                    loaded.add(name)
                else:
                    raise ValueError(f"checkpoint weight {raw_name!r} matches no parameter")

        self.language_model.load_weights(language_weights())
        self.vision_tower.load_weights(vision)
        missing = sorted(set(own) - loaded)
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} weights, e.g. {missing[:5]}")


class LlavaNextForConditionalGeneration(LlavaForConditionalGeneration):
    """LLaVA-NeXT: anyres tiles plus the base image, unpadded, one newline per row."""

    uses_image_newline: ClassVar[bool] = True

    @classmethod
    def get_vision_spec(cls, config: Any) -> VisionSpec:
        pinpoints = tuple((int(h), int(w)) for h, w in config.image_grid_pinpoints)
        return replace(super().get_vision_spec(config), grid_pinpoints=pinpoints)

    def image_features(self, item: MultimodalItem, device: torch.device) -> torch.Tensor:
        spec = self.vision_spec
        image_size = _image_size(item)
        assert spec.grid_pinpoints is not None
        num_tiles = anyres.num_tiles(image_size, spec.grid_pinpoints, spec.tile_size)
        if self._base_tile_only(item):
            num_tiles = 1
        # NOTE: a batched processor pads pixel_values to the most tiles of its batch.
        tiles = item.pixel_values[:num_tiles].to(device)  # [num_tiles, 3, S, S]
        features = self.encode_tiles(tiles)  # [num_tiles, tokens_per_tile, hidden]
        return anyres.pack_tile_features(
            features,
            image_size,
            spec.grid_pinpoints,
            spec.tile_size,
            self.image_newline,
            spec.max_num_tiles,
        )  # [num_tokens, hidden]

    def _base_tile_only(self, item: MultimodalItem) -> bool:
        return False


class LlavaOnevisionForConditionalGeneration(LlavaNextForConditionalGeneration):
    """LLaVA-OneVision: SigLIP + Qwen2; anyres_max_N; several images; video frames."""

    @classmethod
    def get_vision_spec(cls, config: Any) -> VisionSpec:
        return replace(
            super().get_vision_spec(config),
            video_token_id=_token_id(config, "video_token_id", "video_token_index"),
            max_num_tiles=anyres.max_num_tiles_of(getattr(config, "vision_aspect_ratio", None)),
            base_tile_when_several=True,
        )

    def _base_tile_only(self, item: MultimodalItem) -> bool:
        # NOTE: with several images in the prompt the processor gives each image
        # tokens_per_tile + 1 tokens; alone, an image gets the base tile plus a packed
        # grid of either no tokens (a sliver of an image) or at least two (a row and
        # its newline), so the count tells the mode.
        return item.num_tokens == self.vision_spec.tokens_per_tile + 1

    def video_features(self, item: MultimodalItem, device: torch.device) -> torch.Tensor:
        side = self.vision_spec.tokens_per_side
        frames = item.pixel_values.reshape(-1, *item.pixel_values.shape[-3:]).to(device)
        features = self.encode_tiles(frames)  # [F, side * side, hidden]
        num_frames, _, hidden = features.shape
        grid = features.view(num_frames, side, side, hidden).permute(0, 3, 1, 2)  # [F, h, s, s]
        pooled_side = math.ceil(side / 2)  # p
        grid = F.interpolate(grid, size=[pooled_side, pooled_side], mode="bilinear")  # [F, h, p, p]
        pooled = grid.permute(0, 2, 3, 1).reshape(-1, hidden)  # [F * p * p, hidden]
        return torch.cat([pooled, self.image_newline[None].to(pooled)])  # [F * p * p + 1, hidden]


def _image_size(item: MultimodalItem) -> tuple[int, int]:
    if item.image_size is None:
        raise ValueError(f"image at offset {item.offset} lacks image_size (needed for anyres)")
    return (int(item.image_size[0]), int(item.image_size[1]))
