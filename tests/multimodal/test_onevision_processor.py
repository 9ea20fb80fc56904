"""LLaVA-OneVision through radixlm's multimodal pipeline, without torchvision.

A tiny OneVision folder (random weights saved by transformers, a word-level
tokenizer with <image> and <video>, the PIL image processor, video processor
settings) is built in a temporary folder. transformers' combined processor
cannot load it here (its video processor needs torchvision), so the pipeline
assembles the pieces (radixlm/multimodal/onevision.py). References:

- token counts: transformers' LlavaOnevisionProcessor's own `replace_image_token`
  / `replace_video_token` on the whole prompt (tests/models/_llava_builders.py);
- image pixels: transformers' image processor on the whole prompt's images;
- video pixels: the operations of transformers' LlavaOnevisionVideoProcessor
  (its torchvision backend on the CPU), re-derived here, and PIL's bicubic;
- logits: transformers' LlavaOnevisionForConditionalGeneration on transformers'
  inputs vs our model on the pipeline's ids and items, within 1e-4.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image
from transformers import AutoTokenizer, LlavaOnevisionImageProcessorPil

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
from _forward_harness import PoolRunner  # noqa: E402
from _llava_builders import (  # noqa: E402
    ARCHS,
    IMAGE_TOKEN_ID,
    PATCH,
    PINPOINTS,
    TILE,
    VIDEO_TOKEN_ID,
    VOCAB_SIZE,
    build_hf_llava,
    build_tokenizer,
    hf_llava_logits,
    make_prompt,
    random_image,
)

from radixlm.messages.mm_inputs import MultimodalInputs
from radixlm.model_loader.loader import load_model
from radixlm.multimodal.onevision import OnevisionProcessor, VideoFrameProcessor
from radixlm.multimodal.processor import create_mm_processor
from radixlm.server_args import ServerArgs

ARCH = "llava_onevision"
# SigLIP's mean and std, as real OneVision checkpoints set them (not the class defaults).
VIDEO_SETTINGS = {
    "size": {"height": TILE, "width": TILE},
    "resample": 3,
    "image_mean": [0.5, 0.5, 0.5],
    "image_std": [0.5, 0.5, 0.5],
    "do_convert_rgb": True,
    "video_processor_type": "LlavaOnevisionVideoProcessor",
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Any]:
    """The tiny OneVision folder and transformers' model saved in it."""
    path = tmp_path_factory.mktemp("onevision")
    hf = build_hf_llava(ARCH)
    hf.save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    square = {"height": TILE, "width": TILE}
    LlavaOnevisionImageProcessorPil(size=square, image_grid_pinpoints=PINPOINTS).save_pretrained(
        path
    )
    image_config = json.loads((path / "preprocessor_config.json").read_text())
    image_config["image_processor_type"] = "LlavaOnevisionImageProcessor"  # as checkpoints say
    (path / "preprocessor_config.json").write_text(json.dumps(image_config))
    (path / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_SETTINGS))
    processor = {  # as in llava-hf's OneVision checkpoints
        "processor_class": "LlavaOnevisionProcessor",
        "num_image_tokens": (TILE // PATCH) ** 2,
        "vision_feature_select_strategy": "full",
        "vision_aspect_ratio": ARCHS[ARCH]["vision_aspect_ratio"],
        "image_token": "<image>",
        "video_token": "<video>",
    }
    (path / "processor_config.json").write_text(json.dumps(processor))
    return path, hf


def _processor(path: Path) -> tuple[Any, OnevisionProcessor]:
    tok = AutoTokenizer.from_pretrained(path)
    proc = create_mm_processor(ServerArgs(model_path=str(path)), str(path), tok)
    assert isinstance(proc, OnevisionProcessor)
    return tok, proc


def _run(path: Path, text: str, images: Sequence[Any] = (), videos: Sequence[Any] = (),
         context_len: int = 4096) -> tuple[list[int], MultimodalInputs]:
    tok, proc = _processor(path)
    try:
        ids = tok.encode(text, add_special_tokens=False)
        out, mm = asyncio.run(proc.process(ids, list(images), list(videos), VOCAB_SIZE,
                                           context_len))
    finally:
        proc.close()
    assert mm is not None
    return out, mm


def _placeholders_restored(out: list[int], mm: MultimodalInputs) -> list[int]:
    """The ids with each item's pad values put back to its <image> / <video> token."""
    ids = list(out)
    for it in mm.items:
        assert out[it.offset : it.end] == [it.pad_value] * it.num_tokens  # the contract
        token = IMAGE_TOKEN_ID if it.modality == "image" else VIDEO_TOKEN_ID
        ids[it.offset : it.end] = [token] * it.num_tokens
    return ids


def reference_video(frames: list[Image.Image], settings: dict[str, Any]) -> torch.Tensor:
    """transformers' LlavaOnevisionVideoProcessor on PIL frames, step by step (CPU)."""
    # make_batched_videos: PIL frames → one [F, H, W, 3] array; _prepare_input_videos:
    # channels first, contiguous (RGB frames: do_convert_rgb changes nothing).
    video = torch.from_numpy(np.stack([np.array(f) for f in frames]))
    video = video.permute(0, 3, 1, 2).contiguous()  # [F, 3, H, W] uint8
    # TorchvisionBackend.resize → tvF.resize(BICUBIC, antialias=True) → resize_image: on
    # the CPU a bicubic resize interpolates the uint8 tensor itself (no float round trip).
    size = [settings["size"]["height"], settings["size"]["width"]]
    if list(video.shape[-2:]) != size:  # else resize_image returns the frames as they are
        video = F.interpolate(video, size=size, mode="bicubic", align_corners=False,
                              antialias=True)
    # rescale_and_normalize, fused: mean and std times 1 / rescale_factor, tvF.normalize.
    rescale_factor = settings.get("rescale_factor", 1 / 255)
    mean = torch.tensor(settings["image_mean"]) * (1.0 / rescale_factor)
    std = torch.tensor(settings["image_std"]) * (1.0 / rescale_factor)
    video = video.to(torch.float32)
    return video.sub(mean.view(-1, 1, 1)).div_(std.view(-1, 1, 1))


def test_fallback_is_used_without_torchvision(folder: tuple[Path, Any]) -> None:
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    path, _ = folder
    if is_torchvision_available():
        pytest.skip("torchvision is installed: transformers' processor loads")
    with pytest.raises(ImportError):  # the problem this processor solves
        AutoProcessor.from_pretrained(path)
    _, proc = _processor(path)
    pieces = proc._load()
    assert isinstance(pieces.image_processor, LlavaOnevisionImageProcessorPil)
    assert pieces.process_video == VideoFrameProcessor.from_dict(VIDEO_SETTINGS)
    assert pieces.spec.video_token_id == VIDEO_TOKEN_ID
    proc.close()


def test_one_image(folder: tuple[Path, Any]) -> None:
    path, _ = folder
    text, image = "w5 w17 <image> w3 w9", random_image(45, 70, seed=1)
    out, mm = _run(path, text, [image])
    ref = make_prompt(ARCH, text, [image])
    assert _placeholders_restored(out, mm) == ref.hf_ids
    (item,) = mm.items
    assert item.image_size == (45, 70) and item.num_tokens == ref.mm.items[0].num_tokens
    assert item.num_tokens > 16 + 1  # tiled: the base tile and the packed grid
    # The image processor's own output for that one image: the base tile and 2 x 2 tiles.
    alone = LlavaOnevisionImageProcessorPil.from_pretrained(path)([[image]], return_tensors="pt")
    assert item.pixel_values.shape == (5, 3, TILE, TILE)
    assert torch.equal(item.pixel_values, alone["pixel_values"][0])
    assert torch.equal(item.extra["image_sizes"], torch.tensor([45, 70]))


def test_two_images_of_different_sizes(folder: tuple[Path, Any]) -> None:
    """Several images: each is padded to a square and takes one tile plus a newline."""
    path, _ = folder
    text = "w1 <image> w2 w3 <image> w4 <image>"
    wide, tall = random_image(40, 100, seed=3), random_image(90, 30, seed=4)
    out, mm = _run(path, text, [wide, tall, wide])
    ref = make_prompt(ARCH, text, [wide, tall, wide])
    assert _placeholders_restored(out, mm) == ref.hf_ids
    assert [it.num_tokens for it in mm.items] == [16 + 1] * 3
    for ours, theirs in zip(mm.items, ref.mm.items):
        assert ours.pixel_values.shape == (1, 3, TILE, TILE)
        assert torch.equal(ours.pixel_values, theirs.pixel_values)
    first, second, third = mm.items
    assert first.pad_value == third.pad_value and first.pad_value != second.pad_value
    assert (first.image_size, second.image_size) == ((40, 100), (90, 30))
    # The same image alone is tiled: other pixels, other tokens, another pad value.
    _, alone = _run(path, "w1 <image>", [wide])
    assert alone.items[0].num_tokens != first.num_tokens
    assert alone.items[0].pad_value != first.pad_value


def test_video_frames(folder: tuple[Path, Any]) -> None:
    path, _ = folder
    frames = [random_image(40, 56, seed=s) for s in (5, 6, 7)]
    out, mm = _run(path, "w1 <video> w2", [], [frames])
    (item,) = mm.items
    assert item.modality == "video" and item.pixel_values.shape == (3, 3, TILE, TILE)
    assert torch.equal(item.pixel_values, reference_video(frames, VIDEO_SETTINGS))
    # PIL's bicubic (the filter torch's antialiased uint8 kernel follows) agrees to within
    # one level of 255 per pixel.
    pil = np.stack([np.asarray(f.resize((TILE, TILE), Image.Resampling.BICUBIC)) for f in frames])
    pil_pixels = (torch.from_numpy(pil).permute(0, 3, 1, 2) / 255.0 - 0.5) / 0.5
    assert (item.pixel_values - pil_pixels).abs().max() <= 2 / 255 + 1e-6
    # Counts: transformers' replace_video_token (4 x 4 patches pooled to 2 x 2, + a newline).
    ref = make_prompt(ARCH, "w1 <video> w2", frames=item.pixel_values)
    assert _placeholders_restored(out, mm) == ref.hf_ids and item.num_tokens == 3 * 4 + 1


def test_video_frame_processor_defaults_and_settings(tmp_path: Path) -> None:
    """transformers' defaults, and its order of config files: processor_config.json's
    "video_processor", video_preprocessor_config.json, preprocessor_config.json."""
    # The class imports without torchvision (only building one needs it).
    from transformers.models.llava_onevision.video_processing_llava_onevision import (
        LlavaOnevisionVideoProcessor as Theirs,
    )

    default = VideoFrameProcessor.from_pretrained(str(tmp_path))
    assert {"height": default.height, "width": default.width} == Theirs.size
    assert Theirs.resample == Image.Resampling.BICUBIC and Theirs.do_convert_rgb
    assert not Theirs.do_center_crop and not Theirs.do_sample_frames
    assert list(default.image_mean) == list(Theirs.image_mean)
    assert list(default.image_std) == list(Theirs.image_std)
    assert default.rescale_factor == Theirs.rescale_factor
    assert (default.do_resize, default.do_rescale, default.do_normalize) == (
        Theirs.do_resize, Theirs.do_rescale, Theirs.do_normalize)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"size": {"height": 8,
                                                                            "width": 8}}))
    assert VideoFrameProcessor.from_pretrained(str(tmp_path)).height == 8
    (tmp_path / "video_preprocessor_config.json").write_text(json.dumps(VIDEO_SETTINGS))
    assert VideoFrameProcessor.from_pretrained(str(tmp_path)).height == TILE
    nested = {"video_processor": {"size": {"height": 16, "width": 24}, "image_mean": [0.1] * 3}}
    (tmp_path / "processor_config.json").write_text(json.dumps(nested))
    from_nested = VideoFrameProcessor.from_pretrained(str(tmp_path))
    assert (from_nested.height, from_nested.width, from_nested.image_mean) == (16, 24, (0.1,) * 3)
    # Frames already of the target size are not resized; the default CLIP mean and std.
    frames = [random_image(384, 384, seed=9)]
    settings = {"size": Theirs.size, "image_mean": Theirs.image_mean,
                "image_std": Theirs.image_std}
    assert torch.equal(default(frames), reference_video(frames, settings))
    for bad in ({"resample": 2}, {"do_center_crop": True}, {"size": {"shortest_edge": 32}}):
        with pytest.raises(ValueError):
            VideoFrameProcessor.from_dict(bad)


