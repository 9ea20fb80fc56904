"""End to end: the real server on a tiny LLaVA-NeXT checkpoint, through plain HTTP.

One server (`--model-path <tiny folder> --allowed-local-media-path <media>
--allow-private-media-urls`, so that image URLs of a loopback server started here
are fetched) serves the module. Prompt token counts are checked against transformers'
processor on the same folder, and greedy outputs against transformers'
`generate` (tests/multimodal/_tiny_llava_checkpoint.py). Every bad input must
get a 400 that says why, and the server must keep serving after it.
"""

from __future__ import annotations

import base64
import io
import os
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest
from _media_server import SLOW, MediaServer
from _server_process import ServerProcess
from PIL import Image

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "multimodal"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
from _llava_builders import random_image  # noqa: E402
from _tiny_llava import data_url  # noqa: E402
from _tiny_llava_checkpoint import HFReference, build_checkpoint  # noqa: E402

NUM_NEW = 10
GREEDY = {"temperature": 0.0, "max_new_tokens": NUM_NEW, "ignore_eos": True}
ONE = "USER: <image>\nWhat is this?\nASSISTANT:"
CAT = random_image(30, 40, seed=31)
DOG = random_image(50, 20, seed=32)


class Served(NamedTuple):
    http: httpx.Client
    ref: HFReference
    root: Path  # holds media/ (the allowed folder) and files outside it


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    root = tmp_path_factory.mktemp("llava-server")
    path = build_checkpoint(root / "model", "llava_next")
    (root / "media").mkdir()
    srv = ServerProcess(root / "server.log", "--model-path", str(path),
                        "--allowed-local-media-path", str(root / "media"),
                        "--allow-private-media-urls")
    try:
        srv.wait_healthy()
        with httpx.Client(base_url=srv.url, timeout=120) as http:
            yield Served(http, HFReference(path), root)
        assert srv.stop() == 0, srv.log_tail()
        assert not srv.group_alive()
    finally:
        srv.stop(signal.SIGKILL, timeout=1)


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def _url(image: Image.Image) -> str:
    return data_url(_png(image))


def _user(*parts: Any) -> dict[str, Any]:
    content = [{"type": "text", "text": p} if isinstance(p, str)
               else {"type": "image_url", "image_url": {"url": _url(p)}} for p in parts]
    return {"role": "user", "content": content}


def _chat(http: httpx.Client, messages: list[dict[str, Any]]) -> httpx.Response:
    return http.post("/v1/chat/completions", json={
        "model": "tiny-llava", "messages": messages, "max_tokens": NUM_NEW, "temperature": 0,
        "ignore_eos": True})


def _generate(http: httpx.Client, text: Any, image_data: Any = None) -> httpx.Response:
    body: dict[str, Any] = {"text": text, "sampling_params": GREEDY}
    if image_data is not None:
        body["image_data"] = image_data
    return http.post("/generate", json=body)


