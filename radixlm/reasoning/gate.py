"""Where a request's grammar starts when a reasoning parser is on (see
constrained/reasoner_grammar.py for how the scheduler enforces it).

The phase is a sampling parameter (`reasoning_phase`):
- "inside": the output starts inside the think block (the prompt opened it, or the
  family always does): the grammar starts after the end tag;
- "start": the output may open a block with the start tag (Qwen3): the grammar
  allows that too, and starts after the end tag if the block was opened, else at once;
- "none" (thinking turned off) or unset without a parser: from the first token.
"""

from __future__ import annotations

from radixlm.reasoning.base import ReasoningParser

REASONING_PHASES = ("none", "start", "inside")


def grammar_phase(parser: ReasoningParser | None, prompt_text: str) -> str | None:
    """The phase for a constrained request's output (None: no reasoning parser)."""
    if parser is None:
        return None
    if not parser.thinking:
        return "none"
    if parser.starts_in_reasoning or parser.prompt_opens_reasoning(prompt_text):
        return "inside"
    return "start"


def reasoning_for_prompt(name: str, prompt_text: str, thinking: bool = True) -> ReasoningParser:
    """The named parser, starting inside the block when the prompt opened it."""
    from radixlm.reasoning.base import REASONING_PARSERS, get_reasoning_parser
    from radixlm.utils import resolve_lazy

    cls: type[ReasoningParser] = resolve_lazy(REASONING_PARSERS[name])
    opens = cls.default_starts_in_reasoning or cls.prompt_opens_reasoning(prompt_text)
    return get_reasoning_parser(name, starts_in_reasoning=opens, thinking=thinking)
