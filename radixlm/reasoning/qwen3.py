"""Qwen3: an optional `<think>...</think>` at the start of the output, then the answer.

With `enable_thinking: false` the template writes an empty block into the
prompt and the output is all content (pass thinking=False). The "thinking"
variants (Qwen3-*-Thinking-2507) open the block in the prompt, as DeepSeek-R1
does: `qwen3-thinking`.
"""

from __future__ import annotations

from radixlm.reasoning.base import ReasoningParser


class Qwen3Parser(ReasoningParser):
    name = "qwen3"
    default_starts_in_reasoning = False


class Qwen3ThinkingParser(Qwen3Parser):
    name = "qwen3-thinking"
    default_starts_in_reasoning = True
