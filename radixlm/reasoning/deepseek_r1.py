"""DeepSeek-R1 (and its distills): `<think>...</think>` then the answer.

R1's chat template ends the prompt with `<think>\\n`, so the output usually
starts inside the block without the tag; a leading `<think>` is read too.
"""

from __future__ import annotations

from radixlm.reasoning.base import ReasoningParser


class DeepSeekR1Parser(ReasoningParser):
    name = "deepseek-r1"
    default_starts_in_reasoning = True
