"""Choose a model's tool-call parser from its chat template and tokenizer.

The template decides: a template that never mentions `tools` has no place
for them, so the tools go into a generic system prompt and the generic format
is used. Otherwise the format's marker written in the template names the
parser; failing that, the tokenizer's special tokens, then the architecture.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence
from typing import NamedTuple


class ParserChoice(NamedTuple):
    """The parser name and why (for the start-up log)."""

    name: str
    reason: str


# In order: the first marker found in the template wins. Pythonic templates (Llama
# 3.2 / 3.3 / 4) may also mention <|python_tag|>, so they come before llama3.
_TEMPLATE_MARKERS: tuple[tuple[str, str], ...] = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_start|>", "pythonic"),
    ("[func_name1(", "pythonic"),
    ("<|python_tag|>", "llama3"),
    ('"parameters": dictionary of argument name', "llama3"),
    ("<|tool|>", "phi4_mini"),  # Phi-4-mini: tools in the system message's `tools` field
)
_SPECIAL_TOKENS: tuple[tuple[str, str], ...] = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|python_tag|>", "llama3"),
)
_ARCHITECTURES: tuple[tuple[str, str], ...] = (
    ("Qwen2ForCausalLM", "hermes"),
    ("Qwen3ForCausalLM", "hermes"),
    ("Qwen3MoeForCausalLM", "hermes"),
)
_TOOLS_RE = re.compile(r"\btools\b")


def template_has_tools(chat_template: str | None) -> bool:
    """Whether the template can render a `tools` argument at all."""
    return bool(chat_template) and _TOOLS_RE.search(chat_template or "") is not None


def detect_tool_parser(
    chat_template: str | None,
    *,
    special_tokens: Collection[str] = (),
    architectures: Sequence[str] = (),
) -> ParserChoice:
    """The tool-call parser for a model.

    chat_template: the Jinja source in use; special_tokens: the tokenizer's special and
    added token strings; architectures: config.json's `architectures`.
    """
    if not template_has_tools(chat_template):
        return ParserChoice("generic", "the chat template has no place for tools")
    assert chat_template is not None
    for marker, name in _TEMPLATE_MARKERS:
        if marker in chat_template:
            return ParserChoice(name, f"the chat template writes {marker!r}")
    for token, name in _SPECIAL_TOKENS:
        if token in special_tokens:
            return ParserChoice(name, f"the tokenizer has the token {token!r}")
    for arch, name in _ARCHITECTURES:
        if arch in architectures:
            return ParserChoice(name, f"the model is a {arch}")
    return ParserChoice(
        "generic", "the chat template renders tools in a format radixlm does not recognize"
    )
