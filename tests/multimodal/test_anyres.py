"""Anyres geometry: tile counts equal the image processor's, packed feature rows equal the count."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from radixlm.multimodal import anyres

TILE, SIDE, DIM = 32, 4, 8  # tile pixels, feature grid side, feature width
PINPOINTS = [[32, 64], [64, 32], [64, 64], [32, 96], [96, 32], [96, 96]]
SIZES = [(h, w) for h in (5, 31, 32, 47, 64, 90, 200, 513) for w in (7, 32, 40, 64, 99, 300)]


def test_num_tiles_equals_the_image_processor() -> None:
    from transformers import LlavaNextImageProcessorPil

    processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": TILE},
        crop_size={"height": TILE, "width": TILE},
        image_grid_pinpoints=PINPOINTS,
    )
    rng = np.random.default_rng(0)
    for height, width in SIZES[::3]:
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        pixel_values = processor(image, return_tensors="pt")["pixel_values"]  # [1, n, 3, T, T]
        assert anyres.num_tiles((height, width), PINPOINTS, TILE) == pixel_values.shape[1]


@pytest.mark.parametrize("max_num_tiles", [None, 1, 2, 9])
def test_packed_rows_equal_the_token_count(max_num_tiles: int | None) -> None:
    newline = torch.randn(DIM)
    for size in SIZES:
        num_tiles = anyres.num_tiles(size, PINPOINTS, TILE)
        features = torch.randn(num_tiles, SIDE * SIDE, DIM)
        packed = anyres.pack_tile_features(features, size, PINPOINTS, TILE, newline, max_num_tiles)
        expected = anyres.num_anyres_tokens(size, PINPOINTS, TILE, SIDE, SIDE * SIDE, max_num_tiles)
        assert packed.shape == (expected, DIM), size
        torch.testing.assert_close(packed[: SIDE * SIDE], features[0])  # the base tile first
        if packed.shape[0] > SIDE * SIDE:  # else a sliver: unpadding left no grid rows
            torch.testing.assert_close(packed[-1], newline)  # a newline ends the last row


def test_one_tile_is_the_base_tile_and_a_newline() -> None:
    features, newline = torch.randn(1, SIDE * SIDE, DIM), torch.randn(DIM)
    packed = anyres.pack_tile_features(features, (50, 70), PINPOINTS, TILE, newline)
    torch.testing.assert_close(packed, torch.cat([features[0], newline[None]]))


def test_max_num_tiles_of() -> None:
    assert anyres.max_num_tiles_of("anyres_max_9") == 9
    assert anyres.max_num_tiles_of("anyres") is None
    assert anyres.max_num_tiles_of(None) is None
