"""The OpenAI-compatible routes (a translation layer over the native request).

    GET  /v1/models, /v1/models/{id}   the served model (404 model_not_found otherwise)
    POST /v1/completions               see serving_completions.py
    POST /v1/chat/completions          see serving_chat.py
    POST /v1/responses                 see serving_responses.py
    GET, DELETE /v1/responses/{id}     a stored response
    POST /v1/tokenize                  {"prompt": str | [str]} → {"tokens", "count", ...}
    POST /v1/detokenize                {"tokens": [int] | [[int]]} → {"text"}
    POST /v1/embeddings, /v1/classify, /v1/rerank   pooling models: see serving_embedding.py
    /v1/files, /v1/batches             the Batch API: see batch_api.py

The `model` field of a request is accepted whatever it names (as in SGLang):
this server serves one model.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from radixlm.entrypoints.http.errors import APIError, JSONResponse
from radixlm.entrypoints.http.state import state_of
from radixlm.entrypoints.http.utils import parse_body
from radixlm.entrypoints.openai.protocol import (
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
)
from radixlm.entrypoints.openai.serving_chat import create_chat_completion
from radixlm.entrypoints.openai.serving_completions import create_completion
from radixlm.entrypoints.openai.serving_embedding import classify, create_embedding, rerank
from radixlm.entrypoints.openai.serving_responses import (
    create_response,
    delete_response,
    retrieve_response,
)

router = APIRouter(prefix="/v1")


def _card(request: Request) -> ModelCard:
    state = state_of(request)
    state.engine()
    return ModelCard(id=state.model_name, root=state.args.model_path or state.tm.model_dir,
                     max_model_len=state.context_length or None)


@router.get("/models")
async def list_models(request: Request) -> Response:
    return JSONResponse(ModelList(data=[_card(request)]).model_dump())


@router.get("/models/{model_id:path}")
async def retrieve_model(model_id: str, request: Request) -> Response:
    card = _card(request)
    if model_id != card.id:
        raise APIError(f"The model '{model_id}' does not exist", 404, param="model",
                       code="model_not_found", err_type="NotFoundError")
    return JSONResponse(card.model_dump())


@router.post("/completions")
async def completions(request: Request) -> Response:
    return await create_completion(request, state_of(request))


@router.post("/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await create_chat_completion(request, state_of(request))


@router.post("/embeddings")
async def embeddings(request: Request) -> Response:
    return await create_embedding(request, state_of(request))


@router.post("/classify")
async def classify_v1(request: Request) -> Response:
    return await classify(request, state_of(request))


@router.post("/rerank")
async def rerank_v1(request: Request) -> Response:
    return await rerank(request, state_of(request))


@router.post("/responses")
async def responses(request: Request) -> Response:
    return await create_response(request, state_of(request))


@router.get("/responses/{response_id}")
async def get_response(response_id: str, request: Request) -> Response:
    return await retrieve_response(response_id, state_of(request))


@router.delete("/responses/{response_id}")
async def forget_response(response_id: str, request: Request) -> Response:
    return await delete_response(response_id, state_of(request))


@router.post("/tokenize")
async def tokenize(request: Request) -> Response:
    state = state_of(request)
    tm = state.tokenizer_engine("/v1/tokenize")
    req = await parse_body(request, TokenizeRequest)
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    tokens = [await tm.tokenizer_workers.encode(p, req.add_special_tokens) for p in prompts]
    if isinstance(req.prompt, str):
        return JSONResponse({"tokens": tokens[0], "count": len(tokens[0]),
                             "max_model_len": state.context_length})
    return JSONResponse({"tokens": tokens, "count": [len(t) for t in tokens],
                         "max_model_len": state.context_length})


@router.post("/detokenize")
async def detokenize(request: Request) -> Response:
    tm = state_of(request).tokenizer_engine("/v1/detokenize")
    req = await parse_body(request, DetokenizeRequest)
    single = not req.tokens or isinstance(req.tokens[0], int)
    batch: list[list[int]] = [req.tokens] if single else req.tokens  # type: ignore[list-item,assignment]
    vocab_size = int(tm.model_info.get("vocab_size") or len(tm.tokenizer))
    for ids in batch:
        bad = next((t for t in ids if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(f"Token id {bad} is outside the vocabulary (size {vocab_size})",
                           param="tokens")
    texts = [await tm.tokenizer_workers.decode(ids, req.skip_special_tokens) for ids in batch]
    return JSONResponse({"text": texts[0] if single else texts})
