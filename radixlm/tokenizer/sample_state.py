"""What the TokenizerManager keeps for each sample in flight, and the outputs it makes.

A call has one `SampleState` per (prompt, sample): the queue its outputs
reach, its timing, and, with prompt logprobs, where to find the prompt's
tokens. `output_of` turns the detokenizer's delta into the sample's
`GenerateOutput`: a streaming sample's goes out as it comes; a non-streaming
sample's deltas are kept (O(delta) each) and joined into its one output at
its end. `merge_outputs` yields a call's outputs, from all its samples, in
the order they arrive.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from radixlm.messages.generate_output import GenerateOutput, LogprobItem
from radixlm.messages.io_struct import EmbeddingOut, StrOut
from radixlm.tokenizer.logprob_items import add_logprobs


@dataclass
class SampleState:
    index: int  # position in the flattened (prompt, sample) output list
    rid: str
    stream: bool
    return_logprob: bool
    return_text_in_logprobs: bool
    created: float = field(default_factory=time.monotonic)
    # GenerateOutputs of a generate call; the one EmbeddingOut of an encode call.
    queue: asyncio.Queue[GenerateOutput | EmbeddingOut | Exception] = field(
        default_factory=asyncio.Queue)
    finished: bool = False
    first_token_time: float | None = None
    last_token_time: float | None = None
    # A non-streaming sample's output so far, joined into its one output at the end.
    text_parts: list[str] = field(default_factory=list)
    hidden_states: list[list[float]] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    output_token_logprobs: list[LogprobItem] = field(default_factory=list)
    output_top_logprobs: list[list[LogprobItem]] = field(default_factory=list)
    input_token_logprobs: list[LogprobItem | None] | None = None
    input_top_logprobs: list[list[LogprobItem] | None] | None = None
    # With prompt logprobs: the prompt (a reference, not a copy) and the first position
    # scored, to name the token of a position without a logprob ([null, id, text]).
    prompt_ids: list[int] | None = None
    logprob_start_len: int = 0


def output_of(state: SampleState, msg: StrOut, tokenizer: Any) -> GenerateOutput | None:
    """The output the detokenizer's `msg` makes for `state`'s sample (marked finished at
    its end): a stream's delta; for a non-streaming sample, None until its end, then its
    one output. `tokenizer` names the logprobs' tokens (None: without their text)."""
    tok = msg.token_out
    out = GenerateOutput(
        index=state.index,
        rid=state.rid,
        text=msg.text_delta,
        token_ids=tok.new_token_ids,
        prompt_tokens=tok.prompt_tokens,
        completion_tokens=tok.completion_tokens,
        cached_tokens=tok.cached_tokens,
        cached_tokens_disk=tok.cached_tokens_disk,
        forward_steps=tok.forward_steps,
        jump_forward_tokens=tok.jump_forward_tokens,
        spec=tok.spec,
        finish_reason=tok.finished_reason,
        created=state.created,
        first_token_time=state.first_token_time,
        e2e_latency=time.monotonic() - state.created,
        hidden_states=tok.hidden_states,
    )
    if state.return_logprob:
        add_logprobs(out, tok, state, tokenizer)
    state.finished = out.finished
    if not state.stream:
        _accumulate(state, out)
        if not out.finished:
            return None
        out = _joined(state, out)
    return out


async def next_output(state: SampleState) -> GenerateOutput | Exception:
    """The next output of a generate call's sample (never an EmbeddingOut)."""
    out = await state.queue.get()
    assert not isinstance(out, EmbeddingOut), "an encode call's output reached generate"
    return out


async def merge_outputs(states: list[SampleState]) -> AsyncIterator[GenerateOutput]:
    """Every output of the samples `states`, as each arrives, until all have finished;
    an error any of them gets is raised."""
    if len(states) == 1:
        state = states[0]
        while True:
            out = await next_output(state)
            if isinstance(out, Exception):
                raise out
            yield out
            if out.finished:
                return
    merged: asyncio.Queue[GenerateOutput | Exception] = asyncio.Queue()

    async def pump(state: SampleState) -> None:
        while True:
            out = await next_output(state)
            await merged.put(out)
            if isinstance(out, Exception) or out.finished:
                return

    tasks = [asyncio.create_task(pump(s)) for s in states]
    try:
        remaining = len(states)
        while remaining:
            out = await merged.get()
            if isinstance(out, Exception):
                raise out
            yield out
            remaining -= out.finished
    finally:
        for t in tasks:
            t.cancel()


def _accumulate(state: SampleState, out: GenerateOutput) -> None:
    """Keep a non-streaming sample's delta for its final output (O(delta))."""
    state.text_parts.append(out.text)
    state.token_ids.extend(out.token_ids)
    state.output_token_logprobs.extend(out.output_token_logprobs or [])
    state.output_top_logprobs.extend(out.output_top_logprobs or [])
    if out.hidden_states is not None:
        state.hidden_states.extend(out.hidden_states)
    if out.input_token_logprobs is not None:
        state.input_token_logprobs = out.input_token_logprobs
        state.input_top_logprobs = out.input_top_logprobs


def _joined(state: SampleState, last: GenerateOutput) -> GenerateOutput:
    """A non-streaming sample's one output: everything it produced, with the last counts."""
    last.text = "".join(state.text_parts)
    last.token_ids = state.token_ids
    if last.hidden_states is not None:
        last.hidden_states = state.hidden_states
    if state.return_logprob:
        last.output_token_logprobs = state.output_token_logprobs
        last.output_top_logprobs = state.output_top_logprobs
        last.input_token_logprobs = state.input_token_logprobs
        last.input_top_logprobs = state.input_top_logprobs
    return last