def _ok(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    return dict(r.json())


def _content(r: httpx.Response) -> str:
    return str(_ok(r)["choices"][0]["message"]["content"])


def _check_chat(served: Served, messages: list[dict[str, Any]], text: str,
                images: list[Image.Image]) -> None:
    """The chat's prompt is `text` (what the template renders) expanded as transformers
    expands it, and its reply is /generate's reply to that text, which equals
    transformers' greedy output."""
    body = _ok(_chat(served.http, messages))
    ref = served.ref.generate(text, images, NUM_NEW)
    assert body["usage"]["prompt_tokens"] == len(ref.input_ids)
    assert body["usage"]["completion_tokens"] == NUM_NEW
    native = _ok(_generate(served.http, text, [_url(i) for i in images]))
    assert native["output_ids"] == ref.output_ids
    assert body["choices"][0]["message"]["content"] == native["text"]


def test_chat_with_a_data_url_image(served: Served) -> None:
    _check_chat(served, [_user(CAT, "What is this?")], ONE, [CAT])


def test_chat_with_two_images_of_different_sizes(served: Served) -> None:
    text = "USER: Compare <image>\nwith <image>\n\nASSISTANT:"
    runs = served.ref.image_runs(text, [CAT, DOG])
    assert runs[0][1] - runs[0][0] != runs[1][1] - runs[1][0]  # anyres: per-image counts
    _check_chat(served, [_user("Compare ", CAT, "with ", DOG)], text, [CAT, DOG])


def test_multi_turn_with_an_image_in_the_first_turn(served: Served) -> None:
    messages = [_user(DOG, "First?"), {"role": "assistant", "content": "A dog."},
                {"role": "user", "content": "And its colour?"}]
    text = "USER: <image>\nFirst?\nASSISTANT: A dog.\nUSER: And its colour?\nASSISTANT:"
    _check_chat(served, messages, text, [DOG])


def test_anthropic_and_ollama_images_answer_as_openai(served: Served) -> None:
    """An image as an Anthropic `image` block (base64) and as an Ollama message's
    `images`: the same prompt and greedy reply as the OpenAI chat's data URL."""
    b64 = base64.b64encode(_png(CAT)).decode()
    openai = _ok(served.http.post("/v1/chat/completions", json={
        "messages": [_user(CAT, "What is this?")], "max_tokens": NUM_NEW, "temperature": 0}))
    anthropic = _ok(served.http.post("/v1/messages", json={
        "model": "m", "max_tokens": NUM_NEW, "temperature": 0, "messages": [
            {"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": b64}},
                {"type": "text", "text": "What is this?"}]}]}))
    ollama = _ok(served.http.post("/api/chat", json={
        "model": "m", "stream": False, "options": {"temperature": 0, "num_predict": NUM_NEW},
        "messages": [{"role": "user", "content": "What is this?", "images": [b64]}]}))
    text = openai["choices"][0]["message"]["content"]
    assert anthropic["content"][0]["text"] == text == ollama["message"]["content"]
    usage = anthropic["usage"]
    assert usage["input_tokens"] + usage["cache_read_input_tokens"] == openai["usage"][
        "prompt_tokens"] == ollama["prompt_eval_count"]
    show = _ok(served.http.post("/api/show", json={"model": _ok(served.http.get(
        "/api/tags"))["models"][0]["name"]}))
    assert "vision" in show["capabilities"]


def test_concurrent_mixed_batch(served: Served) -> None:
    conversations = [
        [_user(CAT, "What is this?")],
        [{"role": "user", "content": "Hello, who are you?"}],
        [_user("Compare ", DOG, "with ", CAT)],
        [{"role": "user", "content": "Count to five."}],
        [_user(random_image(40, 40, seed=33), "And this?")],
        [{"role": "user", "content": "Say something nice."}],
    ]
    alone = [_content(_chat(served.http, m)) for m in conversations]
    with ThreadPoolExecutor(len(conversations)) as pool:
        together = list(pool.map(lambda m: _content(_chat(served.http, m)), conversations * 2))
    assert together == alone * 2


def test_generate_with_base64_and_a_local_path(served: Served) -> None:
    image = random_image(40, 30, seed=34)
    png = _png(image)
    (served.root / "media" / "cat.png").write_bytes(png)
    ref = served.ref.generate(ONE, [image], NUM_NEW)
    b64 = _ok(_generate(served.http, ONE, base64.b64encode(png).decode()))
    local = _ok(_generate(served.http, ONE, str(served.root / "media" / "cat.png")))
    for out in (b64, local):
        assert out["output_ids"] == ref.output_ids
        assert out["meta_info"]["prompt_tokens"] == len(ref.input_ids)
    # A batch: one prompt per image list, text-only prompts among them.
    outs = _ok_list(_generate(served.http, [ONE, "Hi there", ONE],
                              [_url(image), None, "file://" + str(served.root / "media/cat.png")]))
    assert [o["output_ids"] for o in outs][::2] == [ref.output_ids] * 2


