"""Translation helpers from the runtime's outputs to OpenAI fields.

A runtime output is a `GenerateOutput` (messages/generate_output.py): its
`index` is prompt-major (prompt i, sample j of n is i * n + j, which is also
OpenAI's choice index), and it carries what its sample produced since its
previous output. Logprob items are `[logprob, token_id, token_text]` (None
for a prompt's first token).
"""

from __future__ import annotations

import uuid
from typing import Any

from radixlm.entrypoints.openai.protocol import (
    CompletionLogprobs,
    CompletionTokensDetails,
    PromptTokensDetails,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from radixlm.messages.generate_output import GenerateOutput


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def batch_rids(base: str | None, prefix: str, num_prompts: int) -> list[str]:
    """One request id per prompt: the client's `rid` (suffixed for a batch) or a new one."""
    if base is None:
        return [new_id(prefix) for _ in range(num_prompts)]
    return [base] if num_prompts == 1 else [f"{base}-{i}" for i in range(num_prompts)]


def finish_fields(out: GenerateOutput) -> tuple[str | None, str | int | None]:
    """(finish_reason, matched_stop): "stop" | "length" | "abort", and the stop string
    or token id that ended the sample (None unless it stopped on one)."""
    reason = out.finish_reason
    if reason is None:
        return None, None
    return reason.type, reason.matched


class LastHiddenStates:
    """SGLang's `hidden_states` of OpenAI choices: the final hidden state of the last
    position computed after the prompt (`[]` when only the prompt's were), per choice."""

    def __init__(self) -> None:
        self.num_rows: dict[int, int] = {}
        self.last: dict[int, list[float]] = {}

    def add(self, out: GenerateOutput) -> None:
        rows = out.hidden_states
        if rows:
            self.num_rows[out.index] = self.num_rows.get(out.index, 0) + len(rows)
            self.last[out.index] = rows[-1]

    def of(self, out: GenerateOutput) -> list[float]:
        num = self.num_rows.get(out.index, 0)
        return self.last[out.index] if num > out.prompt_tokens else []


def make_usage(outs: dict[int, GenerateOutput], n: int) -> Usage:
    """Usage over all choices (each choice's latest output); a prompt (and its cached
    part) counts once, not n times; completion_tokens_details.jump_forward_tokens is
    radixlm's extra."""
    firsts = [o for i, o in outs.items() if i % n == 0]
    prompt = sum(o.prompt_tokens for o in firsts)
    cached = sum(o.cached_tokens for o in firsts)
    completion = sum(o.completion_tokens for o in outs.values())
    jumped = sum(o.jump_forward_tokens for o in outs.values())
    return Usage(prompt_tokens=prompt, completion_tokens=completion,
                 total_tokens=prompt + completion,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
                 completion_tokens_details=CompletionTokensDetails(jump_forward_tokens=jumped))


def _text(entry: list[Any] | None, tokenizer: Any) -> str:
    if entry is None:
        return ""
    if len(entry) > 2 and entry[2] is not None:
        return str(entry[2])
    return str(tokenizer.decode([entry[1]]))


def _top_dict(tops: list[Any] | None, tokenizer: Any) -> dict[str, float]:
    return {_text(e, tokenizer): e[0] for e in tops or [] if e is not None}


class CompletionLogprobsBuilder:
    """Completions `logprobs`, built piece by piece (a stream sends each piece once)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.offset = 0  # characters of text already covered

    def prompt(self, prompt_ids: list[int], out: GenerateOutput) -> CompletionLogprobs:
        """Echoed prompt tokens: logprob None for the first (nothing precedes it)."""
        tokens = [self.tokenizer.decode([t]) for t in prompt_ids]
        lps = out.input_token_logprobs or []
        tops = out.input_top_logprobs or []
        skip = len(prompt_ids) - len(lps)  # positions before logprob_start_len
        result = CompletionLogprobs()
        for i, tok in enumerate(tokens):
            entry = lps[i - skip] if i >= skip else None
            top = tops[i - skip] if 0 <= i - skip < len(tops) else None
            self._add(result, tok, entry[0] if entry else None,
                      _top_dict(top, self.tokenizer) if top else None)
        return result

    def output(self, out: GenerateOutput) -> CompletionLogprobs:
        """The output tokens `out` carries."""
        lps = out.output_token_logprobs or []
        tops = out.output_top_logprobs or []
        result = CompletionLogprobs()
        for i, entry in enumerate(lps):
            top = tops[i] if i < len(tops) else None
            self._add(result, _text(entry, self.tokenizer), entry[0] if entry else None,
                      _top_dict(top, self.tokenizer))
        return result

    def _add(self, out: CompletionLogprobs, token: str, logprob: float | None,
             top: dict[str, float] | None) -> None:
        out.tokens.append(token)
        out.token_logprobs.append(logprob)
        out.top_logprobs.append(top)
        out.text_offset.append(self.offset)
        self.offset += len(token)


def merge_logprobs(a: CompletionLogprobs, b: CompletionLogprobs) -> CompletionLogprobs:
    return CompletionLogprobs(tokens=a.tokens + b.tokens,
                              token_logprobs=a.token_logprobs + b.token_logprobs,
                              top_logprobs=a.top_logprobs + b.top_logprobs,
                              text_offset=a.text_offset + b.text_offset)


def chat_logprobs(out: GenerateOutput, tokenizer: Any) -> list[TokenLogprob]:
    """Chat `logprobs.content` for the output tokens `out` carries."""
    lps = out.output_token_logprobs or []
    tops = out.output_top_logprobs or []
    content = []
    for i, entry in enumerate(lps):
        text = _text(entry, tokenizer)
        top = [
            TopLogprob(token=_text(e, tokenizer), logprob=e[0],
                       bytes=list(_text(e, tokenizer).encode("utf-8")))
            for e in (tops[i] if i < len(tops) else None) or [] if e is not None
        ]
        content.append(TokenLogprob(token=text, logprob=entry[0] if entry else None,
                                    bytes=list(text.encode("utf-8")), top_logprobs=top))
    return content
