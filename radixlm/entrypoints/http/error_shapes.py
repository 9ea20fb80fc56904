"""Errors in the shape of the API a route belongs to.

Every error in the server is first an OpenAI error body (`errors.py`):
the route handlers, request validation, the API key and body size checks,
the cross-site checks and unknown paths all answer with it. The Anthropic
and Ollama routes answer in their own APIs' shapes, whatever raised the
error, so this outermost ASGI middleware rewrites a JSON error response on
their paths:

    /v1/messages...  {"type": "error", "error": {"type": "invalid_request_error",
                      "message": ...}}                             (Anthropic)
    /api/...         {"error": "..."}                              (Ollama)

The status code and the other headers are kept. Streaming responses (200)
pass through untouched: their error events are written by each API's own
stream translator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# An error body maker: (status, message) -> the API's error body.
ShapeFn = Callable[[int, str], dict[str, Any]]

# Anthropic's error types by HTTP status (its API's documented pairs).
ANTHROPIC_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def anthropic_error_body(status: int, message: str) -> dict[str, Any]:
    err_type = ANTHROPIC_ERROR_TYPES.get(status, "api_error" if status >= 500
                                         else "invalid_request_error")
    return {"type": "error", "error": {"type": err_type, "message": message}}


def ollama_error_body(status: int, message: str) -> dict[str, Any]:
    del status  # the status line carries it
    return {"error": message}


def shape_for(path: str) -> ShapeFn | None:
    """The error shape of the API `path` belongs to (None: OpenAI's, unchanged)."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return anthropic_error_body
    if path.startswith("/api/"):
        return ollama_error_body
    return None


def _message_of(body: bytes) -> str | None:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if isinstance(data, dict) and data.get("object") == "error":
        return str(data.get("message", ""))
    return None


class ErrorShapeMiddleware:
    """Rewrites OpenAI error bodies on the Anthropic and Ollama paths (see the module
    docstring). Only error responses are buffered; everything else streams through."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        shape = shape_for(scope.get("path", "")) if scope["type"] == "http" else None
        if shape is None:
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        chunks: list[bytes] = []
        started = False  # a response start went out

        async def reshaping_send(message: Message) -> None:
            nonlocal start, started
            if message["type"] == "http.response.start":
                if message["status"] < 400 or not _is_json(message):
                    started = True
                    await send(message)
                    return
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                await send(message)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                started = True
                await _send_reshaped(send, start, b"".join(chunks), shape)

        try:
            await self.app(scope, receive, reshaping_send)
        except Exception as e:
            # NOTE: an unexpected failure is answered by Starlette's outermost handler,
            # outside this middleware; answer it here in the API's shape instead (the
            # handler then only re-raises, and the traceback is logged as before).
            if not started:
                body = orjson.dumps(shape(500, f"Internal server error: {type(e).__name__}"))
                await send({"type": "http.response.start", "status": 500, "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
            raise


def _is_json(start: Message) -> bool:
    for key, value in start.get("headers", []):
        if key.lower() == b"content-type":
            return bytes(value).startswith(b"application/json")
    return False


async def _send_reshaped(send: Send, start: Message, body: bytes, shape: ShapeFn) -> None:
    message = _message_of(body)
    if message is not None:
        body = orjson.dumps(shape(int(start["status"]), message))
    headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({**start, "headers": headers})
    await send({"type": "http.response.body", "body": body})
