"""Pooling routes: embeddings, classification and reranking (SGLang's shapes).

    POST /v1/embeddings   OpenAI: `input` (a string, strings, token ids or lists of
                          them), `encoding_format` ("float" | "base64": little-endian
                          float32), `dimensions` (Matryoshka models) → {"object": "list",
                          "data": [{"object": "embedding", "embedding", "index"}], "usage"}
    POST /encode          native: {"text" | "input_ids", "rid"} → {"embedding", "meta_info"}
                          (a list for a batch)
    POST /classify        native, for a classifier: the same, `embedding` = label logits
    POST /v1/classify     {"input"} → {"data": [{"index", "label", "probs", "num_classes"}]}
    POST /v1/rerank       {"query", "documents", "top_n", "return_documents"} → a list of
                          {"score", "document", "index", "meta_info"}, best first

Every input is a prefill-only request through the scheduler
(TokenizerManager.encode). A pooling route on a generation server, or a
classifier route on an embedding model, is a 400 that says which server it needs.
"""

from __future__ import annotations

import base64
import math
import time
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request
from starlette.responses import Response

from radixlm.entrypoints.http.errors import APIError, JSONResponse
from radixlm.entrypoints.http.state import ServerState
from radixlm.entrypoints.http.utils import parse_body, race_disconnect
from radixlm.entrypoints.openai.utils import new_id
from radixlm.tokenizer.pooling_input import EmbeddingReqInput
from radixlm.tokenizer.pooling_output import EmbeddingResult, RequestAborted
from radixlm.tokenizer.tokenizer_manager import EngineDeadError

# ---------------------------------------------------------------- requests

PoolingInput = str | list[str] | list[int] | list[list[int]]


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    input: PoolingInput
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None
    rid: str | list[str] | None = None


class NativeEncodeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    rid: str | list[str] | None = None
    dimensions: int | None = Field(None, ge=1)


class ClassifyRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    input: PoolingInput
    model: str | None = None
    user: str | None = None
    rid: str | list[str] | None = None


class RerankRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)

    query: str = Field(min_length=1)
    documents: list[str] = Field(min_length=1)
    top_n: int | None = Field(None, ge=1)
    return_documents: bool = True
    model: str | None = None


# ---------------------------------------------------------------- running


def _input_fields(value: PoolingInput) -> dict[str, Any]:
    """An OpenAI `input` as the native request's `text` or `input_ids`."""
    if isinstance(value, str):
        return {"text": value}
    if value and all(isinstance(x, str) for x in value):
        return {"text": value}
    if not value:
        raise APIError("'input' is empty", param="input")
    return {"input_ids": value}


async def _encode(request: Request, state: ServerState, obj: EmbeddingReqInput
                  ) -> list[EmbeddingResult]:
    tm = state.engine()

    async def run() -> list[EmbeddingResult]:
        try:
            results: list[EmbeddingResult] = await tm.encode(obj)
            return results
        except ValueError as e:
            raise APIError(str(e)) from e
        except RequestAborted as e:
            raise APIError(f"The request was aborted: {e}", 503) from e
        except EngineDeadError as e:
            raise APIError(f"The engine is not running: {e}", 503) from e

    return await race_disconnect(request, run())


def _require_classifier(state: ServerState, route: str) -> int:
    tm = state.engine()
    num_labels = int(tm.model_info.get("num_labels") or 0)
    if not tm.model_info.get("is_generation", True) and num_labels == 0:
        raise APIError(f"{route} needs a classifier (a *ForSequenceClassification "
                       f"checkpoint); this model is served for embeddings")
    return num_labels


def _meta(result: EmbeddingResult, rid: str | None = None) -> dict[str, Any]:
    return {"id": rid, "prompt_tokens": result.prompt_tokens,
            "cached_tokens": result.cached_tokens, "finish_reason": {"type": "length"}}


