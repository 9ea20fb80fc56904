"""The playground's server side on a fake runtime: its files, their headers and packaging,
the key check around them, and the API fields the page reads (usage extras, vision).

The page itself runs in a browser in test_playground_browser.py.
"""

from __future__ import annotations

import fnmatch
import json
import re
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _fake_runtime import FakeTokenizerManager, byte_tokenizer, fake_starter
from starlette.testclient import TestClient

from radixlm.entrypoints.http.server import create_app
from radixlm.server_args import ServerArgs

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "radixlm" / "entrypoints" / "playground" / "static"
KEY = "sk-playground"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer()


@pytest.fixture
def client(tokenizer: Any) -> Iterator[TestClient]:
    args = ServerArgs(served_model_name="fake-model", api_key=KEY)
    app = create_app(args, fake_starter(FakeTokenizerManager(tokenizer)))
    with TestClient(app, raise_server_exceptions=False, base_url="http://localhost") as c:
        deadline = time.monotonic() + 10
        while c.get("/health").status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield c


def test_page_and_assets_are_public_with_their_headers(client: TestClient) -> None:
    r = client.get("/")
    assert r.status_code == 200 and r.headers["content-type"] == "text/html; charset=utf-8"
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp
    assert "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    # Every file the page names is served, with its type; the page loads nothing else.
    html = r.text
    for name, kind in [("app.js", "text/javascript"), ("playground.css", "text/css"),
                       ("icon.svg", "image/svg+xml")]:
        assert f"/playground/{name}" in html
        asset = client.get(f"/playground/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    # The modules app.js imports, and theirs, are served too.
    imported = set()
    for script in STATIC.glob("*.js"):
        imported |= set(re.findall(r'from "\./([\w.]+\.js)"', script.read_text()))
    assert {"api.js", "markdown.js", "schema.js", "settings.js"} <= imported
    for module in imported:
        assert client.get(f"/playground/{module}").status_code == 200, module
    assert "http" not in html.replace("http-equiv", "")  # no CDN, no outside address
    assert client.head("/").status_code == 200
    assert client.get("/favicon.ico").headers["content-type"] == "image/svg+xml"


def test_unknown_files_are_404_and_the_api_keeps_its_key(client: TestClient) -> None:
    for path in ("/playground/nope.js", "/playground/..%2Fplayground.py",
                 "/playground/../http_server.py"):
        r = client.get(path)
        assert r.status_code in (401, 404), (path, r.status_code)
        assert "import" not in r.text
    assert client.get("/get_model_info").status_code == 401
    assert client.post("/v1/chat/completions", json={"messages": []}).status_code == 401
    assert client.get("/get_model_info", headers=AUTH).status_code == 200


def test_package_data_ships_every_static_file() -> None:
    """pyproject's package-data globs cover each file the page needs (so a wheel has them)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    globs = config["tool"]["setuptools"]["package-data"]["radixlm.entrypoints.playground"]
    files = sorted(p.name for p in STATIC.iterdir() if p.is_file())
    assert {"index.html", "app.js", "playground.css"} <= set(files)
    for name in files:
        assert any(fnmatch.fnmatch(f"static/{name}", g) for g in globs), name


def test_model_info_says_whether_images_are_understood(client: TestClient) -> None:
    info = client.get("/get_model_info", headers=AUTH).json()
    assert info["has_image_understanding"] is False
    assert info["has_video_understanding"] is False
    assert info["served_model_name"] == "fake-model"


def _events(text: str) -> list[Any]:
    lines = [ln for ln in text.split("\n\n") if ln.strip()]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]


def test_usage_has_jump_forward_tokens(client: TestClient) -> None:
    body = client.post("/v1/chat/completions", headers=AUTH, json={
        "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).json()
    assert body["usage"]["completion_tokens_details"] == {"jump_forward_tokens": 0}
    body = client.post("/v1/completions", headers=AUTH,
                       json={"prompt": "hi", "max_tokens": 4}).json()
    assert body["usage"]["completion_tokens_details"] == {"jump_forward_tokens": 0}


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_continuous_usage_stats(client: TestClient, route: str) -> None:
    body: dict[str, Any] = {"max_tokens": 5, "stream": True, "stream_options": {
        "include_usage": True, "continuous_usage_stats": True}}
    if route == "/v1/chat/completions":
        body["messages"] = [{"role": "user", "content": "hi"}]
    else:
        body["prompt"] = "hi"
    events = _events(client.post(route, headers=AUTH, json=body).text)
    with_choices = [e for e in events if e["choices"]]
    assert all(e["usage"] is not None for e in with_choices)
    counts = [e["usage"]["completion_tokens"] for e in with_choices]
    assert counts == sorted(counts) and counts[-1] == 5
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5
    # Without continuous_usage_stats only the last chunk has usage (OpenAI's behaviour).
    body["stream_options"] = {"include_usage": True}
    events = _events(client.post(route, headers=AUTH, json=body).text)
    assert [e["usage"] is not None for e in events].count(True) == 1
