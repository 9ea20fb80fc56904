"""The media loader: every source form, the local-path sandbox, size and time limits.

Downloads are tested against a loopback HTTP server started here (no network).
"""

from __future__ import annotations

import base64
import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from _tiny_llava import data_url, png_bytes
from PIL import Image

from radixlm.multimodal import media_loader
from radixlm.multimodal.media_loader import MediaLimits, MediaLoader

PNG = png_bytes((40, 30))


def _loader(allowed: Path | None = None, max_bytes: int = 1 << 20,
            timeout: float = 5.0) -> MediaLoader:
    return MediaLoader(MediaLimits(str(allowed) if allowed else None, timeout, max_bytes))


def test_base64_data_url_bytes_and_pil() -> None:
    loader = _loader()
    for source in (base64.b64encode(PNG).decode(), data_url(PNG), PNG,
                   Image.new("L", (40, 30))):
        img = loader.load_image(source)
        assert img.size == (40, 30) and img.mode == "RGB"
    wrapped = base64.encodebytes(PNG).decode()  # with newlines every 76 characters
    assert loader.load_image(wrapped).size == (40, 30)


@pytest.mark.parametrize("source, words", [
    (base64.b64encode(b"just some text, no image").decode(), ["not a valid image"]),
    (base64.b64encode(PNG[: len(PNG) // 2]).decode(), ["not a valid image"]),
    ("data:image/png," + base64.b64encode(PNG).decode(), ["data URL"]),
    ("data:image/png;base64,@@@@", ["not valid base64"]),
    ("/etc/passwd", ["not allowed", "--allowed-local-media-path"]),
    ("file:///etc/hostname", ["not allowed"]),
])
def test_bad_sources_raise_value_error(source: str, words: list[str]) -> None:
    with pytest.raises(ValueError) as e:
        _loader().load_image(source)
    for w in words:
        assert w in str(e.value)


def test_truncated_png_bytes() -> None:
    with pytest.raises(ValueError, match="not a valid image"):
        _loader().load_image(PNG[:-20])


def test_size_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    small = _loader(tmp_path, max_bytes=len(PNG) - 1)
    for source in (PNG, base64.b64encode(PNG).decode(), data_url(PNG)):
        with pytest.raises(ValueError, match="--max-media-bytes"):
            small.load_image(source)
    (tmp_path / "a.png").write_bytes(PNG)
    with pytest.raises(ValueError, match="--max-media-bytes"):
        small.load_image(str(tmp_path / "a.png"))
    monkeypatch.setattr(media_loader, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ValueError, match="pixels"):
        _loader().load_image(PNG)


def test_local_paths_only_inside_the_allowed_folder(tmp_path: Path) -> None:
    allowed = tmp_path / "media"
    (allowed / "sub").mkdir(parents=True)
    (allowed / "sub" / "cat.png").write_bytes(PNG)
    outside = tmp_path / "secret.png"
    outside.write_bytes(PNG)
    os.symlink(outside, allowed / "link.png")  # inside the folder, pointing out of it
    os.symlink(allowed / "sub" / "cat.png", allowed / "inner.png")
    loader = _loader(allowed)

    for ok in (allowed / "sub" / "cat.png", f"file://{allowed}/sub/cat.png",
               allowed / "inner.png", allowed / "sub" / ".." / "sub" / "cat.png"):
        assert loader.load_image(str(ok)).size == (40, 30)
    for bad in (outside, allowed / ".." / "secret.png", allowed / "link.png",
                f"file://{allowed}/../secret.png"):
        with pytest.raises(ValueError, match="outside the allowed media folder"):
            loader.load_image(str(bad))
    with pytest.raises(ValueError, match="does not exist"):
        loader.load_image(str(allowed / "missing.png"))
    # A sibling folder whose name starts like the allowed one is still outside.
    (tmp_path / "media2").mkdir()
    (tmp_path / "media2" / "x.png").write_bytes(PNG)
    with pytest.raises(ValueError, match="outside"):
        loader.load_image(str(tmp_path / "media2" / "x.png"))


def test_video_frames_and_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    loader = _loader()
    frames = loader.load_video([data_url(png_bytes(color=(0, c, 0))) for c in (0, 80, 160)])
    assert [f.size for f in frames] == [(40, 30)] * 3
    with pytest.raises(ValueError, match="at least one frame"):
        loader.load_video([])
    monkeypatch.setitem(__import__("sys").modules, "av", None)  # no decoder installed
    with pytest.raises(ValueError, match="cannot decode video files"):
        loader.load_video(base64.b64encode(b"\x00\x00\x00\x18ftypmp42").decode())


# ---------------------------------------------------------------- downloads


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        try:
            self._answer()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (size or time limit), as the test wants

    def _answer(self) -> None:
        if self.path == "/cat.png":
            self._send(PNG)
        elif self.path == "/big.png":
            self._send(b"\0" * 5000)
        elif self.path == "/undeclared.png":  # no Content-Length: the stream is counted
            self.send_response(200)
            self.end_headers()
            for _ in range(10):
                self.wfile.write(b"\0" * 1000)
        elif self.path == "/slow.png":
            time.sleep(1.5)
            self._send(PNG)
        else:
            self.send_response(404)
            self.end_headers()

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    _Handler.protocol_version = "HTTP/1.0"
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_download(server_url: str) -> None:
    loader = _loader(max_bytes=4096, timeout=0.5)
    assert loader.load_image(server_url + "/cat.png").size == (40, 30)
    with pytest.raises(ValueError, match="5000 bytes, more than the limit"):
        loader.load_image(server_url + "/big.png")
    with pytest.raises(ValueError, match="more than the limit of 4096 bytes"):
        loader.load_image(server_url + "/undeclared.png")
    with pytest.raises(ValueError, match="HTTP 404"):
        loader.load_image(server_url + "/nothing.png")
    with pytest.raises(ValueError, match="--media-fetch-timeout"):
        loader.load_image(server_url + "/slow.png")
    with pytest.raises(ValueError, match="failed"):
        loader.load_image("http://127.0.0.1:1/x.png")  # nothing listens on port 1
