"""Images and videos from what a request names: bytes in the body, a URL, a local file.

An image source is one of:
- a PIL image or raw bytes (the offline Engine);
- `data:image/...;base64,...` (a data URL);
- `http://...` / `https://...`: downloaded with a time limit and a size limit,
  from public addresses only unless `--allow-private-media-urls`
  (media_fetcher.py, url_policy.py; the server fetches a request's URLs
  before its media reach the worker threads, see processor.py);
- `file://PATH` or a path: read only under `--allowed-local-media-path`, after
  resolving symlinks and `..` (never an arbitrary file of the server);
- anything else: base64 of the file's bytes.

A video is a list of frames (each an image source) or one source naming a
video file, which is decoded (frames sampled evenly) only when PyAV is
installed. Every failure raises ValueError with the reason, which the HTTP
layer answers with a 400 (for URLs one text for every cause: media_fetcher.py).
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import re
from dataclasses import dataclass
from typing import Any

from PIL import Image

from radixlm.multimodal.media_fetcher import MediaFetcher
from radixlm.multimodal.url_policy import URLPolicy

MAX_IMAGE_PIXELS = 64 * 1024 * 1024  # decompression-bomb guard (width * height)
MAX_VIDEO_FRAMES = 32  # most frames of one video (a decoded file is sampled down to it)

_BASE64 = re.compile(r"^[A-Za-z0-9+/]+={0,2}$")


@dataclass(frozen=True)
class MediaLimits:
    allowed_local_path: str | None = None  # None: no local files
    timeout: float = 10.0  # seconds for a whole download
    max_bytes: int = 20 * 1024 * 1024
    allow_private_urls: bool = False  # fetch URLs of loopback / private addresses too

    @classmethod
    def from_server_args(cls, args: Any) -> MediaLimits:
        """From ServerArgs: --allowed-local-media-path, --media-fetch-timeout,
        --max-media-bytes, --allow-private-media-urls."""
        return cls(args.allowed_local_media_path, args.media_fetch_timeout, args.max_media_bytes,
                   args.allow_private_media_urls)


class MediaLoader:
    """Turns image and video sources into RGB PIL images; blocking (run it in a worker)."""

    def __init__(self, limits: MediaLimits) -> None:
        self.limits = limits
        self.allowed_root = (os.path.realpath(limits.allowed_local_path)
                             if limits.allowed_local_path else None)
        self.fetcher = MediaFetcher(URLPolicy(limits.allow_private_urls), limits.timeout,
                                    limits.max_bytes)

    def load_image(self, source: Any) -> Image.Image:
        """An RGB image; raise ValueError saying why the source is not one."""
        if isinstance(source, Image.Image):
            return source.convert("RGB")
        return decode_image(self.read_bytes(source))

    def load_video(self, source: Any, max_frames: int = MAX_VIDEO_FRAMES) -> list[Image.Image]:
        """The frames of a video: a list of image sources, or a source naming a video file."""
        if isinstance(source, list | tuple):
            if not source:
                raise ValueError("A video needs at least one frame")
            return [self.load_image(frame) for frame in source]
        return decode_video(self.read_bytes(source), max_frames)

    def read_bytes(self, source: Any) -> bytes:
        """The bytes a source names (see the module docstring for the forms)."""
        if isinstance(source, bytes | bytearray):
            self._check_size(len(source))
            return bytes(source)
        if not isinstance(source, str):
            raise ValueError(f"An image or video must be given as a string, not "
                             f"{type(source).__name__}")
        source = source.strip()
        if source.startswith("data:"):
            return self._data_url(source)
        if is_url(source):
            return self.fetcher.fetch_sync(source)
        if source.startswith("file://"):
            return self._local_file(source[len("file://"):])
        compact = "".join(source.split())
        if compact and len(compact) % 4 == 0 and _BASE64.match(compact):
            return self._base64(compact)
        return self._local_file(source)

    # ------------------------------------------------------------------ sources

    def _check_size(self, num_bytes: int) -> None:
        if num_bytes > self.limits.max_bytes:
            raise ValueError(f"The media is {num_bytes} bytes, more than the limit of "
                             f"{self.limits.max_bytes} (--max-media-bytes)")

    def _base64(self, text: str) -> bytes:
        self._check_size(len(text) // 4 * 3 - text[-2:].count("="))
        try:
            return base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError) as e:
            raise ValueError(f"The media is not valid base64 ({e})") from e

    def _data_url(self, url: str) -> bytes:
        header, sep, payload = url.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ValueError("A data URL must look like 'data:<mime type>;base64,<data>'")
        return self._base64("".join(payload.split()))

    def _local_file(self, path: str) -> bytes:
        if self.allowed_root is None:
            raise ValueError("Local media paths are not allowed on this server (start it "
                             "with --allowed-local-media-path to allow a folder)")
        real = os.path.realpath(os.path.expanduser(path))
        if os.path.commonpath([real, self.allowed_root]) != self.allowed_root:
            raise ValueError(f"The path {path!r} is outside the allowed media folder")
        if not os.path.isfile(real):
            raise ValueError(f"The media file {path!r} does not exist")
        self._check_size(os.path.getsize(real))
        with open(real, "rb") as f:
            return f.read()


def is_url(source: Any) -> bool:
    """An http(s) URL source (fetched by MediaFetcher)."""
    return isinstance(source, str) and source.strip().lower().startswith(("http://", "https://"))


def decode_image(data: bytes) -> Image.Image:
    """An RGB image from a file's bytes; ValueError for data that is not a whole image."""
    try:
        img = Image.open(io.BytesIO(data))
        if img.width * img.height > MAX_IMAGE_PIXELS:
            raise ValueError(f"The image is {img.width}x{img.height} pixels, more than "
                             f"{MAX_IMAGE_PIXELS} in all")
        img.load()  # decodes everything: a truncated file fails here
        return img.convert("RGB")
    except ValueError:
        raise
    except (OSError, SyntaxError, Image.DecompressionBombError) as e:
        raise ValueError(f"The data is not a valid image: {e}") from e


def decode_video(data: bytes, max_frames: int) -> list[Image.Image]:
    """Up to `max_frames` frames sampled evenly from a video file (needs PyAV)."""
    try:
        import av  # type: ignore[import-not-found]
    except ImportError as e:
        raise ValueError("This server cannot decode video files (PyAV is not installed: "
                         "pip install av); send the video as a list of frames") from e
    try:
        with av.open(io.BytesIO(data)) as container:
            frames = [f.to_image() for f in container.decode(video=0)]
    except Exception as e:  # noqa: BLE001 - any decoder failure is the input's fault
        raise ValueError(f"The data is not a decodable video: {e}") from e
    if not frames:
        raise ValueError("The video has no frames")
    step = max(len(frames) / max_frames, 1.0)
    picked = [frames[int(i * step)] for i in range(min(max_frames, len(frames)))]
    return [f.convert("RGB") for f in picked]
