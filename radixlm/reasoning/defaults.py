"""The reasoning parser a model gets when `--reasoning-parser` is not given.

The chat template decides, as it does for tool calls (function_call/detect.py):
a template that writes no `<think>` has no think block to split. One that opens
the block in the generation prompt (DeepSeek-R1 and its distills, Qwen3's
"Thinking-2507" models) starts every output inside it (`deepseek-r1`,
`qwen3-thinking`); one that only mentions it (Qwen3's hybrid models, SmolLM3's
/think mode) lets the model open it (`qwen3`).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

THINK = "<think>"
# The generation prompt's part of a template: after `add_generation_prompt`.
_GENERATION_PROMPT = re.compile(r"if\s+add_generation_prompt\s*%\}(?P<tail>.*)", re.S)
_QWEN3_ARCHITECTURES = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


class ReasoningChoice(NamedTuple):
    """The parser name (None: no parser) and why (for the start-up log)."""

    name: str | None
    reason: str


def default_reasoning_parser(chat_template: str | None,
                             architectures: Sequence[str] = ()) -> ReasoningChoice:
    """The reasoning parser for a model with this chat template and architectures."""
    if not chat_template or THINK not in chat_template:
        return ReasoningChoice(None, "the chat template writes no <think> block")
    match = _GENERATION_PROMPT.search(chat_template)
    tail = re.split(r"\{%-?\s*endif", match.group("tail"), maxsplit=1)[0] if match else ""
    # An empty block written when thinking is off ("<think>\n\n</think>") opens nothing.
    opens = tail.count(THINK) > tail.count("</think>")
    if opens:
        name = "qwen3-thinking" if any(a in _QWEN3_ARCHITECTURES for a in architectures) \
            else "deepseek-r1"
        return ReasoningChoice(name, "the chat template opens a <think> block in the "
                                     "generation prompt")
    return ReasoningChoice("qwen3", "the chat template has <think> blocks the model opens")
