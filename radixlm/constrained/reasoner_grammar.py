"""A grammar that starts after the think block: SGLang's reasoner grammar, by text.

With a reasoning parser on, a request's constraint (response_format, regex, a
tool-call grammar) applies to the answer, not to the reasoning. The wrapper
lets every token through (an all-allowed mask, no jump-forward) while the
output is inside the think block, and hands over to the inner grammar at the
first token after the one that completes the end tag (`</think>`). The tags
are matched on the tokens' text, so a tag split over several tokens is found
as well as a tag that is one special token.

Phases (the request's `reasoning_phase`):
- "inside": the output starts in the block;
- "start": the output may open a block (Qwen3). Until that is decided, the mask
  is the inner grammar's plus the tokens that continue the start tag; a token
  the inner grammar accepts and the tag does not hands over at once, a
  completed start tag enters the block (the inner grammar forgets what it read).

A thinking budget (`thinking_token_budget`, `--reasoning-budget`): once the
request has spent that many tokens inside the block, the phase becomes
"closing": the mask allows only the tokens that continue the end tag (a token
may end with whitespace after it), so the block ends and the inner grammar
takes over. Budget 0 answers at once: "inside" starts closing, "start" starts
the answer (the block may not open). A request with a budget and no grammar of
its own gets `FreeGrammar` as the inner one.

NOTE: text after the end tag inside the same token is not seen by the inner
grammar (the reasoning parser drops the whitespace that usually follows the tag).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from radixlm.constrained.base_grammar_backend import BaseGrammarObject, GrammarError

_WHITESPACE = " \t\n\r"


class TokenTexts:
    """Each token id's text (for matching tags), and the tokens that continue a tag."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self._continuing: dict[tuple[str, str], list[int]] = {}
        self._closing: dict[tuple[str, str], list[int]] = {}

    @classmethod
    def from_tokenizer(cls, tokenizer: object, vocab_size: int) -> TokenTexts:
        size = min(vocab_size, len(tokenizer))  # type: ignore[arg-type]
        texts = tokenizer.batch_decode(  # type: ignore[attr-defined]
            [[i] for i in range(size)], skip_special_tokens=False)
        return cls([str(t) for t in texts] + [""] * (vocab_size - size))

    def text(self, token_id: int) -> str:
        return self.texts[token_id] if 0 <= token_id < len(self.texts) else ""

    def continuing(self, held: str, tag: str) -> list[int]:
        """Tokens t with (held + text(t)), less leading whitespace, a prefix of `tag` or
        starting with it (cached: `held` is almost always empty)."""
        key = (held, tag)
        if key not in self._continuing:
            ids = []
            for i, t in enumerate(self.texts):
                s = (held + t).lstrip(_WHITESPACE)
                if t and (tag.startswith(s) or s.startswith(tag)):
                    ids.append(i)
            if len(self._continuing) > 64:
                self._continuing.clear()
            self._continuing[key] = ids
        return self._continuing[key]

    def closing(self, held: str, tag: str) -> list[int]:
        """Tokens t with (held + text(t)), less leading whitespace, a non-empty prefix of
        `tag`, or `tag` followed by whitespace only (cached: `held` is a prefix of the
        tag). Whitespace alone is not allowed: every token brings the tag closer."""
        key = (held, tag)
        if key not in self._closing:
            ids = []
            for i, t in enumerate(self.texts):
                s = (held + t).lstrip(_WHITESPACE)
                if t and s and (tag.startswith(s) or (s.startswith(tag)
                                                and not s[len(tag):].strip(_WHITESPACE))):
                    ids.append(i)
            if len(self._closing) > 64:
                self._closing.clear()
            self._closing[key] = ids
        return self._closing[key]


class FreeGrammar(BaseGrammarObject):
    """Every token allowed, never terminated: the inner grammar of a request that has a
    thinking budget and no constraint of its own."""

    def accept_token(self, token_id: int) -> None:
        pass

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        mask[row].fill_(-1)

    def is_terminated(self) -> bool:
        return False

    def rollback(self, num_tokens: int) -> None:
        pass

    def try_jump_forward(self) -> str | None:
        return None

    def copy(self) -> FreeGrammar:
        return FreeGrammar()


@dataclass
class _State:
    phase: str  # "start" | "reasoning" | "closing" | "active"
    held: str  # start: the text so far; reasoning, closing: the last characters (end tag)
    num_inner: int  # tokens the inner grammar holds now (start: tentatively)
    inner_alive: bool = True
    start_ids: tuple[int, ...] = ()  # start: the tokens the inner grammar holds
    num_thinking: int = 0  # tokens read inside the block


