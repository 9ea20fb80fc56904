"""The media loader: every source form, the local-path sandbox, size and time limits.

Downloads are tested against a loopback HTTP server started here (no network).
"""

from __future__ import annotations

import base64
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from _tiny_llava import data_url, png_bytes
from PIL import Image

from radixlm.multimodal import media_loader
from radixlm.multimodal.media_fetcher import MediaFetchError
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


class _PNGHandler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(200)
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG)


def test_urls_go_through_the_fetcher() -> None:
    """URLs are fetched by MediaFetcher (test_media_fetcher.py covers it): from a
    loopback address only with the opt-in."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _PNGHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/cat.png"
    try:
        with pytest.raises(MediaFetchError):
            _loader().load_image(url)
        allowed = MediaLoader(MediaLimits(allow_private_urls=True))
        assert allowed.load_image(url).size == (40, 30)
        assert allowed.load_image(url.replace("http", "HTTP", 1)).size == (40, 30)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
