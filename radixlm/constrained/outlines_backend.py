"""outlines-core backend: a token-level DFA (Index) built from a regex.

JSON schemas become a regex (outlines_core.json_schema) with bounded
whitespace and numbers (json_bounds.py); EBNF and structural tags are not supported (a regular language
cannot express them).

Jump-forward (the compressed FSM): outlines-core exposes only the token-level
index, not its character automaton, so the forced text at a state is found on
tokens: if every allowed token starts with the same bytes P, every valid
continuation does too, so P is forced; when P is itself an allowed token, the
walk moves to that token's state and repeats. The result per state is cached
on the compiled grammar, so the chain is computed once per state, not per step.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import outlines_core
import torch
from outlines_core.json_schema import build_regex_from_schema

from radixlm.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarError,
)
from radixlm.constrained.json_bounds import bound_outlines_regex
from radixlm.messages.sampling_params import GRAMMAR_BACKEND_KINDS

# NOTE: compact JSON by default: outlines-core puts one whitespace pattern between every
# pair of JSON tokens, so "[ ]?" gives `{ "a" : 1 }` and leaves nothing for jump-forward
# to insert between values; with none, whole keys are forced (`,"house":"`).
DEFAULT_JSON_WHITESPACE = ""
MAX_ROLLBACK_TOKENS = 200
MAX_JUMP_FORWARD_TOKENS = 64


def _byte_level_decoder() -> dict[str, int]:
    """The inverse of GPT-2's bytes_to_unicode: printable char -> byte value."""
    byte_values = (
        list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    )
    chars = list(byte_values)
    n = 0
    for b in range(256):
        if b not in byte_values:
            byte_values.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(byte_values, chars)}


def token_bytes(tokenizer: Any, vocab_size: int) -> list[bytes | None]:
    """The bytes each token id stands for; None for special or missing ids."""
    special_ids = set(tokenizer.all_special_ids)
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    byte_level = type(decoder).__name__ == "ByteLevel"
    byte_map = _byte_level_decoder()
    num_tokens = min(len(tokenizer), vocab_size)
    pieces = tokenizer.convert_ids_to_tokens(list(range(num_tokens)))
    result: list[bytes | None] = [None] * vocab_size
    for token_id, piece in enumerate(pieces):
        if piece is None or token_id in special_ids:
            continue
        if byte_level and all(c in byte_map for c in piece):
            result[token_id] = bytes(byte_map[c] for c in piece)
        elif piece.startswith("<0x") and piece.endswith(">") and len(piece) == 6:
            result[token_id] = bytes([int(piece[3:5], 16)])  # sentencepiece byte fallback
        else:
            result[token_id] = piece.replace("\u2581", " ").encode("utf-8")
    return result


class CompiledOutlinesGrammar:
    """An Index plus the per-state jump-forward cache, shared by every copy."""

    def __init__(self, index: Any, backend: OutlinesBackend) -> None:
        self.index = index
        self.backend = backend
        self.jump_forward_cache: dict[int, str | None] = {}

    def jump_forward(self, state: int) -> str | None:
        if state not in self.jump_forward_cache:
            self.jump_forward_cache[state] = self._walk_forced_chain(state)
        return self.jump_forward_cache[state]

    def _walk_forced_chain(self, state: int) -> str | None:
        forced = b""
        for _ in range(MAX_JUMP_FORWARD_TOKENS):
            if self.index.is_final_state(state):
                break  # the grammar may end here: nothing is forced
            allowed = self.index.get_allowed_tokens(state)
            prefix = _common_prefix(self.backend.token_bytes[t] or b"" for t in allowed)
            if not prefix:
                break
            forced += prefix
            exact = next((t for t in allowed if self.backend.token_bytes[t] == prefix), None)
            if exact is None:
                break
            state = self.index.get_next_state(state, exact)
        return _decode_complete_utf8(forced) or None


def _common_prefix(items: Iterable[bytes]) -> bytes:
    """The longest common prefix, stopping as soon as it is empty (states inside free
    text allow tens of thousands of tokens that share nothing)."""
    prefix: bytes | None = None
    for item in items:
        if prefix is None:
            prefix = item
            continue
        while not item.startswith(prefix):
            prefix = prefix[:-1]
        if not prefix:
            return b""
    return prefix or b""