def test_image_urls_with_the_opt_in(served: Served) -> None:
    image = random_image(40, 30, seed=37)
    ref = served.ref.generate(ONE, [image], NUM_NEW)
    with MediaServer({"/cat.png": _png(image)}) as media:
        for url in (media.url + "/cat.png", media.url + "/redirect/cat.png"):
            assert _ok(_generate(served.http, ONE, url))["output_ids"] == ref.output_ids
        assert _content(_chat(served.http, [_chat_image(media.url + "/cat.png")]))
        r = _generate(served.http, ONE, media.url + "/missing.png")
        assert r.status_code == 400 and "Could not fetch" in r.json()["message"]


def test_slow_urls_do_not_hold_up_other_images(served: Served) -> None:
    """Issue 9: two slow URLs took both media workers and delayed every image ~9 s."""
    with MediaServer({"/cat.png": _png(CAT)}) as media, ThreadPoolExecutor(3) as pool:
        slow = [pool.submit(_generate, served.http, ONE, media.url + "/slow/cat.png")
                for _ in range(3)]
        while len(media.hits) < 3:
            time.sleep(0.02)
        start = time.monotonic()
        _ok(_generate(served.http, ONE, _url(DOG)))
        elapsed = time.monotonic() - start
        assert all(f.result().status_code == 200 for f in slow)
    assert elapsed < SLOW / 2, f"a data-URL image waited {elapsed:.1f} s behind slow URLs"


def _ok_list(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200, r.text
    return list(r.json())


def test_repeated_image_hits_the_prefix_cache(served: Served) -> None:
    image, same_size = random_image(36, 36, seed=35), random_image(36, 36, seed=36)
    ((start, end),) = served.ref.image_runs(ONE, [image])
    first = _ok(_generate(served.http, ONE, _url(image)))
    again = _ok(_generate(served.http, ONE, _url(image)))
    assert again["meta_info"]["cached_tokens"] >= end  # covers the image's tokens
    assert again["output_ids"] == first["output_ids"]
    other = _ok(_generate(served.http, ONE, _url(same_size)))
    assert other["meta_info"]["cached_tokens"] == start  # "USER: " only
    assert other["output_ids"] != first["output_ids"]


def _bad_cases(root: Path) -> list[tuple[str, dict[str, Any], str]]:
    png = _png(CAT)
    (root / "outside.png").write_bytes(png)  # a real image, but not under media/
    big = random_image(56, 56, seed=37)  # the most tiles: 24 tokens each
    too_many = [_url(big)] * 30  # 720 tokens > the 512-token context
    outside = str(root / "media" / ".." / "outside.png")
    not_image = data_url(b"plain text, not a picture")
    truncated = data_url(png[: len(png) // 2])
    return [
        ("/generate", {"text": ONE, "image_data": not_image}, "not a valid image"),
        ("/generate", {"text": ONE, "image_data": truncated}, "not a valid image"),
        ("/generate", {"text": ONE, "image_data": str(root / "outside.png")}, "outside the allowed"),
        ("/generate", {"text": ONE, "image_data": outside}, "outside the allowed"),
        ("/generate", {"text": "<image>\n" * 30, "image_data": too_many}, "context length"),
        ("/v1/chat/completions", {"messages": [_chat_image(not_image)]}, "not a valid image"),
        ("/v1/chat/completions", {"messages": [_chat_image(truncated)]}, "not a valid image"),
        ("/v1/chat/completions", {"messages": [_chat_image("file://" + outside)]},
         "outside the allowed"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": u}} for u in too_many]}]},
         "context length"),
    ]


def _chat_image(url: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                        {"type": "text", "text": "What is it?"}]}


def test_bad_input_is_400_and_the_server_keeps_serving(served: Served) -> None:
    for route, body, reason in _bad_cases(served.root):
        r = served.http.post(route, json={**body, "max_tokens": 2} if "messages" in body
                             else body)
        assert r.status_code == 400, (route, r.text)
        assert reason in r.json()["message"], (route, r.json())
        assert _ok(_generate(served.http, ONE, _url(CAT)))["meta_info"]["completion_tokens"] \
            == NUM_NEW
    info = _ok(served.http.get("/get_server_info"))
    assert info["kv_integrity"] == "ok" and info["num_used_tokens"] == 0
