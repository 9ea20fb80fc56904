"""The server's agent settings, decided once at start-up: the tool-call parser and the
reasoning parser.

The tool parser is `--tool-call-parser` or the one the chat template shows
(`detect_tool_parser`); the start-up log says which and why. When the parser's
markup is one special token of the tokenizer (Qwen's `<tool_call>`, Mistral's
`[TOOL_CALLS]`), requests with tools keep special tokens in the output text
(`skip_special_tokens=False`), or the markup would vanish before the parser
sees it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from radixlm.chat_template import ChatTemplate
from radixlm.function_call import (
    ParserChoice,
    ToolParser,
    detect_tool_parser,
    get_tool_parser,
    marker_token_ids,
)
from radixlm.reasoning import ReasoningParser, get_reasoning_parser
from radixlm.server_args import ServerArgs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentSettings:
    tool_parser: str  # a TOOL_PARSERS name
    reason: str  # why (for the log)
    marker_ids: dict[str, int]  # the parser's markup that is one token, and its id
    keep_special_tokens: bool  # some markup is a special token: do not skip them
    reasoning_parser: str | None
    tool_call_constrained: bool
    max_calls: int = 16  # --max-tool-calls-per-turn
    bounded_numbers: bool = True  # not --constrained-json-unbounded-numbers

    def parser(self, tools: Any = None) -> ToolParser:
        return get_tool_parser(self.tool_parser, tools)

    def reasoner(self, thinking: bool = True) -> ReasoningParser | None:
        if self.reasoning_parser is None:
            return None
        return get_reasoning_parser(self.reasoning_parser, thinking=thinking)


def template_source(template: ChatTemplate, tokenizer: Any) -> str | None:
    """The Jinja text the chat template renders with."""
    if template.source is not None:
        return template.source
    source = getattr(tokenizer, "chat_template", None)
    if isinstance(source, dict):  # several named templates: the default one
        source = source.get("default") or next(iter(source.values()), None)
    return source if isinstance(source, str) else None


def choose_agent_settings(args: ServerArgs, template: ChatTemplate, tokenizer: Any,
                          model_info: dict[str, Any]) -> AgentSettings:
    """The parsers for this model and flags; logs the choice."""
    if args.tool_call_parser is not None:
        choice = ParserChoice(args.tool_call_parser, "--tool-call-parser")
    else:
        special = set(getattr(tokenizer, "all_special_tokens", []) or [])
        special |= set(getattr(tokenizer, "get_added_vocab", dict)() or {})
        choice = detect_tool_parser(template_source(template, tokenizer),
                                    special_tokens=special,
                                    architectures=model_info.get("architectures") or [])
    parser = get_tool_parser(choice.name)
    ids = marker_token_ids(parser, tokenizer)
    special_ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    keep = any(i in special_ids for i in ids.values())
    logger.info("Tool-call parser: %s (%s)%s", choice.name, choice.reason,
                "; special tokens kept in tool requests" if keep else "")
    # (chosen at start-up: --reasoning-parser, else the chat template; family_defaults.py)
    logger.info("Reasoning parser: %s", args.reasoning_parser or
                "none (no --reasoning-parser and no <think> block in the chat template)")
    return AgentSettings(choice.name, choice.reason, ids, keep, args.reasoning_parser,
                         args.tool_call_constrained, args.max_tool_calls_per_turn,
                         not args.constrained_json_unbounded_numbers)
