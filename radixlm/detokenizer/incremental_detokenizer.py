"""Incremental detokenizing: each step's new text at a cost independent of output length.

Per request (`DecodeState`): the token ids and two offsets. Text up to
`surr_offset` is confirmed and was emitted; `ids[surr_offset:read_offset]`
(the last confirmed tokens) is decoded again as surrounding context, so that
spacing and merges come out as in a full decode; `ids[read_offset:]` are new.
A step decodes two windows, `ids[surr_offset:read_offset]` and
`ids[surr_offset:]`; the new text is the second minus the first. It is
confirmed (emitted, and both offsets move up) only when it is non-empty and
does not end in U+FFFD, i.e. no multi-byte character is still arriving; else
the tokens stay pending and the next step decodes them again. At finish,
`flush` emits whatever is pending as it decodes, U+FFFD included, exactly as a
full decode would.

NOTE: an empty new text (e.g. only skipped special tokens) is not confirmed
either, so the context window keeps real text: a SentencePiece "▁word" at the
start of a window would lose its leading space.

The detokenizer process handles many requests per message: `step_batch`
decodes every window of the batch in one `batch_decode` call per flag set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from radixlm.tokenizer_utils import TokenDecoder

REPLACEMENT_CHAR = "\ufffd"
# Confirmed ids before surr_offset are dropped once this many pile up, so a
# state's memory stays bounded too (amortized O(1) per token).
_TRIM_AT = 1024


class DecodeState:
    """Incremental decode offsets of one request.

    prompt_tail_ids: optional last few prompt tokens used as the first context
    window (vLLM and SGLang use ~5). The output text is then
    `decode(tail + output)[len(decode(tail)):]`, the prompt's continuation: a
    SentencePiece tokenizer keeps the first output token's leading space, which
    `decode(output)` strips. Without a tail (the default) the output text is
    exactly `decode(output)`; byte-level BPE tokenizers give the same either way.
    """

    __slots__ = ("ids", "surr_offset", "read_offset", "skip_special_tokens", "spaces")

    def __init__(self, prompt_tail_ids: list[int] | None = None) -> None:
        self.ids: list[int] = list(prompt_tail_ids or [])
        self.surr_offset = 0
        self.read_offset = len(self.ids)
        # The decode flags of the last step, which `flush` reuses by default.
        self.skip_special_tokens = True
        self.spaces = True

    @property
    def num_pending(self) -> int:
        """Tokens received whose text is not confirmed yet."""
        return len(self.ids) - self.read_offset


class _Window(NamedTuple):
    surr_text: str  # decode(ids[surr_offset:read_offset])
    read_text: str  # decode(ids[surr_offset:])


class IncrementalDetokenizer:
    """Turns each request's new token ids into newly confirmed text.

    tokenizer: a Hugging Face tokenizer or a `DecodeTokenizer`; only its
    `batch_decode` is used, with clean-up of tokenization spaces as the
    tokenizer is configured (off for the byte-level BPE models we serve).
    """

    def __init__(self, tokenizer: TokenDecoder) -> None:
        self.tokenizer = tokenizer

    def step(
        self,
        state: DecodeState,
        new_ids: list[int],
        skip_special_tokens: bool = True,
        spaces_between_special_tokens: bool = True,
    ) -> str:
        """Append new_ids to the state; return the newly confirmed text (maybe "")."""
        return self.step_batch(
            [state], [new_ids], skip_special_tokens, spaces_between_special_tokens
        )[0]

    def flush(
        self,
        state: DecodeState,
        skip_special_tokens: bool | None = None,
        spaces_between_special_tokens: bool | None = None,
    ) -> str:
        """At finish: the pending text as it decodes now (flags default to the last step's)."""
        if skip_special_tokens is None:
            skip_special_tokens = state.skip_special_tokens
        if spaces_between_special_tokens is None:
            spaces_between_special_tokens = state.spaces
        return self.step_batch(
            [state], [[]], skip_special_tokens, spaces_between_special_tokens, finished=[True]
        )[0]

    def step_batch(
        self,
        states: Sequence[DecodeState],
        new_ids_list: Sequence[list[int]],
        skip_special_tokens: bool | Sequence[bool] = True,
        spaces_between_special_tokens: bool | Sequence[bool] = True,
        finished: Sequence[bool] | None = None,
    ) -> list[str]:
        """`step` for many requests with one batch decode per flag set.

        Flags are one value for all or one per request. finished[i] also
        flushes request i in the same decode (its new ids are taken first).
        """
        num = len(states)
        skips = _per_request(skip_special_tokens, num)
        spaces = _per_request(spaces_between_special_tokens, num)
        finals = list(finished) if finished is not None else [False] * num
        if not len(new_ids_list) == len(skips) == len(spaces) == len(finals) == num:
            raise ValueError("step_batch needs one entry per state")
        for state, new_ids, skip, space in zip(states, new_ids_list, skips, spaces):
            state.ids.extend(new_ids)
            state.skip_special_tokens, state.spaces = skip, space
        windows = self._decode_windows(states, skips, spaces)
        return [
            _advance(state, window, final) for state, window, final in zip(states, windows, finals)
        ]

    def _decode_windows(
        self, states: Sequence[DecodeState], skips: list[bool], spaces: list[bool]
    ) -> list[_Window]:
        """Both windows of every state, one `batch_decode` per distinct flag pair."""
        groups: dict[tuple[bool, bool], list[int]] = {}
        for i, key in enumerate(zip(skips, spaces)):
            groups.setdefault(key, []).append(i)
        windows: list[_Window] = [_Window("", "")] * len(states)
        for (skip, space), members in groups.items():
            sequences: list[list[int]] = []
            for i in members:
                s = states[i]
                sequences.append(s.ids[s.surr_offset : s.read_offset])
                sequences.append(s.ids[s.surr_offset :])
            texts = self.tokenizer.batch_decode(
                sequences,
                skip_special_tokens=skip,
                spaces_between_special_tokens=space,
            )
            for j, i in enumerate(members):
                windows[i] = _Window(texts[2 * j], texts[2 * j + 1])
        return windows


def _advance(state: DecodeState, window: _Window, final: bool) -> str:
    """Confirm the window's new text if it is complete (or final); return what is confirmed."""
    new_text = window.read_text[len(window.surr_text) :]
    if not final and (not new_text or new_text.endswith(REPLACEMENT_CHAR)):
        return ""
    state.surr_offset = state.read_offset
    state.read_offset = len(state.ids)
    if state.surr_offset >= _TRIM_AT:
        del state.ids[: state.surr_offset]
        state.read_offset -= state.surr_offset
        state.surr_offset = 0
    return new_text


def _per_request(value: bool | Sequence[bool], num: int) -> list[bool]:
    return [value] * num if isinstance(value, bool) else list(value)
