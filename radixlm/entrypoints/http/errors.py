"""Every error the service returns, in the OpenAI error body.

    {"object": "error", "message": ..., "type": ..., "param": ..., "code": ...}

On the Responses API's routes (/v1/responses...) the body has that API's shape,
`{"error": {"message", "type", "param", "code"}}` (as OpenAI and SGLang send it).

`install_error_handlers` routes FastAPI's validation errors, Starlette's HTTP
errors (404, 405) and anything unexpected through this body, so a client never
sees FastAPI's 422 or a traceback: bad input is a 400 that names the problem,
an unexpected failure is a 500 with a one-line message (the traceback goes to
the log). No message shows source paths, memory addresses or tracebacks that a
library's exception text may hold (`public_error_text`).
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from radixlm.utils import public_error_text

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestTooLargeError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class JSONResponse(Response):
    """orjson-encoded JSON (NaN and ±inf become null, as JSON has no such numbers)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


class ClientDisconnected(Exception):
    """The client went away before its response was ready (nothing is sent)."""


class APIError(Exception):
    """An error to answer with: raise it anywhere under a route."""

    def __init__(self, message: str, status_code: int = 400, param: str | None = None,
                 code: str | int | None = None, err_type: str | None = None) -> None:
        message = public_error_text(message)
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.code = code if code is not None else status_code
        self.err_type = err_type or _TYPES.get(status_code) or HTTPStatus(status_code).phrase


def error_body(message: str, status_code: int = 400, param: str | None = None,
               code: str | int | None = None, err_type: str | None = None) -> dict[str, Any]:
    e = APIError(message, status_code, param, code, err_type)
    return {"object": "error", "message": e.message, "type": e.err_type, "param": e.param,
            "code": e.code}


def error_response(message: str, status_code: int = 400, param: str | None = None,
                   code: str | int | None = None, err_type: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status_code, param, code, err_type),
                          status_code=status_code)


def describe_validation_errors(errors: list[Any], located: bool = True
                               ) -> tuple[str, str | None]:
    """(message, param) for pydantic / FastAPI validation errors, e.g.
    ("messages: List should have at least 1 item after validation, not 0", "messages").

    `located`: FastAPI's errors start with where the value was ("body", "query",
    "path"), which is dropped; a model's own errors do not (a field may be named
    "query")."""
    parts = []
    first_param = None
    for err in errors[:5]:
        loc = [str(x) for x in err.get("loc", ())]
        if located and loc and loc[0] in ("body", "query", "path"):
            loc = loc[1:]
        # Unions report one error per member; their tags ("str", "list[int]") say little.
        loc = [x for x in loc if not _is_union_tag(x)]
        param = ".".join(loc) or None
        first_param = first_param or param
        msg = err.get("msg", "invalid value")
        if err.get("type") == "value_error" and "error" in err.get("ctx", {}):
            msg = str(err["ctx"]["error"])  # our validators' own words, without "Value error, "
        if err.get("type") == "json_invalid":
            msg = f"Malformed JSON: {err.get('ctx', {}).get('error', msg)}"
        parts.append(f"{param}: {msg}" if param else msg)
    if len(errors) > 5:
        parts.append(f"... and {len(errors) - 5} more")
    return "; ".join(dict.fromkeys(parts)), first_param


def _is_union_tag(x: str) -> bool:
    return any(c in x for c in "[]") or x in {"str", "int", "float", "bool", "dict",
                                               "function-after", "function-before"}


def validation_error(e: ValidationError) -> APIError:
    message, param = describe_validation_errors(e.errors(), located=False)
    return APIError(message, 400, param)


def responses_error_response(e: APIError) -> JSONResponse:
    """The Responses API's error body: `{"error": {message, type, param, code}}`."""
    kind = "invalid_request_error" if e.status_code < 500 else "server_error"
    return JSONResponse({"error": {"message": e.message, "type": kind, "param": e.param,
                                   "code": e.status_code}}, status_code=e.status_code)


def _answer(request: Request, message: str, status_code: int = 400, param: str | None = None,
            code: str | int | None = None, err_type: str | None = None) -> JSONResponse:
    """The error in the shape of the API the request was for."""
    if request.url.path.startswith("/v1/responses"):
        return responses_error_response(APIError(message, status_code, param, code, err_type))
    return error_response(message, status_code, param, code, err_type)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError) -> JSONResponse:
        return _answer(request, e.message, e.status_code, e.param, e.code, e.err_type)

    @app.exception_handler(RequestValidationError)
    async def _request_validation(request: Request, e: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_errors(list(e.errors()))
        return _answer(request, message, 400, param)

    @app.exception_handler(ValidationError)
    async def _validation(request: Request, e: ValidationError) -> JSONResponse:
        err = validation_error(e)
        return _answer(request, err.message, 400, err.param)

    @app.exception_handler(ClientDisconnected)
    async def _gone(_: Request, e: ClientDisconnected) -> Response:
        return Response(status_code=499)  # nginx's "client closed request"; never read

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return _answer(request, str(e.detail), e.status_code)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, e: Exception) -> JSONResponse:
        # NOTE: Starlette re-raises after answering, so uvicorn logs the traceback.
        return _answer(request, f"Internal server error: {type(e).__name__}", 500)