def _decode_complete_utf8(data: bytes) -> str:
    """Decode, dropping an incomplete multi-byte character at the end."""
    for cut in range(min(4, len(data) + 1)):
        try:
            return data[: len(data) - cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
    return ""


class OutlinesGrammarObject(BaseGrammarObject):
    def __init__(self, compiled: CompiledOutlinesGrammar) -> None:
        self.compiled = compiled
        self.guide = outlines_core.Guide(compiled.index, max_rollback=MAX_ROLLBACK_TOKENS)
        self.terminated = False

    def accept_token(self, token_id: int) -> None:
        if self.terminated:
            raise GrammarError(f"Token {token_id} after the grammar terminated")
        eos_ids = self.compiled.backend.eos_token_ids
        if token_id in eos_ids:
            if not self.guide.is_finished():
                raise GrammarError(f"EOS token {token_id} before the grammar may end")
            self.terminated = True  # the guide stays in its final state
            return
        if not self.guide.accepts_tokens([token_id]):
            raise GrammarError(f"Token {token_id} is not allowed by the grammar")
        self.guide.advance(token_id, return_tokens=False)

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        words = mask[row]  # [ceil(V/32)] int32, contiguous
        self.guide.write_mask_into(words.data_ptr(), words.numel(), words.element_size())
        if self.guide.is_finished():  # every EOS id, not only the Vocabulary's one
            for eos_id in self.compiled.backend.eos_token_ids:
                words[eos_id // 32] |= _bit(eos_id % 32)

    def is_terminated(self) -> bool:
        return self.terminated

    def rollback(self, num_tokens: int) -> None:
        if num_tokens > 0 and self.terminated:
            self.terminated = False
            num_tokens -= 1
        if num_tokens > 0:
            self.guide.rollback_state(num_tokens)

    def try_jump_forward(self) -> str | None:
        if self.terminated:
            return None
        return self.compiled.jump_forward(self.guide.get_state())

    def copy(self) -> OutlinesGrammarObject:
        return OutlinesGrammarObject(self.compiled)


def strip_anchors(regex: str) -> str:
    """Drop a leading ^ and a trailing unescaped $: the whole output must match anyway,
    and outlines-core's Index rejects anchors."""
    if regex.startswith("^"):
        regex = regex[1:]
    if regex.endswith("$"):
        num_backslashes = len(regex[:-1]) - len(regex[:-1].rstrip("\\"))
        if num_backslashes % 2 == 0:
            regex = regex[:-1]
    return regex


def _bit(position: int) -> int:
    """The int32 value with only `position` set (bit 31 is negative in int32)."""
    return -(1 << 31) if position == 31 else 1 << position


class OutlinesBackend(BaseGrammarBackend):
    name = "outlines"
    supported_kinds = GRAMMAR_BACKEND_KINDS["outlines"]

    def __init__(
        self, tokenizer: Any, vocab_size: int, eos_token_ids: Sequence[int], **options: Any
    ):
        super().__init__(tokenizer, vocab_size, eos_token_ids, **options)
        if not self.eos_token_ids:
            raise ValueError("The outlines backend needs at least one EOS token id")
        self.token_bytes = token_bytes(tokenizer, vocab_size)
        by_bytes: dict[bytes, list[int]] = {}
        for token_id, data in enumerate(self.token_bytes):
            if data and token_id not in self.eos_token_ids:
                by_bytes.setdefault(data, []).append(token_id)
        # NOTE: built from our tokenizer: Vocabulary.from_pretrained would go to the hub.
        self.vocabulary = outlines_core.Vocabulary(self.eos_token_ids[0], by_bytes)

    def json_schema_to_regex(self, text: str) -> str:
        whitespace = self.json_whitespace_pattern
        if self.json_disable_any_whitespace:
            whitespace = ""
        elif whitespace is None:
            whitespace = DEFAULT_JSON_WHITESPACE
        regex = build_regex_from_schema(text, whitespace_pattern=whitespace)
        return bound_outlines_regex(regex) if self.json_bounded_numbers else regex

    def _compile(self, kind: str, text: str) -> OutlinesGrammarObject:
        regex = self.json_schema_to_regex(text) if kind == "json_schema" else strip_anchors(text)
        index = outlines_core.Index(regex, self.vocabulary)
        return OutlinesGrammarObject(CompiledOutlinesGrammar(index, self))
