"""Anyres geometry of LLaVA-NeXT and LLaVA-OneVision: tiles, unpadding, packing.

An anyres image processor resizes the image (height, width) to the best of
`image_grid_pinpoints` (the one keeping the most pixels, then wasting the
fewest), pads it to that resolution, cuts it into square tiles of the vision
tower's `image_size`, and puts a resized copy of the whole image first (the
base tile). The model encodes every tile, then packs the features:

    base tile's features, then the tiles' features re-assembled into one
    grid, with the padding rows/columns cut away ("unpadding"), optionally
    shrunk (OneVision's `anyres_max_N`: at most about N tiles' worth), and
    one `image_newline` embedding after each row of the grid.

So the number of placeholder tokens depends on the image's size. The
processor counts them with arithmetic (`num_anyres_tokens` mirrors it); the
model gets them from tensor shapes (`pack_tile_features`); the two must
agree, and tests check that they do.

Sizes are (height, width) throughout, like the transformers helpers used here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from transformers.image_processing_utils import select_best_resolution
from transformers.models.llava_next.modeling_llava_next import (
    get_anyres_image_grid_shape,
    image_size_to_num_patches,
    unpad_image,
)

GridPinpoints = Sequence[Sequence[int]]


def num_tiles(image_size: tuple[int, int], grid_pinpoints: GridPinpoints, tile_size: int) -> int:
    """Tiles the processor cuts an image of image_size into, plus one for the base tile."""
    return int(image_size_to_num_patches(list(image_size), _pinpoints(grid_pinpoints), tile_size))


def max_num_tiles_of(vision_aspect_ratio: str | None) -> int | None:
    """OneVision's "anyres_max_9" → 9; plain "anyres" or None → no limit."""
    if not vision_aspect_ratio or not vision_aspect_ratio.startswith("anyres_max_"):
        return None
    return int(vision_aspect_ratio.removeprefix("anyres_max_"))


def pack_tile_features(
    features: torch.Tensor,
    image_size: tuple[int, int],
    grid_pinpoints: GridPinpoints,
    tile_size: int,
    image_newline: torch.Tensor,
    max_num_tiles: int | None = None,
) -> torch.Tensor:
    """Per-tile features [num_tiles, side * side, D] (base tile first) → packed [N, D].

    With one tile (OneVision's several-images mode) it is that tile and one newline.
    """
    base = features[0]  # [side * side, D]
    if features.shape[0] == 1:
        return torch.cat([base, image_newline[None].to(base)])  # [side * side + 1, D]
    side = math.isqrt(base.shape[0])
    if side * side != base.shape[0]:
        raise ValueError(f"a tile has {base.shape[0]} features, not a square grid")
    grid_h, grid_w = get_anyres_image_grid_shape(
        list(image_size), _pinpoints(grid_pinpoints), tile_size
    )
    dim = features.shape[-1]
    grid = features[1:].view(grid_h, grid_w, side, side, dim)  # [gh, gw, side, side, D]
    grid = grid.permute(4, 0, 2, 1, 3).flatten(1, 2).flatten(2, 3)  # [D, gh * side, gw * side]
    grid = unpad_image(grid, list(image_size))  # [D, H, W]
    if max_num_tiles is not None:
        height, width = grid.shape[1:]
        ratio = math.sqrt(height * width / (max_num_tiles * side**2))
        if ratio > 1.1:
            new_size = [int(height // ratio), int(width // ratio)]
            grid = F.interpolate(grid[None], new_size, mode="bilinear")[0]  # [D, H', W']
    newline = image_newline[:, None, None].to(grid).expand(dim, grid.shape[1], 1)  # [D, H, 1]
    grid = torch.cat([grid, newline], dim=-1)  # [D, H, W + 1]
    return torch.cat([base, grid.flatten(1, 2).transpose(0, 1)])  # [side * side + H * (W + 1), D]


def num_anyres_tokens(
    image_size: tuple[int, int],
    grid_pinpoints: GridPinpoints,
    tile_size: int,
    tokens_per_side: int,
    tokens_per_tile: int,
    max_num_tiles: int | None = None,
) -> int:
    """Placeholder tokens of one anyres image, computed as transformers' processors do.

    tokens_per_side: feature grid side of one tile (image_size // patch_size);
    tokens_per_tile: the base tile's feature rows (side², +1 for a kept CLS).
    """
    height, width = image_size
    best_h, best_w = select_best_resolution((height, width), _pinpoints(grid_pinpoints))
    cur_h = tokens_per_side * (best_h // tile_size)
    cur_w = tokens_per_side * (best_w // tile_size)
    if width / height > cur_w / cur_h:
        new_h = int(round(height * (cur_w / width), 7))
        cur_h -= (cur_h - new_h) // 2 * 2
    else:
        new_w = int(round(width * (cur_h / height), 7))
        cur_w -= (cur_w - new_w) // 2 * 2
    num_unpadded, num_newlines = cur_h * cur_w, cur_h
    if max_num_tiles is not None:
        ratio = math.sqrt(cur_h * cur_w / (max_num_tiles * tokens_per_side**2))
        if ratio > 1.1:
            num_unpadded = int(cur_h // ratio) * int(cur_w // ratio)
            num_newlines = int(cur_h // ratio)
    return tokens_per_tile + num_unpadded + num_newlines


def _pinpoints(grid_pinpoints: GridPinpoints) -> list[list[int]]:
    # NOTE: transformers' helpers insist on a list (a tuple from a frozen config fails).
    return [list(p) for p in grid_pinpoints]