def _usage(results: list[EmbeddingResult]) -> dict[str, int]:
    tokens = sum(r.prompt_tokens for r in results)
    return {"prompt_tokens": tokens, "total_tokens": tokens}


def _b64(vector: list[float]) -> str:
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode()


# ---------------------------------------------------------------- handlers


async def create_embedding(request: Request, state: ServerState) -> Response:
    """POST /v1/embeddings (also the handler of a batch's /v1/embeddings lines)."""
    state.engine()
    req = await parse_body(request, EmbeddingRequest)
    obj = EmbeddingReqInput(**_input_fields(req.input), rid=req.rid, dimensions=req.dimensions)
    results = await _encode(request, state, obj)
    data = [{"object": "embedding", "index": r.index,
             "embedding": _b64(r.embedding) if req.encoding_format == "base64" else r.embedding}
            for r in results]
    return JSONResponse({"object": "list", "data": data, "model": req.model or state.model_name,
                         "usage": _usage(results)})


async def encode(request: Request, state: ServerState, route: str = "/encode") -> Response:
    """POST /encode and POST /classify (the native shape)."""
    if route == "/classify":
        _require_classifier(state, route)
    body = await parse_body(request, NativeEncodeRequest)
    obj = EmbeddingReqInput(text=body.text, input_ids=body.input_ids, rid=body.rid,
                            dimensions=body.dimensions)
    results = await _encode(request, state, obj)
    singles = obj.normalize()
    outs = [{"embedding": r.embedding, "meta_info": _meta(r, s.rid)}
            for r, s in zip(results, singles)]
    return JSONResponse(outs if obj.is_batch else outs[0])


async def classify(request: Request, state: ServerState) -> Response:
    """POST /v1/classify: per input, the most likely label and every label's probability."""
    num_labels = _require_classifier(state, "/v1/classify")
    req = await parse_body(request, ClassifyRequest)
    results = await _encode(request, state,
                            EmbeddingReqInput(**_input_fields(req.input), rid=req.rid))
    id2label: dict[str, str] = state.tm.model_info.get("id2label") or {}
    data = []
    for r in results:
        probs = _softmax(r.embedding)
        best = max(range(len(probs)), key=probs.__getitem__)
        data.append({"index": r.index, "label": id2label.get(str(best), f"LABEL_{best}"),
                     "probs": probs, "num_classes": num_labels})
    return JSONResponse({"id": new_id("classify"), "object": "list", "created": int(time.time()),
                         "model": req.model or state.model_name, "data": data,
                         "usage": _usage(results)})


async def rerank(request: Request, state: ServerState) -> Response:
    """POST /v1/rerank: a cross-encoder scores each (query, document) pair."""
    num_labels = _require_classifier(state, "/v1/rerank")
    if num_labels != 1:
        raise APIError(f"/v1/rerank needs a reranker with one output label; this classifier "
                       f"has {num_labels}")
    req = await parse_body(request, RerankRequest)
    pairs = [(req.query, doc) for doc in req.documents]
    results = await _encode(request, state, EmbeddingReqInput(text_pairs=pairs))
    activate = _activation(state.tm.model_info)
    ranked = sorted(
        ({"score": activate(r.embedding[0]),
          **({"document": req.documents[r.index]} if req.return_documents else {}),
          "index": r.index, "meta_info": _meta(r)} for r in results),
        key=lambda x: -x["score"])
    return JSONResponse(ranked[: req.top_n] if req.top_n else ranked)


def _softmax(logits: list[float]) -> list[float]:
    top = max(logits)
    exps = [math.exp(x - top) for x in logits]
    total = sum(exps)
    return [e / total for e in exps]


def _activation(model_info: dict[str, Any]) -> Any:
    """A one-label cross-encoder's score: the sigmoid of its logit (sentence-transformers'
    and SGLang's default), unless the config names an identity activation."""
    if "Identity" in str(model_info.get("ce_activation") or ""):
        return float
    return lambda x: 1.0 / (1.0 + math.exp(-x))
