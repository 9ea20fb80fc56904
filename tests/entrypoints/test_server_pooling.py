"""End to end: embeddings, classification and reranking on tiny Qwen2 checkpoints.

Two real servers: one on a `Qwen2Model` embedding checkpoint (sentence-transformers'
last-token pooling and Normalize, as gte-Qwen2), one on a one-label
`Qwen2ForSequenceClassification` (a reranker). Vectors and logits are compared
with transformers on the same folders within 1e-4; the `openai` client drives
/v1/embeddings; every wrong route for the model is a 400 that says why.
"""

from __future__ import annotations

import base64
import math
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np
import openai
import pytest
import torch
from _server_process import ServerProcess
from _tiny_checkpoints import (
    build_qwen2,
    byte_tokenizer,
    load_reference,
    reference_embedding,
    reference_logits,
)

ATOL = 1e-4
TEXTS = ["The quick brown fox", "jumps over the lazy dog", "A third, longer sentence here."]


class Served(NamedTuple):
    http: httpx.Client
    ref: Any  # transformers' model on the same folder


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return byte_tokenizer()


def _serve(root: Path, kind: str, *flags: str) -> Iterator[Served]:
    extra = {"num_labels": 1} if kind == "classifier" else {}
    path = build_qwen2(root / "model", kind, seed=3, **extra)
    srv = ServerProcess(root / "server.log", "--model-path", str(path), *flags)
    try:
        srv.wait_healthy()
        with httpx.Client(base_url=srv.url, timeout=60) as http:
            yield Served(http, load_reference(path, kind))
        assert srv.stop() == 0, srv.log_tail()
    finally:
        srv.stop(signal.SIGKILL, timeout=1)


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("embedding"), "embedding")


@pytest.fixture(scope="module")
def classifier(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("classifier"), "classifier", "--max-running-requests", "4")


def _oai(http: httpx.Client) -> openai.OpenAI:
    return openai.OpenAI(base_url=str(http.base_url).rstrip("/") + "/v1", api_key="none",
                         max_retries=0)


def _close(actual: list[float], expected: torch.Tensor) -> None:
    torch.testing.assert_close(torch.tensor(actual), expected.float(), atol=ATOL, rtol=ATOL)


# ---------------------------------------------------------------- embeddings


def test_openai_embeddings_equal_transformers(embedder: Served, tokenizer: Any) -> None:
    client = _oai(embedder.http)
    one = client.embeddings.create(model="m", input=TEXTS[0])  # the client asks for base64
    assert len(one.data) == 1 and one.data[0].index == 0
    _close(one.data[0].embedding, reference_embedding(embedder.ref, tokenizer.encode(TEXTS[0])))
    assert one.usage.prompt_tokens == len(tokenizer.encode(TEXTS[0]))
    many = client.embeddings.create(model="m", input=TEXTS, encoding_format="float")
    assert [d.index for d in many.data] == [0, 1, 2]
    for d, text in zip(many.data, TEXTS):
        _close(d.embedding, reference_embedding(embedder.ref, tokenizer.encode(text)))
        assert math.isclose(float(np.linalg.norm(d.embedding)), 1.0, rel_tol=1e-5)
    ids = [tokenizer.encode(t) for t in TEXTS[:2]]
    by_ids = client.embeddings.create(model="m", input=ids)
    for d, seq in zip(by_ids.data, ids):
        _close(d.embedding, reference_embedding(embedder.ref, seq))
    single_ids = client.embeddings.create(model="m", input=ids[0])
    _close(single_ids.data[0].embedding, reference_embedding(embedder.ref, ids[0]))


def test_base64_is_little_endian_float32(embedder: Served) -> None:
    body = {"input": TEXTS[1], "encoding_format": "base64"}
    b64 = embedder.http.post("/v1/embeddings", json=body).json()["data"][0]["embedding"]
    floats = embedder.http.post("/v1/embeddings", json={**body, "encoding_format": "float"}
                                ).json()["data"][0]["embedding"]
    decoded = np.frombuffer(base64.b64decode(b64), dtype="<f4")
    np.testing.assert_allclose(decoded, floats, rtol=1e-6)


def test_native_encode_and_prefix_cache(embedder: Served, tokenizer: Any) -> None:
    prefix = "Shared instruction: represent this sentence for retrieval. "
    first = embedder.http.post("/encode", json={"text": prefix + "cats"}).json()
    second = embedder.http.post("/encode", json={"text": prefix + "dogs"}).json()
    assert second["meta_info"]["cached_tokens"] >= len(tokenizer.encode(prefix)) - 1
    _close(second["embedding"], reference_embedding(embedder.ref,
                                                     tokenizer.encode(prefix + "dogs")))
    assert first["meta_info"]["prompt_tokens"] == len(tokenizer.encode(prefix + "cats"))
    batch = embedder.http.post("/encode", json={"text": TEXTS[:2], "rid": ["a", "b"]}).json()
    assert [o["meta_info"]["id"] for o in batch] == ["a", "b"]
    info = embedder.http.get("/get_model_info").json()
    assert info["is_generation"] is False and info["pooling_method"] == "last"
    assert info["normalize"] is True


