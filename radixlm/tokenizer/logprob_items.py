"""The scheduler's logprobs as the API reports them: `[logprob, token_id, text]` items.

The scheduler sends `(logprob, token_id)` pairs (io_struct's `LogprobEntry`);
a sample's output carries them as `LogprobItem`s (messages/generate_output.py), with
the token's text only when the request asked for it and a tokenizer is
loaded. A prompt position without a logprob (the first one) still names its
token, `[None, token_id, text]`, from the prompt the sample's state keeps.
"""

from __future__ import annotations

from typing import Any, Protocol

from radixlm.messages.generate_output import GenerateOutput, LogprobItem
from radixlm.messages.io_struct import LogprobEntry, TokenOut


class LogprobSource(Protocol):
    """sample_state.SampleState, as far as this module reads it."""

    @property
    def return_text_in_logprobs(self) -> bool: ...
    @property
    def prompt_ids(self) -> list[int] | None: ...
    @property
    def logprob_start_len(self) -> int: ...


def add_logprobs(out: GenerateOutput, tok: TokenOut, state: LogprobSource,
                 tokenizer: Any) -> None:
    """Set `out`'s logprob fields from the delta `tok` of `state`'s sample; `tokenizer`
    decodes each token's text (None with --skip-tokenizer-init: no text)."""
    with_text = state.return_text_in_logprobs and tokenizer is not None

    def item(e: LogprobEntry) -> LogprobItem:
        logprob, token_id = e
        text = tokenizer.decode([token_id]) if with_text else None
        return [logprob, token_id, text]

    def prompt_item(pos: int, e: LogprobEntry | None) -> LogprobItem | None:
        if e is not None:
            return item(e)
        ids = state.prompt_ids
        if ids is None or not 0 <= state.logprob_start_len + pos < len(ids):
            return None
        token_id = ids[state.logprob_start_len + pos]
        return [None, token_id, tokenizer.decode([token_id]) if with_text else None]

    out.output_token_logprobs = [item(e) for e in tok.output_token_logprobs or []]
    out.output_top_logprobs = [[item(e) for e in tops] for tops in tok.output_top_logprobs or []]
    if tok.input_token_logprobs is not None:
        out.input_token_logprobs = [
            prompt_item(i, e) for i, e in enumerate(tok.input_token_logprobs)]
        out.input_top_logprobs = [
            [item(e) for e in tops] if tops is not None else None
            for tops in tok.input_top_logprobs or []
        ]
