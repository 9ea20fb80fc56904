"""Reasoning output: think blocks split into reasoning_content, per model family."""

from radixlm.reasoning.base import (
    REASONING_PARSERS,
    ReasoningDelta,
    ReasoningParser,
    ReasoningResult,
    ReasoningStream,
    get_reasoning_parser,
)

__all__ = [
    "REASONING_PARSERS",
    "ReasoningDelta",
    "ReasoningParser",
    "ReasoningResult",
    "ReasoningStream",
    "get_reasoning_parser",
]