def test_ollama_embed(embedder: Served, tokenizer: Any) -> None:
    import ollama

    client = ollama.Client(host=str(embedder.http.base_url).rstrip("/"))
    many = client.embed(model="m", input=TEXTS)
    assert len(many.embeddings) == len(TEXTS)
    for vector, text in zip(many.embeddings, TEXTS):
        _close(list(vector), reference_embedding(embedder.ref, tokenizer.encode(text)))
    assert many.prompt_eval_count == sum(len(tokenizer.encode(t)) for t in TEXTS)
    assert many.total_duration and many.total_duration > 0
    one = client.embeddings(model="m", prompt=TEXTS[0])  # the older route
    _close(list(one.embedding), reference_embedding(embedder.ref, tokenizer.encode(TEXTS[0])))
    # Longer than the context: cut to it by default (Ollama's truncate), else a 400.
    context = embedder.http.get("/get_model_info").json()["context_length"]
    long = "x" * (context + 50)
    cut = client.embed(model="m", input=long).embeddings[0]
    _close(list(cut), reference_embedding(embedder.ref, tokenizer.encode(long)[:context]))
    with pytest.raises(ollama.ResponseError) as e:
        client.embed(model="m", input=long, truncate=False)
    assert e.value.status_code == 400 and "context length" in e.value.error
    name = client.list().models[0].model
    assert name is not None and client.show(name).capabilities == ["embedding"]
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="m", messages=[{"role": "user", "content": "hi"}])
    assert e.value.status_code == 400 and "does not generate" in e.value.error


@pytest.mark.parametrize("path,body,needle", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "does not generate"),
    ("/v1/completions", {"prompt": "hi"}, "does not generate"),
    ("/generate", {"text": "hi"}, "does not generate"),
    ("/classify", {"text": "hi"}, "needs a classifier"),
    ("/v1/rerank", {"query": "q", "documents": ["d"]}, "needs a classifier"),
    ("/v1/embeddings", {"input": "hi", "dimensions": 8}, "dimensions"),
    ("/v1/embeddings", {"input": ""}, "empty"),
    ("/v1/embeddings", {"input": []}, "empty"),
    ("/v1/embeddings", {"input": [[1, 2], [10 ** 6]]}, "outside the vocabulary"),
    ("/v1/embeddings", {"input": "x" * 600}, "context length"),
    ("/v1/embeddings", {"input": "hi", "encoding_format": "int8"}, "encoding_format"),
    ("/encode", {"text": "hi", "sampling_params": {}}, "sampling_params"),
])
def test_embedding_server_bad_inputs(embedder: Served, path: str, body: dict[str, Any],
                                     needle: str) -> None:
    r = embedder.http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["message"]
    assert embedder.http.get("/health").status_code == 200


# ---------------------------------------------------------------- classification, rerank


def test_classify_equals_transformers_logits(classifier: Served, tokenizer: Any) -> None:
    outs = classifier.http.post("/classify", json={"text": TEXTS}).json()
    for out, text in zip(outs, TEXTS):
        _close(out["embedding"], reference_logits(classifier.ref, tokenizer.encode(text)))
    v1 = classifier.http.post("/v1/classify", json={"input": TEXTS[0]}).json()
    assert v1["object"] == "list" and v1["data"][0]["num_classes"] == 1
    assert v1["data"][0]["label"] == "LABEL_0" and v1["data"][0]["probs"] == [1.0]
    assert v1["usage"]["prompt_tokens"] == len(tokenizer.encode(TEXTS[0]))


def test_rerank_orders_like_transformers(classifier: Served, tokenizer: Any) -> None:
    query = "Which animal is quick?"
    docs = [f"Document {i}: " + t for i, t in enumerate(TEXTS + ["foxes", "slow snails"])]
    r = classifier.http.post("/v1/rerank", json={"query": query, "documents": docs})
    assert r.status_code == 200, r.text
    ranked = r.json()
    expected = [1 / (1 + math.exp(-float(reference_logits(
        classifier.ref, tokenizer(query, d)["input_ids"])[0]))) for d in docs]
    order = sorted(range(len(docs)), key=lambda i: -expected[i])
    assert [x["index"] for x in ranked] == order
    for x in ranked:
        assert x["document"] == docs[x["index"]]
        assert math.isclose(x["score"], expected[x["index"]], abs_tol=ATOL)
    top = classifier.http.post("/v1/rerank", json={"query": query, "documents": docs,
                                                   "top_n": 2, "return_documents": False}).json()
    assert [x["index"] for x in top] == order[:2] and "document" not in top[0]


@pytest.mark.parametrize("path,body,needle", [
    ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"query": "", "documents": ["d"]}, "query"),
    ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, "does not generate"),
    ("/classify", {"input_ids": [[1, 2], "x"]}, "input_ids"),
])
def test_classifier_bad_inputs(classifier: Served, path: str, body: dict[str, Any],
                               needle: str) -> None:
    r = classifier.http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert needle in r.json()["message"]
