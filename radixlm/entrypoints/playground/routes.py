"""The web playground: a single page at `GET /`, its assets under `/playground/`.

    GET /                      static/index.html
    GET /playground/<name>     static/<name> (only the files shipped there)

The files are plain HTML, CSS and JavaScript shipped inside the package
(pyproject's package-data): no CDN, no build step. They are public (the page
asks for the API key itself and sends it with every API call it makes); the
API routes keep their key check.

# NOTE: the page renders model output as text only (DOM nodes built with
# textContent). The Content-Security-Policy is the second wall: no inline
# script, no script from anywhere but this server, no plugins, no framing, so
# even markup that slipped through could not run.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from starlette.responses import Response

from radixlm.entrypoints.http.errors import APIError

router = APIRouter()

ASSET_PREFIX = "/playground/"
PUBLIC_PATHS = frozenset({"/", "/favicon.ico"})  # plus every path under ASSET_PREFIX

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def is_public(path: str) -> bool:
    """Paths that need no API key: the page and its assets."""
    return path in PUBLIC_PATHS or path.startswith(ASSET_PREFIX)


@cache
def _assets() -> dict[str, tuple[bytes, str]]:
    """name → (content, media type), read once from the package's static folder."""
    folder = resources.files("radixlm.entrypoints.playground") / "static"
    out = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _MEDIA_TYPES:
            out[entry.name] = (entry.read_bytes(), _MEDIA_TYPES[suffix])
    return out


def _serve(name: str) -> Response:
    asset = _assets().get(name)
    if asset is None:
        raise APIError(f"No playground file {name!r}", 404, err_type="NotFoundError")
    content, media_type = asset
    return Response(content, media_type=media_type, headers=_HEADERS)


@router.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
async def index() -> Response:
    return _serve("index.html")


@router.api_route("/favicon.ico", methods=["GET", "HEAD"], include_in_schema=False)
async def favicon() -> Response:
    return _serve("icon.svg")


@router.api_route(ASSET_PREFIX + "{name}", methods=["GET", "HEAD"], include_in_schema=False)
async def asset(name: str) -> Response:
    return _serve(name)
