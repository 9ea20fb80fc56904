"""What `TokenizerManager.encode` returns: one input's answer from a pooling model.

The scheduler answers each input of an encode call with one `EmbeddingOut`
(its vector, or None when the request ended without one); `embedding_result`
turns it into an `EmbeddingResult`, or raises: ValueError for a request the
scheduler refused (a 400), `RequestAborted` for one aborted or cut short.
"""

from __future__ import annotations

from dataclasses import dataclass

from radixlm.messages.io_struct import EmbeddingOut
from radixlm.tokenizer.sample_state import SampleState


class RequestAborted(RuntimeError):
    """A pooling request ended without its vector (aborted, or the server is stopping)."""


@dataclass
class EmbeddingResult:
    """One input's answer from a pooling model."""

    index: int
    embedding: list[float]  # the vector, or a classifier's label logits
    prompt_tokens: int
    cached_tokens: int


async def embedding_result(state: SampleState) -> EmbeddingResult:
    """The answer of an encode call's input, once it arrives in `state`'s queue (an
    error put there, such as EngineDeadError, is raised)."""
    out = await state.queue.get()
    if isinstance(out, Exception):
        raise out
    assert isinstance(out, EmbeddingOut)
    reason = out.finished_reason
    if out.embedding is None:
        message = reason.message or "The request was aborted"
        if reason.status_code == 400:
            raise ValueError(message)
        raise RequestAborted(message)
    return EmbeddingResult(state.index, out.embedding, out.prompt_tokens, out.cached_tokens)
