"""Placeholder expansion and pad values on tiny LLaVA-1.5 and LLaVA-NeXT processors.

The reference is transformers' own processor called on the whole prompt: our
expanded ids, with each item's pad values put back to `<image>`, must equal
its input_ids, and each item's pixels must equal that image's processed alone.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from _tiny_llava import NUM_LLAVA_TOKENS, build_processor_dir, data_url, png_bytes
from transformers import AutoProcessor, AutoTokenizer

from radixlm.messages.mm_inputs import PAD_VALUE_RANGE, MultimodalInputs
from radixlm.multimodal.processor import (
    HFMultimodalProcessor,
    TextOnlyProcessor,
    create_mm_processor,
)
from radixlm.server_args import ServerArgs
from radixlm.tokenizer.request_input import SingleReq
from radixlm.tokenizer.validation import validate_request

RED = data_url(png_bytes((40, 30), (255, 0, 0)))
BLUE = data_url(png_bytes((40, 30), (0, 0, 255)))
TALL = data_url(png_bytes((30, 90), (0, 255, 0)))


@pytest.fixture(scope="module", params=["llava", "llava_next"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_processor_dir(tmp_path_factory.mktemp(request.param), request.param)


def _processor(model_dir: Path) -> tuple[Any, HFMultimodalProcessor]:
    tok = AutoTokenizer.from_pretrained(model_dir)
    proc = create_mm_processor(ServerArgs(model_path=str(model_dir)), str(model_dir), tok)
    assert isinstance(proc, HFMultimodalProcessor)
    return tok, proc


def _run(proc: Any, ids: list[int], images: list[Any], videos: list[Any] | None = None,
         context_len: int = 4096) -> tuple[list[int], MultimodalInputs | None]:
    return asyncio.run(proc.process(ids, images, videos or [], 300, context_len))


def test_expansion_matches_transformers(model_dir: Path) -> None:
    tok, proc = _processor(model_dir)
    prompt = "A <image> B <image><image>C"
    ids = tok.encode(prompt, add_special_tokens=False)
    images = [RED, TALL, RED]
    out, mm = _run(proc, ids, images)
    assert mm is not None and [it.modality for it in mm.items] == ["image"] * 3

    hf = AutoProcessor.from_pretrained(model_dir)
    pil = [proc.loader.load_image(s) for s in images]
    ref = hf(text=prompt, images=pil, return_tensors="pt", add_special_tokens=False)
    restored = list(out)
    for it in mm.items:
        assert out[it.offset : it.end] == [it.pad_value] * it.num_tokens  # the contract
        assert it.pad_value >= 300 and it.pad_value - 300 < PAD_VALUE_RANGE
        restored[it.offset : it.end] = [proc.image_token_id] * it.num_tokens
        alone = hf.image_processor([pil[mm.items.index(it)]], return_tensors="pt")
        assert torch.equal(it.pixel_values, alone["pixel_values"][0])
    assert restored == ref["input_ids"][0].tolist()
    assert [it.offset for it in mm.items] == sorted(it.offset for it in mm.items)
    assert all(a.end <= b.offset for a, b in zip(mm.items, mm.items[1:]))
    # Same image, same pad value (the radix cache shares it); different images never.
    red1, tall, red2 = mm.items
    assert red1.pad_value == red2.pad_value and red1.hash == red2.hash
    assert tall.pad_value != red1.pad_value
    assert red1.image_size == (30, 40) and tall.image_size == (90, 30)
    # The expanded prompt passes validation with its items, and fails without them.
    single = SingleReq(text=None, input_ids=out, sampling_params={"max_new_tokens": 4}, rid="r")
    validate_request(single, out, 300, 4096, mm_inputs=mm)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        validate_request(single, out, 300, 4096)


def test_token_counts_per_model(model_dir: Path) -> None:
    tok, proc = _processor(model_dir)
    ids = tok.encode("<image><image>", add_special_tokens=False)
    out, mm = _run(proc, ids, [RED, TALL])
    assert mm is not None
    counts = [it.num_tokens for it in mm.items]
    if "llava_next" in model_dir.name:
        # anyres: a 40x30 image gets 2x2 tiles, a 30x90 one 2 (1 wide, 2 high), plus the
        # base image each: the counts depend on the size, and no padding tiles are kept.
        assert counts[0] > counts[1]
        assert [it.pixel_values.shape[0] for it in mm.items] == [5, 3]
        assert all(it.pixel_values.shape[1:] == (3, 28, 28) for it in mm.items)
        assert torch.equal(mm.items[1].extra["image_sizes"], torch.tensor([90, 30]))
    else:
        assert counts == [NUM_LLAVA_TOKENS] * 2
        assert mm.items[0].pixel_values.shape == (3, 28, 28)
    assert len(out) == sum(counts)


def test_same_image_same_pad_across_requests(model_dir: Path) -> None:
    tok, proc = _processor(model_dir)
    a = _run(proc, tok.encode("x<image>", add_special_tokens=False), [RED])
    b = _run(proc, tok.encode("y <image> z", add_special_tokens=False), [RED])
    c = _run(proc, tok.encode("x<image>", add_special_tokens=False), [BLUE])
    assert a[1] is not None and b[1] is not None and c[1] is not None
    assert a[1].items[0].pad_value == b[1].items[0].pad_value
    assert a[1].items[0].pad_value != c[1].items[0].pad_value
    assert b[1].items[0].offset == 2 and b[0][-2:] == tok.encode(" z")


def test_bad_requests(model_dir: Path) -> None:
    tok, proc = _processor(model_dir)
    one = tok.encode("look: <image>", add_special_tokens=False)
    with pytest.raises(ValueError, match=r"1 image placeholder\(s\) \('<image>'\) but 2"):
        _run(proc, one, [RED, BLUE])
    with pytest.raises(ValueError, match="0 image placeholder"):
        _run(proc, tok.encode("no placeholder", add_special_tokens=False), [RED])
    with pytest.raises(ValueError, match="1 image placeholder.* but 0"):
        _run(proc, one, [])
    with pytest.raises(ValueError, match="Image 2: The data is not a valid image"):
        _run(proc, tok.encode("<image><image>", add_special_tokens=False),
             [RED, data_url(b"not a png")])
    with pytest.raises(ValueError, match="no video support"):
        _run(proc, tok.encode("<video>", add_special_tokens=False), [], [[RED]])
    many = tok.encode("<image>" * 8, add_special_tokens=False)
    with pytest.raises(ValueError, match="more than the context length"):
        _run(proc, many, [RED] * 8, context_len=20)
    text = tok.encode("plain text", add_special_tokens=False)
    assert _run(proc, text, []) == (text, None)


def test_text_only_model_refuses_media(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    proc = create_mm_processor(ServerArgs(served_model_name="tiny-text"), str(tmp_path), None)
    assert isinstance(proc, TextOnlyProcessor) and not proc.has_vision
    assert _run(proc, [1, 2], []) == ([1, 2], None)
    with pytest.raises(ValueError, match="The model tiny-text has no vision support"):
        _run(proc, [1, 2], [RED])
    with pytest.raises(ValueError, match="no vision support; it cannot take video"):
        _run(proc, [1, 2], [], [[RED]])


def test_default_model_has_no_vision_support() -> None:
    from radixlm.model_loader.model_path import resolve_model_dir

    proc = create_mm_processor(ServerArgs(), resolve_model_dir(None), None)
    assert isinstance(proc, TextOnlyProcessor)
    with pytest.raises(ValueError, match="SmolLM2-135M-Instruct has no vision support"):
        proc.check_modalities(1, 0)


class _FakeVideoProcessor:
    """A transformers-like processor for videos: 2 placeholder tokens per frame."""

    def __init__(self, video_id: int) -> None:
        self.video_id = video_id
        self.threads: list[str] = []

    def __call__(self, text: list[str], videos: list[Any], **kwargs: Any) -> dict[str, Any]:
        self.threads.append(threading.current_thread().name)
        frames = videos[0]
        pixels = torch.tensor([f.getpixel((1, 1)) for f in frames],
                              dtype=torch.float32)  # [F, 3]
        return {"input_ids": torch.tensor([[self.video_id] * (2 * len(frames))]),
                "pixel_values_videos": pixels[None]}  # [1, F, 3]


def test_video_frames_through_a_video_processor(tmp_path: Path) -> None:
    model_dir = build_processor_dir(tmp_path / "ov")
    tok, proc = _processor(model_dir)
    proc.video_token, proc.video_token_id = "<video>", tok.convert_tokens_to_ids("<video>")
    fake = _FakeVideoProcessor(proc.video_token_id)
    proc._hf = fake
    ids = tok.encode("a<video>b<video>", add_special_tokens=False)
    out, mm = _run(proc, ids, [], [[RED, BLUE, RED], [BLUE]])
    assert mm is not None and [it.modality for it in mm.items] == ["video", "video"]
    assert [it.num_tokens for it in mm.items] == [6, 2]
    assert [it.offset for it in mm.items] == [1, 8]
    assert mm.items[0].pixel_values.shape == (3, 3)  # [frames, ...] without the batch dim
    assert len(out) == 10 and out[0] == ids[0] and out[7] == ids[2]
    assert all(name.startswith("radixlm-mm") for name in fake.threads)  # off the event loop
    proc.close()
