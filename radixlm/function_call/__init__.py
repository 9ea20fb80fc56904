"""Tool calls: one parser per model family (one file each) behind one interface.

    parser = get_tool_parser("hermes", tools)        # or detect_tool_parser(template).name
    content, calls = parser.parse(text)               # a whole output
    stream = parser.stream()                          # streaming: feed() / finish() -> deltas
    kind, grammar = parser.constraint(tools, choice, parallel_tool_calls=..., backend=...)

See base.py for the contract, stream.py for the streaming guarantees and
constraint.py for what each grammar backend receives.
"""

from radixlm.function_call.base import (
    TOOL_PARSERS,
    ToolParser,
    get_tool_parser,
    marker_token_ids,
)
from radixlm.function_call.constraint import GrammarConstraint
from radixlm.function_call.detect import ParserChoice, detect_tool_parser, template_has_tools
from radixlm.function_call.generic_prompt import generic_messages, generic_tool_prompt
from radixlm.function_call.stream import ToolCallStream
from radixlm.function_call.types import (
    ContentDelta,
    ParseResult,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolConstraintError,
    ToolError,
    ToolSpec,
    new_call_id,
    parse_tools,
)

__all__ = [
    "TOOL_PARSERS",
    "ContentDelta",
    "GrammarConstraint",
    "ParseResult",
    "ParserChoice",
    "StreamDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolCallStream",
    "ToolChoice",
    "ToolConstraintError",
    "ToolError",
    "ToolParser",
    "ToolSpec",
    "detect_tool_parser",
    "generic_messages",
    "generic_tool_prompt",
    "get_tool_parser",
    "marker_token_ids",
    "new_call_id",
    "parse_tools",
    "template_has_tools",
]
