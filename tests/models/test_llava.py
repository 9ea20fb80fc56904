"""LLaVA-1.5, LLaVA-NeXT and LLaVA-OneVision logits equal transformers' with images and video.

Tiny random checkpoints are saved by transformers and loaded by radixlm's
loader; prompts are expanded by transformers' processors. Every comparison is
within 1e-4 (float32), through the real KV pool (tests/models/_forward_harness.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _forward_harness import PoolRunner
from _llava_builders import (
    ARCHS,
    IMAGE_TOKEN_ID,
    PINPOINTS,
    TILE,
    VIDEO_TOKEN_ID,
    Prompt,
    build_hf_llava,
    build_processor,
    hf_llava_logits,
    make_prompt,
    random_frames,
    random_image,
)

from radixlm.model_loader.loader import load_model
from radixlm.models.llava import LlavaForConditionalGeneration
from radixlm.models.registry import get_model_class
from radixlm.models.vision_tower import MultiModalProjector
from radixlm.multimodal import anyres

ATOL = RTOL = 1e-4


@pytest.fixture(scope="module", params=sorted(ARCHS))
def models(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    arch = request.param
    hf = build_hf_llava(arch)
    path = tmp_path_factory.mktemp(arch)
    hf.save_pretrained(path)
    ours, config = load_model(str(path), torch.float32, "cpu")
    return arch, hf, ours, config


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual, expected, atol=ATOL, rtol=RTOL)


def _prefill(ours, config, prompt: Prompt, chunks: list[int] | None = None) -> torch.Tensor:
    """Our logits for the whole prompt, prefilled in chunks ending at the given positions."""
    runner = PoolRunner(ours, config.text_config)
    row = runner.new_request()
    bounds = [0, *(chunks or []), len(prompt.ids)]
    out = [
        runner.step([(row, prompt.ids[a:b])], [prompt.mm])[0] for a, b in zip(bounds, bounds[1:])
    ]
    return torch.cat(out)


def _count_tower_calls(model: LlavaForConditionalGeneration) -> list[int]:
    calls = [0]
    forward = model.vision_tower.forward

    def counted(pixel_values: torch.Tensor) -> torch.Tensor:
        calls[0] += 1
        return forward(pixel_values)

    model.vision_tower.forward = counted  # type: ignore[method-assign]
    return calls


def test_one_image(models) -> None:
    arch, hf, ours, config = models
    prompt = make_prompt(arch, "w5 w17 <image> w3 w9 w11", [random_image(45, 70, seed=1)])
    (item,) = prompt.mm.items
    assert item.num_tokens == ours.vision_spec.num_image_tokens(item.image_size or (TILE, TILE))
    logits = _prefill(ours, config, prompt)
    expected = hf_llava_logits(hf, prompt)
    _close(logits, expected)
    # The image matters: another image changes the logits after it.
    other = make_prompt(arch, "w5 w17 <image> w3 w9 w11", [random_image(45, 70, seed=2)])
    assert (hf_llava_logits(hf, other)[-1] - expected[-1]).abs().max() > 1e-2


def test_two_images_of_different_sizes(models) -> None:
    arch, hf, ours, config = models
    images = [random_image(40, 100, seed=3), random_image(30, 60, seed=4)]
    prompt = make_prompt(arch, "w1 <image> w2 w3 <image> w4", images)
    first, second = prompt.mm.items
    if arch == "llava_next":
        # 1x3 tiles + base for the wide image, 1x2 + base for the other (its
        # pixel_values padded to 4 tiles by the processor).
        sizes = [it.image_size for it in (first, second)]
        assert [anyres.num_tiles(s, PINPOINTS, TILE) for s in sizes] == [4, 3]
        assert first.num_tokens != second.num_tokens
    _close(_prefill(ours, config, prompt), hf_llava_logits(hf, prompt))


def test_chunked_prefill_splits_the_image(models) -> None:
    """Chunks end inside the image; the tower runs once, the second half comes from the cache."""
    arch, hf, ours, config = models
    prompt = make_prompt(arch, "w5 <image> w3 w9", [random_image(50, 80, seed=5)])
    (item,) = prompt.mm.items
    calls = _count_tower_calls(ours)
    cut = [item.offset + 1, item.offset + item.num_tokens // 2, item.end + 1]
    _close(_prefill(ours, config, prompt, chunks=cut), hf_llava_logits(hf, prompt))
    assert calls[0] == 1


def test_feature_cache_reuses_the_same_image(models) -> None:
    arch, hf, ours, config = models
    image = random_image(60, 60, seed=6)
    calls = _count_tower_calls(ours)
    first = make_prompt(arch, "w7 <image> w8", [image])
    second = make_prompt(arch, "w9 w10 w11 <image> w12 w13", [image])
    assert first.mm.items[0].hash == second.mm.items[0].hash
    _prefill(ours, config, first)
    hits = ours.feature_cache.num_hits
    _close(_prefill(ours, config, second), hf_llava_logits(hf, second))
    assert calls[0] == 1 and ours.feature_cache.num_hits == hits + 1


def test_mixed_batch_and_decode(models) -> None:
    """A text-only prompt and an image prompt in one step (the image rows not first), then decodes."""
    arch, hf, ours, config = models
    text = make_prompt(arch, "w1 w2 w3 w4 w5 w6")
    image = make_prompt(arch, "w9 <image> w4 w4 w2", [random_image(70, 40, seed=7)])
    runner = PoolRunner(ours, config.text_config)
    rows = [runner.new_request(), runner.new_request()]
    out = runner.step([(rows[0], text.ids[:-1]), (rows[1], image.ids[:-1])], [None, image.mm])
    _close(out[0], hf_llava_logits(hf, text)[:-1])
    _close(out[1], hf_llava_logits(hf, image)[:-1])
    out = runner.step([(rows[1], image.ids[-1:]), (rows[0], text.ids[-1:])], [image.mm, None])
    _close(out[0], hf_llava_logits(hf, image)[-1:])
    _close(out[1], hf_llava_logits(hf, text)[-1:])


def test_wrong_token_count_is_a_clear_error(models) -> None:
    arch, _, ours, config = models
    prompt = make_prompt(arch, "w5 <image> w3", [random_image(33, 77, seed=8)])
    item = prompt.mm.items[0]
    item.num_tokens -= 1
    ids = prompt.ids[: item.end] + prompt.ids[item.end + 1 :]
    item.hash ^= 1  # not a cache hit
    with pytest.raises(ValueError, match="placeholder tokens but"):
        _prefill(ours, config, prompt._replace(ids=ids))


def test_checkpoint_name_formats(models) -> None:
    """transformers' in-memory names ("model.language_model.*", "model.vision_tower.*"),
    and the hub's nested vision names ("vision_tower.vision_model.*"), load alike."""
    arch, hf, ours, config = models
    prompt = make_prompt(arch, "w2 <image> w3", [random_image(64, 32, seed=9)])
    expected = _prefill(ours, config, prompt)
    for nest in (False, True):
        model = type(ours)(config, torch.float32)
        names = hf.state_dict().items()
        if nest:
            names = [
                (n.replace(".vision_tower.", ".vision_tower.vision_model."), t) for n, t in names
            ]
        model.load_weights(names)
        _close(_prefill(model.eval(), config, prompt), expected)


