"""Ollama's model routes and embeddings, for the one model this server serves.

    GET  /api/version       {"version"}: the Ollama API version these routes follow
    GET  /api/tags          the served model (Ollama's `name:tag`; ":latest" added)
    GET  /api/ps            the same, as a loaded model with its context length
    POST /api/show          {"model"} → details, model_info, capabilities, parameters
                            (404 for another model)
    POST /api/embed         {"model", "input": str | [str], "truncate", "dimensions"}
                            → {"embeddings": [[...]], ...} on an embedding server
    POST /api/embeddings    {"model", "prompt"} → {"embedding": [...]} (the older form)

`capabilities`: "completion" (a generation model) or "embedding", plus
"tools", "thinking" (with --reasoning-parser) and "vision" where they apply.
`truncate: false` makes an input longer than the context a 400; with the
default (true) it is cut to the context, as Ollama does.
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from radixlm.entrypoints.http.errors import APIError, JSONResponse
from radixlm.entrypoints.http.state import ServerState
from radixlm.entrypoints.http.utils import parse_body
from radixlm.entrypoints.ollama.protocol import EmbeddingsRequest, EmbedRequest, ShowRequest
from radixlm.entrypoints.openai.agents import template_source
from radixlm.entrypoints.openai.serving_embedding import _encode
from radixlm.tokenizer.pooling_input import EmbeddingReqInput

# The Ollama version whose API these routes follow; clients gate features on it
# (`think` needs 0.9, tool call ids and `tool_name` 0.12).
OLLAMA_API_VERSION = "0.12.6"
_STARTED = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def tagged(name: str) -> str:
    """Ollama's `model:tag` form of a name (":latest" unless it has a tag)."""
    return name if ":" in name.rsplit("/", 1)[-1] else f"{name}:latest"


def _details(state: ServerState) -> dict[str, Any]:
    archs = list(state.tm.model_info.get("architectures") or [])
    family = archs[0].removesuffix("ForCausalLM").removesuffix("Model").lower() if archs else ""
    return {"parent_model": "", "format": "safetensors", "family": family,
            "families": [family] if family else None, "parameter_size": "",
            "quantization_level": ""}


def _entry(state: ServerState) -> dict[str, Any]:
    name = tagged(state.model_name)
    return {"name": name, "model": name, "modified_at": _STARTED, "size": 0,
            "digest": hashlib.sha256(name.encode()).hexdigest(), "details": _details(state)}


def version() -> Response:
    return JSONResponse({"version": OLLAMA_API_VERSION})


def tags(state: ServerState) -> Response:
    state.engine()
    return JSONResponse({"models": [_entry(state)]})


def ps(state: ServerState) -> Response:
    state.engine()
    return JSONResponse({"models": [{**_entry(state), "expires_at": "2999-12-31T00:00:00Z",
                                     "size_vram": 0, "context_length": state.context_length}]})


def capabilities(state: ServerState) -> list[str]:
    if not state.is_generation:
        return ["embedding"]
    caps = ["completion", "tools"]
    if state.agents is not None and state.agents.reasoning_parser is not None:
        caps.append("thinking")
    if state.tm.mm_processor.image_token is not None:
        caps.append("vision")
    return caps


async def show(request: Request, state: ServerState) -> Response:
    state.engine()
    req = await parse_body(request, ShowRequest)
    wanted = req.model or req.name or ""
    if tagged(wanted) != tagged(state.model_name):
        raise APIError(f"model '{wanted}' not found", 404, param="model")
    details = _details(state)
    arch = details["family"] or "unknown"
    info = dict(state.tm.model_info)
    template = (template_source(state.chat_template, state.tm.tokenizer) or ""
                if state.chat_template is not None and state.tm.tokenizer is not None else "")
    return JSONResponse({
        "license": "", "modelfile": f"FROM {state.args.model_path or state.model_name}\n",
        "parameters": f"num_ctx {state.context_length}",
        "template": template,  # the chat template's Jinja text
        "details": details, "modified_at": _STARTED, "capabilities": capabilities(state),
        "model_info": {"general.architecture": arch,
                       f"{arch}.context_length": state.context_length,
                       f"{arch}.vocab_size": info.get("vocab_size")},
    })


async def _embed(request: Request, state: ServerState, texts: list[str], truncate: bool,
                 dimensions: int | None) -> tuple[list[list[float]], int]:
    if state.is_generation:
        raise APIError("this model does not support embeddings: serve an embedding model "
                       "(e.g. a *Model or sentence-transformers checkpoint)")
    if not texts:
        raise APIError("input is empty", param="input")
    tm = state.engine()
    if truncate and state.context_length:
        ids = await tm.tokenizer_workers.run(_truncated, tm.tokenizer, texts,
                                             state.context_length)
        obj = EmbeddingReqInput(input_ids=ids, dimensions=dimensions)
    else:
        obj = EmbeddingReqInput(text=texts, dimensions=dimensions)
    results = await _encode(request, state, obj)
    results.sort(key=lambda r: r.index)
    return [r.embedding for r in results], sum(r.prompt_tokens for r in results)


def _truncated(tokenizer: Any, texts: list[str], limit: int) -> list[list[int]]:
    """Each text's ids, cut to `limit` (blocking: runs in a tokenizer worker)."""
    return [list(tokenizer.encode(t))[:limit] for t in texts]


async def embed(request: Request, state: ServerState) -> Response:
    start_ns = time.monotonic_ns()
    req = await parse_body(request, EmbedRequest)
    texts = [req.input] if isinstance(req.input, str) else req.input
    vectors, num_tokens = await _embed(request, state, texts, req.truncate, req.dimensions)
    return JSONResponse({"model": req.model, "embeddings": vectors,
                         "total_duration": time.monotonic_ns() - start_ns, "load_duration": 0,
                         "prompt_eval_count": num_tokens})


async def embeddings(request: Request, state: ServerState) -> Response:
    req = await parse_body(request, EmbeddingsRequest)
    vectors, _ = await _embed(request, state, [req.prompt], True, None)
    return JSONResponse({"embedding": vectors[0]})