def test_bad_input(folder: tuple[Path, Any]) -> None:
    path, _ = folder
    image = random_image(40, 40, seed=1)
    with pytest.raises(ValueError, match="more than the context length"):
        _run(path, "w1 <image> <image> <image>", [image] * 3, context_len=40)
    with pytest.raises(ValueError, match="Image 2: The data is not a valid image"):
        _run(path, "<image> <image>", [image, "data:image/png;base64,bm90IGFuIGltYWdl"])
    frames = [random_image(40, 40, seed=2), random_image(30, 40, seed=3)]
    with pytest.raises(ValueError, match="Video 1: .*frames of a video must all have one size"):
        _run(path, "<video>", [], [frames])
    with pytest.raises(ValueError, match="1 video placeholder"):
        _run(path, "<video>", [], [[image], [image]])


@pytest.fixture(scope="module")
def ours(folder: tuple[Path, Any]) -> tuple[Any, Any]:
    model, config = load_model(str(folder[0]), torch.float32, "cpu")
    return model, config


@pytest.mark.parametrize("case", ["image", "two_images", "video", "images_and_video"])
def test_logits_match_transformers(folder: tuple[Path, Any], ours: tuple[Any, Any],
                                   case: str) -> None:
    """Pipeline + model end to end: our model on the pipeline's ids and items equals
    transformers' model on transformers' inputs (video: our pixel values, checked above)."""
    path, hf = folder
    model, config = ours
    images = {"image": [random_image(50, 80, seed=11)],
              "two_images": [random_image(50, 80, seed=11), random_image(96, 40, seed=12)],
              "video": [],
              "images_and_video": [random_image(30, 64, seed=13), random_image(64, 64, seed=14)]}
    text = {"image": "w5 w17 <image> w3 w9 w11",
            "two_images": "w1 <image> w2 <image> w3",
            "video": "w4 <video> w6 w7",
            "images_and_video": "w1 <image> w2 <video> w3 <image> w4"}
    frames = [random_image(48, 40, seed=s) for s in (15, 16)]
    videos = [frames] if "video" in case else []
    out, mm = _run(path, text[case], images[case], videos)
    video_pixels = next((it.pixel_values for it in mm.items if it.modality == "video"), None)
    ref = make_prompt(ARCH, text[case], images[case], video_pixels)
    assert _placeholders_restored(out, mm) == ref.hf_ids
    runner = PoolRunner(model, config.text_config)
    (logits,) = runner.step([(runner.new_request(), out)], [mm])
    torch.testing.assert_close(logits, hf_llava_logits(hf, ref), atol=1e-4, rtol=1e-4)
