"""ASGI middleware: the API key (401) and the request body size limit (413).

Both are plain ASGI (not Starlette's BaseHTTPMiddleware), so streaming
responses and disconnect detection pass through them untouched.
"""

from __future__ import annotations

import hmac
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixlm.entrypoints.http.errors import APIError, error_body
from radixlm.entrypoints.playground.routes import is_public as is_playground

# Routes a load balancer must reach without a key; the playground's page and assets
# are public too (the page asks for the key and sends it on its API calls).
PUBLIC_PATHS = frozenset({"/health"})


async def send_error(send: Send, status: int, message: str) -> None:
    body = orjson.dumps(error_body(message, status))
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return bytes(value)
    return None


class APIKeyMiddleware:
    """Every route but PUBLIC_PATHS and the playground needs `Authorization: Bearer <api_key>`
    (or `x-api-key: <api_key>`, the header Anthropic's clients send)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()
        self.expected_key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or path in PUBLIC_PATHS or is_playground(path):
            await self.app(scope, receive, send)
            return
        got = header(scope, b"authorization") or b""
        key = header(scope, b"x-api-key")
        if key is not None and not got:
            ok = hmac.compare_digest(key, self.expected_key)
        else:
            ok = hmac.compare_digest(got, self.expected)
        if not ok:
            reason = "Missing" if not got and key is None else "Invalid"
            await send_error(send, 401, f"{reason} API key: send 'Authorization: Bearer <key>' "
                                        "or 'x-api-key: <key>'")
            return
        await self.app(scope, receive, send)


class _TooLarge(APIError):
    """Raised from receive(): the app's APIError handler answers 413 with it."""


class BodySizeLimitMiddleware:
    """Bodies over `max_bytes` get a 413: at once when Content-Length says so, else as
    soon as the streamed (chunked) body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_large = f"The request body is larger than the limit ({self.max_bytes} bytes)"
        length = header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await send_error(send, 413, too_large)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise _TooLarge(too_large, 413)
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracked_send)
        except _TooLarge:
            if not started:
                await send_error(send, 413, too_large)


def install_middleware(app: Any, api_key: str | None, max_request_bytes: int) -> None:
    """Add the size limit, then the key check (which runs first: outermost)."""
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=max_request_bytes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)