def test_vision_spec_counts_match_the_processor(models) -> None:
    """The counts the pipeline asks the model for equal transformers' processor's, over many sizes."""
    arch, _, ours, config = models
    spec = get_model_class(config).get_vision_spec(config)
    assert spec == ours.vision_spec and spec.image_token_id == IMAGE_TOKEN_ID
    processor = build_processor(arch)
    tile = (1, 3, TILE, TILE) if arch != "llava" else (3, TILE, TILE)  # only its shape is read
    for size in [(h, w) for h in (7, 31, 32, 45, 64, 97, 200, 333) for w in (9, 32, 50, 101, 250)]:
        for num_images in (1, 2):
            inputs = {
                "pixel_values": torch.zeros(num_images, *tile),
                "image_sizes": torch.tensor([size] * num_images),
                "batch_num_images": [num_images],
            }
            expected = processor.replace_image_token(inputs, 0).count("<image>")
            assert spec.num_image_tokens(size, num_images) == expected, (size, num_images)
    if arch == "llava_onevision":
        assert spec.video_token_id == VIDEO_TOKEN_ID
        video = {"pixel_values_videos": torch.zeros(1, 5, 3, TILE, TILE)}
        assert spec.num_video_tokens(5) == processor.replace_video_token(video, 0).count("<video>")
    else:
        assert spec.video_token_id is None


def test_onevision_several_images_and_video(models) -> None:
    arch, hf, ours, config = models
    if arch != "llava_onevision":
        pytest.skip("OneVision only")
    images = [random_image(40, 100, seed=10), random_image(90, 30, seed=11)]
    prompt = make_prompt(arch, "w1 <image> w2 <image> w3 <video> w4", images, random_frames(3, 12))
    kinds = [(it.modality, it.num_tokens) for it in prompt.mm.items]
    assert kinds == [("image", 17), ("image", 17), ("video", 3 * 4 + 1)]
    _close(_prefill(ours, config, prompt), hf_llava_logits(hf, prompt))
    # Chunks that cut the video in two.
    video = prompt.mm.items[2]
    _close(_prefill(ours, config, prompt, chunks=[video.offset + 5]), hf_llava_logits(hf, prompt))


def test_text_only_prompt_takes_the_language_model_path(models) -> None:
    arch, hf, ours, config = models
    prompt = make_prompt(arch, "w1 w20 w3 w40 w5")
    runner = PoolRunner(ours, config.text_config)
    (logits,) = runner.step([(runner.new_request(), prompt.ids)])  # mm_inputs=None
    _close(logits, hf_llava_logits(hf, prompt))


def test_linear_projector() -> None:
    """Original LLaVA checkpoints (`mm_projector_type: "linear"`) have linear_1 only."""
    config = SimpleNamespace(
        text_config=SimpleNamespace(hidden_size=16), mm_projector_type="linear"
    )
    projector = MultiModalProjector(config, in_features=8, dtype=torch.float32)
    assert projector.linear_2 is None
    x = torch.randn(3, 8)
    _close(projector(x), projector.linear_1(x))
