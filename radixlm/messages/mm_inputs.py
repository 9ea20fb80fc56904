"""Multimodal inputs as they travel from the TokenizerManager to the model.

The pipeline is "preprocess first, placeholders in the middle, features last":

1. The TokenizerManager loads each image (or video frame set), runs the
   model's image processor (resize, anyres tiling, normalize) and tokenizes
   the prompt with every image placeholder expanded to the number of tokens
   that image will have (which depends on its resolution for anyres).
2. Each run of placeholder tokens is replaced by the item's `pad_value`, a
   pseudo token id derived from a hash of the item's pixels, always
   >= the vocabulary size. The scheduler and the radix cache see only token
   ids: the same image twice gives the same ids (its prefix is shared), two
   different images never do.
3. The model runner hands each request's `MultimodalInputs` to the model with
   the step's extend range; a multimodal model computes (or takes from its
   feature cache, keyed by `hash`) the item's features and writes the rows
   that fall inside this step's extend into the input embeddings, also when a
   chunked prefill cuts an item in two.

Contract: `input_ids[offset : offset + num_tokens] == [pad_value] * num_tokens`
for every item; items do not overlap and are sorted by offset.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

# NOTE: no torch import at run time: io_struct imports this module, and the
# detokenizer process would otherwise pay seconds of start-up for torch.

# Pad values live above the vocabulary: vocab_size + (hash mod PAD_VALUE_RANGE).
PAD_VALUE_RANGE = 1 << 30


@dataclass
class MultimodalItem:
    modality: str  # "image" | "video"
    hash: int  # content hash of the processed pixels (64-bit)
    pad_value: int  # the pseudo token id repeated over this item's placeholder tokens
    offset: int  # index in the prompt's input_ids of the item's first token
    num_tokens: int  # number of placeholder tokens (== rows of its features)
    # Processor output, on the CPU: e.g. [3, H, W] (LLaVA-1.5), [num_tiles, 3, H, W]
    # (anyres), [num_frames, 3, H, W] (video).
    pixel_values: torch.Tensor
    image_size: tuple[int, int] | None = None  # (height, width) before processing (anyres)
    extra: dict[str, Any] = field(default_factory=dict)  # model-specific processor outputs

    @property
    def end(self) -> int:
        return self.offset + self.num_tokens


@dataclass
class MultimodalInputs:
    """All multimodal items of one request (one prompt)."""

    items: list[MultimodalItem]

    def overlapping(self, start: int, end: int) -> list[MultimodalItem]:
        """Items with at least one token in positions [start, end)."""
        return [it for it in self.items if it.offset < end and it.end > start]


def pad_value_for(content_hash: int, vocab_size: int) -> int:
    return vocab_size + content_hash % PAD_VALUE_RANGE


def hash_tensor(t: torch.Tensor) -> int:
    """A 64-bit content hash of a tensor's bytes (dtype and shape included)."""
    import hashlib

    import torch

    data = t.detach().cpu().contiguous()
    h = hashlib.blake2b(digest_size=8)
    h.update(str((data.dtype, tuple(data.shape))).encode())
    h.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return int.from_bytes(h.digest(), "little")
