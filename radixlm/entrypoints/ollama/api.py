"""Ollama's API (`ollama` clients, Open WebUI and other tools built on it).

    POST /api/chat, /api/generate          serving.py (NDJSON streams by default)
    GET  /api/tags, /api/ps, /api/version  models.py
    POST /api/show, /api/embed, /api/embeddings

Errors are Ollama's `{"error": "..."}` with the HTTP status (http/error_shapes.py);
the `model` of a chat or generate request is accepted whatever it names, as on
the OpenAI routes: this server serves one model.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from radixlm.entrypoints.http.state import state_of
from radixlm.entrypoints.ollama import models, serving

router = APIRouter(prefix="/api")


@router.post("/chat")
async def chat(request: Request) -> Response:
    return await serving.chat(request, state_of(request))


@router.post("/generate")
async def generate(request: Request) -> Response:
    return await serving.generate(request, state_of(request))


@router.get("/tags")
async def tags(request: Request) -> Response:
    return models.tags(state_of(request))


@router.get("/ps")
async def ps(request: Request) -> Response:
    return models.ps(state_of(request))


@router.get("/version")
async def version() -> Response:
    return models.version()


@router.post("/show")
async def show(request: Request) -> Response:
    return await models.show(request, state_of(request))


@router.post("/embed")
async def embed(request: Request) -> Response:
    return await models.embed(request, state_of(request))


@router.post("/embeddings")
async def embeddings(request: Request) -> Response:
    return await models.embeddings(request, state_of(request))
