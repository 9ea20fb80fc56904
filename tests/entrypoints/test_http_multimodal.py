"""Images through the HTTP layer, on a fake runtime with a real tiny LLaVA processor.

The fake TokenizerManager runs the real multimodal pipeline (loading,
transformers' processor, pad values) and validation; it records each request
(`received`) and each prompt's expanded ids and items (`prepared`).
"""

from __future__ import annotations

import base64
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fake_runtime import FakeTokenizerManager, fake_starter
from starlette.testclient import TestClient

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multimodal"))
from _tiny_llava import (  # noqa: E402
    NUM_LLAVA_TOKENS,
    build_processor_dir,
    data_url,
    png_bytes,
)

from radixlm.entrypoints.http.server import create_app  # noqa: E402
from radixlm.multimodal.processor import create_mm_processor  # noqa: E402
from radixlm.server_args import ServerArgs  # noqa: E402

RED = data_url(png_bytes((40, 30), (255, 0, 0)))
BLUE = data_url(png_bytes((40, 30), (0, 0, 255)))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_processor_dir(tmp_path_factory.mktemp("tiny-llava"))


def _client(model_dir: Path, media_dir: Path | None = None, context_length: int = 256,
            **kwargs: Any) -> tuple[TestClient, FakeTokenizerManager]:
    from transformers import AutoTokenizer

    args = ServerArgs(served_model_name="tiny-llava", model_path=str(model_dir),
                      allowed_local_media_path=str(media_dir) if media_dir else None, **kwargs)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tm = FakeTokenizerManager(tok, context_length=context_length,
                              mm_processor=create_mm_processor(args, str(model_dir), tok))
    return TestClient(create_app(args, fake_starter(tm)), raise_server_exceptions=False,
                      base_url="http://localhost"), tm


@pytest.fixture
def served(model_dir: Path, tmp_path: Path) -> Iterator[tuple[TestClient, FakeTokenizerManager]]:
    (tmp_path / "media").mkdir()
    client, tm = _client(model_dir, tmp_path / "media")
    with client:
        _wait_ready(client)
        yield client, tm


def _wait_ready(client: TestClient) -> None:
    deadline = time.monotonic() + 10
    while client.get("/health").status_code != 200:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _chat(client: TestClient, messages: list[dict[str, Any]], **extra: Any) -> Any:
    return client.post("/v1/chat/completions",
                       json={"messages": messages, "max_tokens": 3, **extra})


def _user(*parts: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": p} if isinstance(p, str) else p for p in parts]
    return {"role": "user", "content": content}


def _image(url: str, **extra: Any) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url, **extra}}


def _pads(tm: FakeTokenizerManager) -> list[int]:
    ids, mm = tm.prepared[-1]
    assert mm is not None
    for it in mm.items:
        assert ids[it.offset : it.end] == [it.pad_value] * NUM_LLAVA_TOKENS
    return [it.pad_value for it in mm.items]


def test_chat_with_a_data_url_image(served: Any) -> None:
    client, tm = served
    r = _chat(client, [_user(_image(RED, detail="low"), "What is this?")])
    assert r.status_code == 200, r.text
    assert tm.received[-1].image_data == [RED]
    assert len(_pads(tm)) == 1
    text = tm.tokenizer.decode(tm.received[-1].input_ids)
    assert text == "USER: <image>\nWhat is this?\nASSISTANT:"  # the template placed it
    usage = r.json()["usage"]
    assert usage["prompt_tokens"] == len(tm.prepared[-1][0])  # counted after expansion


def test_model_info_reports_image_understanding(served: Any) -> None:
    client, _ = served
    info = client.get("/get_model_info").json()
    assert info["has_image_understanding"] is True  # the playground shows its image control
    assert info["has_video_understanding"] is False  # LLaVA-1.5 takes no video


def test_two_images_and_multi_turn(served: Any) -> None:
    client, tm = served
    r = _chat(client, [_user("Compare", _image(RED), _image(BLUE))])
    assert r.status_code == 200, r.text
    assert tm.received[-1].image_data == [RED, BLUE]
    red, blue = _pads(tm)
    assert red != blue

    messages = [_user(_image(BLUE), "First?"), {"role": "assistant", "content": "A square."},
                _user("And now?", _image(RED)), ]
    r = _chat(client, messages, stream=True)
    assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
    assert tm.received[-1].image_data == [BLUE, RED]  # in the order of the turns
    assert _pads(tm) == [blue, red]  # the same images give the same pad values
    text = tm.tokenizer.decode(tm.received[-1].input_ids)
    assert text.index("<image>\nFirst?") < text.index("A square.") < text.rindex("<image>")


