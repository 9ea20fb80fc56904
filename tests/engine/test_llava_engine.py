"""The Engine on tiny LLaVA-1.5 and LLaVA-NeXT checkpoints, against transformers' `generate`.

Each architecture's folder (tests/multimodal/_tiny_llava_checkpoint.py) is
loaded by radixlm exactly as a real one; transformers runs the same folder
with its own processor (the same pixels, the same expanded prompt) and greedy
`generate` in float32. Outputs are compared token for token.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multimodal"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
from _llava_builders import random_image  # noqa: E402
from _tiny_llava_checkpoint import HFReference, build_checkpoint  # noqa: E402

from radixlm import Engine  # noqa: E402

NUM_NEW = 12
GREEDY = {"temperature": 0.0, "max_new_tokens": NUM_NEW, "ignore_eos": True}
ONE = "USER: <image>\nWhat is in the picture?\nASSISTANT:"
TWO = "USER: <image>\nand <image>\nWhich is larger?\nASSISTANT:"


class Tiny(NamedTuple):
    arch: str
    path: str
    engine: Engine
    ref: HFReference


@pytest.fixture(scope="module", params=["llava", "llava_next"])
def tiny(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tiny]:
    arch = request.param
    path = build_checkpoint(tmp_path_factory.mktemp(arch), arch)
    with Engine(model_path=str(path), max_total_tokens=4096) as engine:
        yield Tiny(arch, str(path), engine, HFReference(path))
        assert engine.get_server_info()["kv_integrity"] == "ok"


def _generate(engine: Engine, text: str, images: list[Image.Image]) -> dict[str, Any]:
    return engine.generate(text, GREEDY, image_data=images or None)


def _check_equal(tiny: Tiny, text: str, images: list[Image.Image],
                 out: dict[str, Any] | None = None) -> dict[str, Any]:
    """radixlm's greedy output for (text, images) equals transformers'; returns ours."""
    out = out or _generate(tiny.engine, text, images)
    ref = tiny.ref.generate(text, images, NUM_NEW)
    assert out["meta_info"]["prompt_tokens"] == len(ref.input_ids)
    assert out["output_ids"] == ref.output_ids
    return out


def test_one_image_equals_transformers(tiny: Tiny) -> None:
    image = random_image(30, 40, seed=11)
    out = _check_equal(tiny, ONE, [image])
    assert len(set(out["output_ids"])) >= 4, out["output_ids"]  # not one token repeated
    # The image matters: another one changes the continuation.
    other = _check_equal(tiny, ONE, [random_image(30, 40, seed=12)])
    assert other["output_ids"] != out["output_ids"]


def test_two_images_of_different_sizes(tiny: Tiny) -> None:
    images = [random_image(20, 60, seed=13), random_image(50, 30, seed=14)]
    runs = tiny.ref.image_runs(TWO, images)
    assert len(runs) == 2
    if tiny.arch == "llava_next":  # a wide and a tall image: different anyres counts
        assert runs[0][1] - runs[0][0] != runs[1][1] - runs[1][0]
    _check_equal(tiny, TWO, images)


def test_same_image_shares_the_cache_and_another_does_not(tiny: Tiny) -> None:
    image, same_size = random_image(40, 40, seed=15), random_image(40, 40, seed=16)
    ((start, end),) = tiny.ref.image_runs(ONE, [image])
    first = _generate(tiny.engine, ONE, [image])
    second = _generate(tiny.engine, ONE, [image])
    assert second["meta_info"]["cached_tokens"] >= end  # the image's tokens came from the cache
    assert second["output_ids"] == first["output_ids"]
    _check_equal(tiny, ONE, [image], second)
    other = _generate(tiny.engine, ONE, [same_size])
    assert other["meta_info"]["cached_tokens"] == start  # "USER: " only: stops at the image
    _check_equal(tiny, ONE, [same_size], other)


def test_chunked_prefill_splits_the_image(tiny: Tiny) -> None:
    chunk = 3
    images = [random_image(30, 50, seed=17), random_image(60, 20, seed=18)]
    runs = tiny.ref.image_runs(TWO, images)
    assert all(end - start > chunk for start, end in runs)  # every image is cut
    with Engine(model_path=tiny.path, max_total_tokens=1024, chunked_prefill_size=chunk,
                disable_radix_cache=True) as engine:
        out = _generate(engine, TWO, images)
        assert engine.get_server_info()["kv_integrity"] == "ok"
    _check_equal(tiny, TWO, images, out)


def test_mixed_batch_equals_single_requests(tiny: Tiny) -> None:
    a, b, c = (random_image(h, w, seed=s) for h, w, s in [(30, 40, 19), (50, 20, 20),
                                                          (40, 60, 21)])
    texts = [ONE, "USER: Hello there.\nASSISTANT:", TWO, "The weather today is"]
    images: list[Any] = [[a], None, [b, c], None]
    outs = tiny.engine.generate(texts, GREEDY, image_data=images)
    assert len(outs) == len(texts)
    for text, imgs, out in zip(texts, images, outs):
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        single = _generate(tiny.engine, text, imgs or [])
        assert out["output_ids"] == single["output_ids"], text
    _check_equal(tiny, texts[2], [b, c], outs[2])
    info = tiny.engine.get_server_info()
    assert info["num_used_tokens"] == 0 and info["kv_integrity"] == "ok"
