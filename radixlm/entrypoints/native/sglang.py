"""Routes under the names SGLang's clients call (SGLang's http_server.py).

    POST /tokenize, /detokenize  the same bodies and answers as /v1/tokenize, /v1/detokenize
    GET  /server_info            SGLang's newer name of /get_server_info
    GET  /model_info             SGLang's newer name of /get_model_info
    POST /v1/score               label-token probabilities for query x items

Scoring (SGLang's `ScoringRequest` for a causal LM): each item is joined to
the query (`query + item`, or `item + query` with `item_first`; token-id
lists are concatenated), and the score of a label token is the probability
that it comes next: exp(logprob), or with `apply_softmax` a softmax over the
labels' logprobs divided by `temperature`. Here the logprob comes from the
prompt logprobs of `prompt + [label]` at its last position; the prompts of
one item share the prefix cache, so each label costs about one token.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import APIRouter, Request
from pydantic import ConfigDict, Field
from starlette.responses import Response

from radixlm.entrypoints.http.errors import APIError, JSONResponse
from radixlm.entrypoints.http.state import state_of
from radixlm.entrypoints.http.strict import StrictModel
from radixlm.entrypoints.http.utils import collect, parse_body
from radixlm.entrypoints.native.api import get_model_info, get_server_info
from radixlm.entrypoints.openai import api as openai_api
from radixlm.tokenizer.request_input import GenerateReqInput

router = APIRouter()

router.add_api_route("/tokenize", openai_api.tokenize, methods=["POST"])
router.add_api_route("/detokenize", openai_api.detokenize, methods=["POST"])
router.add_api_route("/server_info", get_server_info, methods=["GET"])
router.add_api_route("/model_info", get_model_info, methods=["GET"])

MAX_SCORE_ROWS = 4096  # items x labels in one request


class ScoringRequest(StrictModel):
    model_config = ConfigDict(extra="ignore")

    model: str | None = None
    query: str | list[int] | None = None
    items: str | list[str] | list[list[int]]
    label_token_ids: list[int] | list[list[int]]
    apply_softmax: bool = False
    temperature: float = Field(1.0, gt=0.0)
    item_first: bool = False
    return_token_logprobs: bool = False


def _prompts(req: ScoringRequest) -> list[str] | list[list[int]]:
    """Each item joined to the query, as text or as token ids."""
    items: list[Any] = [req.items] if isinstance(req.items, str) else list(req.items)
    as_text = all(isinstance(i, str) for i in items)
    query = req.query if req.query is not None else ("" if as_text else [])
    if as_text != isinstance(query, str):
        raise APIError("query and items must both be text or both be token ids", param="items")
    if as_text:
        return [f"{i}{query}" if req.item_first else f"{query}{i}" for i in items]
    query_ids: list[int] = list(query)  # type: ignore[arg-type]
    return [list(i) + query_ids if req.item_first else query_ids + list(i) for i in items]


def _labels(req: ScoringRequest, num_items: int, vocab_size: int) -> list[list[int]]:
    raw = req.label_token_ids
    if not raw:
        raise APIError("label_token_ids must be a nonempty list", param="label_token_ids")
    per_item: list[list[int]]
    if isinstance(raw[0], list):
        if len(raw) != num_items:
            raise APIError("label_token_ids must have one list per item", param="label_token_ids")
        per_item = raw  # type: ignore[assignment]
    else:
        per_item = [raw] * num_items  # type: ignore[list-item]
    for labels in per_item:
        if not labels:
            raise APIError("each item must have a nonempty candidate list",
                           param="label_token_ids")
        if len(set(labels)) != len(labels):
            raise APIError("label_token_ids must not contain duplicate tokens",
                           param="label_token_ids")
        bad = next((t for t in labels if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(f"Token ID {bad} is out of vocabulary (vocab size: {vocab_size})",
                           param="label_token_ids")
    return per_item


def _scores(logprobs: list[float], apply_softmax: bool, temperature: float) -> list[float]:
    if not apply_softmax:
        return [math.exp(x) for x in logprobs]
    top = max(logprobs)
    weights = [math.exp((x - top) / temperature) for x in logprobs]
    total = sum(weights)
    return [w / total for w in weights]


def _label_logprob(entries: list[Any] | None) -> float:
    """The logprob of the label, the last prompt token (-inf if it has none)."""
    last = entries[-1] if entries else None
    return float(last[0]) if last is not None and last[0] is not None else -math.inf


@router.post("/v1/score")
async def score(request: Request) -> Response:
    state = state_of(request)
    tm = state.engine()
    req = await parse_body(request, ScoringRequest)
    if req.temperature != 1.0 and not req.apply_softmax:
        raise APIError("temperature requires apply_softmax=True", param="temperature")
    prompts = _prompts(req)
    vocab_size = int(tm.model_info.get("vocab_size") or len(tm.tokenizer))
    labels = _labels(req, len(prompts), vocab_size)
    if sum(len(ls) for ls in labels) > MAX_SCORE_ROWS:
        raise APIError(f"At most {MAX_SCORE_ROWS} item x label pairs per request",
                       param="label_token_ids")
    if not prompts:  # no items: nothing to score (as SGLang answers)
        return JSONResponse(_score_body(req, state.model_name, [], [], 0))
    prompt_ids = [p if isinstance(p, list) else await tm.tokenizer_workers.encode(p)
                  for p in prompts]
    if any(not ids for ids in prompt_ids):
        raise APIError("A query + item prompt is empty", param="items")
    rows = [(ids, label) for ids, ls in zip(prompt_ids, labels) for label in ls]
    obj = GenerateReqInput(
        input_ids=[ids + [label] for ids, label in rows],
        sampling_params={"max_new_tokens": 0},
        return_logprob=True,
        logprob_start_len=[len(ids) for ids, _ in rows],
        return_text_in_logprobs=False,
    )
    outs = sorted(await collect(request, tm.generate(obj)), key=lambda o: o.index)
    logprobs = [_label_logprob(o.input_token_logprobs) for o in outs]
    scores: list[list[float]] = []
    token_logprobs: list[list[float]] = []
    start = 0
    for ls in labels:
        lps = logprobs[start : start + len(ls)]
        start += len(ls)
        scores.append(_scores(lps, req.apply_softmax, req.temperature))
        token_logprobs.append(lps)
    num_prompt = sum(len(ids) for ids in prompt_ids)
    return JSONResponse(_score_body(req, state.model_name, scores, token_logprobs, num_prompt))


def _score_body(req: ScoringRequest, model_name: str, scores: list[list[float]],
                token_logprobs: list[list[float]], num_prompt: int) -> dict[str, Any]:
    return {
        "scores": scores,
        "token_logprobs": token_logprobs if req.return_token_logprobs else None,
        "model": req.model or model_name,
        "usage": {"prompt_tokens": num_prompt, "completion_tokens": 0,
                  "total_tokens": num_prompt},
        "object": "scoring",
    }