class ReasonerGrammar(BaseGrammarObject):
    """`inner` gated by a think block (see the module doc)."""

    def __init__(self, inner: BaseGrammarObject, texts: TokenTexts, start_tag: str,
                 end_tag: str, phase: str, budget: int | None = None) -> None:
        """budget: the most tokens inside the think block (None: no limit)."""
        assert phase in ("start", "inside")
        self.inner = inner
        self.texts = texts
        self.start_tag, self.end_tag = start_tag, end_tag
        self.budget = budget
        self._initial_phase = phase
        first = "start" if phase == "start" else "reasoning"
        if budget == 0:
            first = "active" if phase == "start" else "closing"
        self.state = _State(first, "", 0)
        self._history: list[_State] = []  # the state before each accepted token

    @property
    def phase(self) -> str:
        return self.state.phase

    def accept_token(self, token_id: int) -> None:
        st = self.state
        before = replace(st)
        if st.phase == "active":
            self.inner.accept_token(token_id)  # GrammarError leaves everything unchanged
            st.num_inner += 1
        elif st.phase in ("reasoning", "closing"):
            self._read_reasoning(self.texts.text(token_id))
        else:
            self._read_start(token_id)
        self._history.append(before)

    def _read_reasoning(self, text: str, count: bool = True) -> None:
        """Read one token's text inside the block (count: it is a thinking token; the one
        that opened the block is not)."""
        st = self.state
        held = st.held + text
        st.num_thinking += count
        if self.end_tag in held:
            st.phase, st.held = "active", ""
            return
        st.held = held[-(len(self.end_tag) - 1):] if len(self.end_tag) > 1 else ""
        if self.budget is not None and st.num_thinking >= self.budget:
            st.phase = "closing"

    def _end_tag_prefix(self) -> str:
        """The end of the held text that begins the end tag (closing goes on from it)."""
        held = self.state.held
        return next((held[i:] for i in range(len(held)) if self.end_tag.startswith(held[i:])),
                    "")

    def _read_start(self, token_id: int) -> None:
        st = self.state
        text = self.texts.text(token_id)
        held = st.held + text
        stripped = held.lstrip(_WHITESPACE)
        if st.inner_alive:
            try:
                self.inner.accept_token(token_id)
                st.num_inner += 1
                st.start_ids += (token_id,)
            except GrammarError:
                st.inner_alive = False
        if stripped.startswith(self.start_tag):
            self.inner.rollback(st.num_inner)  # the block opened: the answer starts later
            st.phase, st.held, st.num_inner, st.inner_alive = "reasoning", "", 0, True
            st.start_ids = ()
            self._read_reasoning(stripped[len(self.start_tag):], count=False)
        elif self.start_tag.startswith(stripped):
            st.held = held
        elif st.inner_alive:
            st.phase, st.held = "active", ""
        else:
            raise GrammarError("The token neither opens the think block nor follows the grammar")

    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        st = self.state
        if st.phase == "active":
            self.inner.fill_vocab_mask(mask, row)
        elif st.phase == "reasoning":
            mask[row].fill_(-1)
        elif st.phase == "closing":
            mask[row].fill_(0)
            _allow(mask, row, self.texts.closing(self._end_tag_prefix(), self.end_tag))
        else:
            if st.inner_alive:
                self.inner.fill_vocab_mask(mask, row)
            else:
                mask[row].fill_(0)
            _allow(mask, row, self.texts.continuing(st.held, self.start_tag))

    def is_terminated(self) -> bool:
        return self.inner.is_terminated() if self.state.phase == "active" else False

    def rollback(self, num_tokens: int) -> None:
        # Invariant: the inner grammar holds exactly state.num_inner tokens.
        for _ in range(num_tokens):
            before = self._history.pop()
            held = self.state.num_inner
            if held > before.num_inner:
                self.inner.rollback(held - before.num_inner)
            elif held < before.num_inner:  # the block had opened and reset the inner grammar: replay its tokens
                for token_id in before.start_ids[held:]:
                    self.inner.accept_token(token_id)
            self.state = before

    def try_jump_forward(self) -> str | None:
        return self.inner.try_jump_forward() if self.state.phase == "active" else None

    def copy(self) -> ReasonerGrammar:
        return ReasonerGrammar(self.inner.copy(), self.texts, self.start_tag, self.end_tag,
                               self._initial_phase, self.budget)


def _allow(mask: torch.Tensor, row: int, token_ids: list[int]) -> None:
    """Set the bits of `token_ids` in mask[row] (packed int32, 32 tokens per word)."""
    if not token_ids:
        return
    ids = torch.tensor(token_ids, dtype=torch.int64)
    words = ids // 32
    bits = torch.ones_like(ids).bitwise_left_shift(ids % 32)  # int64: bit 31 stays positive
    packed = torch.zeros(mask.shape[1], dtype=torch.int64).index_put_((words,), bits,
                                                                      accumulate=True)
    current = mask[row].to(torch.int64) & 0xFFFFFFFF
    merged = (current | packed) & 0xFFFFFFFF
    mask[row] = torch.where(merged >= 2**31, merged - 2**32, merged).to(torch.int32)
