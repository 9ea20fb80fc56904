"""What `TokenizerManager.generate` yields: one sample's new output since its previous one.

A `GenerateOutput` carries deltas (the new text, token ids and logprobs)
and the running counts, never copies of everything so far, so a stream
costs the same per token however long it gets. A non-streaming sample
yields one output at its end, whose delta is then the whole output.

The OpenAI translators read the fields directly. The Engine and the native
`/generate` route answer SGLang's dicts (`text`, `output_ids`, `meta_info`,
`index`); `SampleDicts` builds them from a sample's outputs, either
cumulative (SGLang's default: each stream event holds the text, ids and
logprobs so far) or incremental (`--incremental-streaming-output`: each
event holds only what is new).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixlm.messages.io_struct import FinishReason, SpecCounts

# One logprob as the API reports it: [logprob, token_id, token_text]; the text is
# None unless the request asked for it (return_text_in_logprobs).
LogprobItem = list[Any]


@dataclass
class GenerateOutput:
    index: int  # the sample's place in the prompt-major list (prompt i, sample j: i * n + j)
    rid: str
    text: str  # new text since this sample's previous output
    token_ids: list[int]  # new output token ids
    prompt_tokens: int
    completion_tokens: int  # output tokens so far
    cached_tokens: int
    forward_steps: int
    jump_forward_tokens: int
    finish_reason: FinishReason | None
    created: float  # time.monotonic() at arrival
    first_token_time: float | None
    e2e_latency: float
    # With return_logprob: the new output logprobs (lists, possibly empty), and the
    # prompt logprobs once, in the output where they arrive (None in the others).
    output_token_logprobs: list[LogprobItem] | None = None
    output_top_logprobs: list[list[LogprobItem]] | None = None
    input_token_logprobs: list[LogprobItem | None] | None = None
    input_top_logprobs: list[list[LogprobItem] | None] | None = None
    cached_tokens_disk: int = 0  # the part of cached_tokens read from the KV disk tier
    # With return_hidden_states: the final hidden states of the positions computed since
    # the previous output, in position order from 0 (the prompt's first).
    hidden_states: list[list[float]] | None = None
    spec: SpecCounts | None = None  # speculative decoding's counts, when the server drafts

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def status_code(self) -> int | None:
        """The HTTP status an aborted sample asks for (e.g. 400 for a bad grammar)."""
        return self.finish_reason.status_code if self.finish_reason is not None else None

    def counts(self) -> dict[str, Any]:
        """The running part of SGLang's meta_info (everything but logprobs)."""
        meta: dict[str, Any] = {
            "id": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            # Prefix-cache hits per tier: the KV pool, and the disk tier (--kv-cache-dir).
            "cached_tokens_pool": self.cached_tokens - self.cached_tokens_disk,
            "cached_tokens_disk": self.cached_tokens_disk,
            "forward_steps": self.forward_steps,
            "jump_forward_tokens": self.jump_forward_tokens,
            "finish_reason": self.finish_reason.to_json() if self.finish_reason else None,
            "e2e_latency": self.e2e_latency,
        }
        if self.spec is not None:
            meta.update(
                spec_verify_ct=self.spec.verify_steps,
                spec_draft_tokens=self.spec.draft_tokens,
                spec_accepted_tokens=self.spec.accepted_tokens,
                spec_accept_rate=round(self.spec.accept_rate, 4),
            )
        if self.status_code is not None:
            meta["status_code"] = self.status_code
        return meta


class SampleDicts:
    """One sample's outputs as SGLang's dicts. `add` each output in order; it returns
    the dict to send or yield for it.

    Cumulative dicts share nothing with later ones (`copy`: the Engine hands them to
    the caller) unless copy=False (the native route serializes each at once)."""

    def __init__(self, incremental: bool = False, copy: bool = True) -> None:
        self.incremental = incremental
        self.copy = copy
        self.text = ""
        self.token_ids: list[int] = []
        self.logprobs: dict[str, Any] = {}
        self.hidden_states: list[list[float]] = []
        self.num_hidden_seen = 0  # positions whose hidden states arrived so far

    def add(self, out: GenerateOutput) -> dict[str, Any]:
        if self.incremental:
            meta = out.counts()
            meta.update(_logprob_fields(out))
            if out.hidden_states is not None:
                meta["hidden_states"] = sglang_hidden_states(
                    out.hidden_states, self.num_hidden_seen, out.prompt_tokens)
                self.num_hidden_seen += len(out.hidden_states)
            return {"index": out.index, "text": out.text, "delta": out.text,
                    "output_ids": out.token_ids, "meta_info": meta}
        self.text += out.text
        self.token_ids.extend(out.token_ids)
        for key, value in _logprob_fields(out).items():
            if key.startswith("output_"):
                self.logprobs.setdefault(key, []).extend(value)
            else:
                self.logprobs[key] = value
        meta = out.counts()
        if out.hidden_states is not None:
            self.hidden_states.extend(out.hidden_states)
            meta["hidden_states"] = sglang_hidden_states(self.hidden_states, 0,
                                                         out.prompt_tokens)
        ids = self.token_ids
        if self.copy:
            ids = list(ids)
            meta.update({k: list(v) for k, v in self.logprobs.items()})
        else:
            meta.update(self.logprobs)
        return {"index": out.index, "text": self.text, "delta": out.text, "output_ids": ids,
                "meta_info": meta}


def _logprob_fields(out: GenerateOutput) -> dict[str, Any]:
    fields: dict[str, Any] = {}
    if out.output_token_logprobs is not None:
        fields["output_token_logprobs"] = out.output_token_logprobs
        fields["output_top_logprobs"] = out.output_top_logprobs or []
    if out.input_token_logprobs is not None:
        fields["input_token_logprobs"] = out.input_token_logprobs
        fields["input_top_logprobs"] = out.input_top_logprobs or []
    return fields


def sglang_hidden_states(rows: list[list[float]], first_pos: int, num_prompt: int
                         ) -> list[Any]:
    """Hidden states in SGLang's shape: the prompt positions' rows as one list (they come
    from one prefill), then one row per later position (each decode step's input)."""
    split = min(max(num_prompt - first_pos, 0), len(rows))
    prompt: list[Any] = [rows[:split]] if split else []
    return prompt + rows[split:]


def final_dict(out: GenerateOutput) -> dict[str, Any]:
    """The result of a finished non-streaming sample (its one output holds everything)."""
    meta = out.counts()
    meta.update(_logprob_fields(out))
    if out.hidden_states is not None:
        meta["hidden_states"] = sglang_hidden_states(out.hidden_states, 0, out.prompt_tokens)
    return {"index": out.index, "text": out.text, "output_ids": out.token_ids, "meta_info": meta}


def token_only(d: dict[str, Any], no_text: bool) -> dict[str, Any]:
    """With --skip-tokenizer-init (`no_text`), an output dict without its text fields, as
    SGLang answers then (`output_ids` and `meta_info`); else `d` itself."""
    if not no_text:
        return d
    return {k: v for k, v in d.items() if k not in ("text", "delta")}