def test_string_template_gets_the_placeholders_inline(model_dir: Path) -> None:
    client, tm = _client(model_dir, chat_template="chatml")
    with client:
        _wait_ready(client)
        r = _chat(client, [{"role": "system", "content": "Be brief."},
                           _user("Look:", _image(RED), "Well?")])
        assert r.status_code == 200, r.text
        text = tm.tokenizer.decode(tm.received[-1].input_ids)
        assert "<|im_start|>user\nLook:\n<image>\nWell?<|im_end|>" in text
        assert len(_pads(tm)) == 1


def test_native_generate_with_image_data(served: Any, tmp_path: Path) -> None:
    client, tm = served
    (tmp_path / "media" / "red.png").write_bytes(base64.b64decode(RED.split(",")[1]))
    r = client.post("/generate", json={"text": "<image> describe", "image_data": RED,
                                       "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["prompt_tokens"] == NUM_LLAVA_TOKENS + len(" describe")
    red = _pads(tm)
    local = str(tmp_path / "media" / "red.png")
    r = client.post("/generate", json={"text": ["<image>a", "b<image><image>"],
                                       "image_data": [local, [BLUE, RED]],
                                       "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200, r.text
    assert _pads(tm)[1] == red[0]  # the last prompt's second image is the same red
    assert tm.prepared[-2][1] is not None and tm.prepared[-2][1].items[0].pad_value == red[0]


def test_image_without_max_tokens_runs_to_the_context_end(served: Any) -> None:
    client, tm = served
    r = client.post("/v1/chat/completions", json={"messages": [_user(_image(RED), "hi")],
                                                  "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 256 - len(tm.prepared[-1][0])


TRUNCATED = data_url(png_bytes()[:-30])


@pytest.mark.parametrize("body, words", [
    ({"messages": [_user(_image(data_url(b"plain text")))]}, ["Image 1", "not a valid image"]),
    ({"messages": [_user(_image(TRUNCATED))]}, ["not a valid image"]),
    ({"messages": [_user(_image("/etc/passwd"))]}, ["outside the allowed media folder"]),
    ({"messages": [_user(_image("file:///etc/hostname"))]}, ["outside the allowed"]),
    ({"messages": [_user(_image("data:image/png,abc"))]}, ["data URL"]),
    ({"messages": [_user(_image(RED, detail="ultra"))]}, ["detail"]),
    ({"messages": [_user({"type": "video_url", "video_url": {"url": [RED, BLUE]}})]},
     ["tiny-llava has no video support"]),
    ({"messages": [_user("hi")], "modalities": ["audio"]}, ["modalities"]),
    ({"messages": [_user("<image> hi")]}, ["1 image placeholder(s)", "0 image(s)"]),
])
def test_bad_chat_input_is_400(served: Any, body: dict[str, Any], words: list[str]) -> None:
    client, _ = served
    r = client.post("/v1/chat/completions", json={"max_tokens": 2, **body})
    assert r.status_code == 400, r.text
    for w in words:
        assert w in r.json()["message"], r.json()
    assert _chat(client, [_user(_image(RED), "ok")]).status_code == 200  # still serving


def test_bad_native_input_is_400(served: Any, tmp_path: Path) -> None:
    client, _ = served
    os.symlink("/etc/hostname", tmp_path / "media" / "escape.png")
    cases = [
        ({"text": "<image>", "image_data": [RED, BLUE]}, "1 image placeholder(s)"),
        ({"text": "<image>", "image_data": str(tmp_path / "media" / ".." / "x.png")},
         "outside the allowed"),
        ({"text": "<image>", "image_data": str(tmp_path / "media" / "escape.png")},
         "outside the allowed"),
        ({"text": ["<image>", "<image>"], "image_data": [RED]}, "1 entries for 2 prompts"),
        ({"text": "<image>" * 80, "image_data": [RED] * 80}, "more than the context length"),
    ]
    for body, words in cases:
        r = client.post("/generate", json=body)
        assert r.status_code == 400, r.text
        assert words in r.json()["message"], r.json()
    r = client.post("/generate", json={"text": "<image>", "image_data": RED})
    assert r.status_code == 200
