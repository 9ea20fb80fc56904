"""separate_reasoning on the native /generate: the think block and the answer apart,
next to the raw `text` (which never changes).

Whole outputs get `reasoning_content` and `content`; stream events get the new
parts as `reasoning_content_delta` and `content_delta` (one ReasoningStream per
sample, so the deltas join to the whole split).
"""

from __future__ import annotations

from typing import Any

from radixlm.messages.generate_output import GenerateOutput
from radixlm.reasoning.base import ReasoningStream
from radixlm.reasoning.gate import reasoning_for_prompt


class ReasoningSplitter:
    """name: the reasoning parser (None: separate_reasoning is off, dicts pass through).
    prompts: the request's prompt texts, in order (empty for token-id prompts)."""

    def __init__(self, name: str | None, prompts: list[str], num_samples: list[int]
                 | None = None) -> None:
        self.name = name
        self.prompts = prompts
        # index -> prompt: the runtime's index is prompt-major (prompt i, sample j of n)
        self.owner: list[int] = [i for i, n in enumerate(num_samples or []) for _ in range(n)]
        self.streams: dict[int, ReasoningStream] = {}

    def _prompt(self, index: int) -> str:
        prompt = self.owner[index] if index < len(self.owner) else index
        return self.prompts[prompt] if prompt < len(self.prompts) else ""

    def whole(self, index: int, d: dict[str, Any]) -> dict[str, Any]:
        if self.name is None:
            return d
        result = reasoning_for_prompt(self.name, self._prompt(index)).parse(d["text"])
        return {**d, "reasoning_content": result.reasoning_content, "content": result.content}

    def delta(self, out: GenerateOutput, d: dict[str, Any]) -> dict[str, Any]:
        if self.name is None:
            return d
        stream = self.streams.get(out.index)
        if stream is None:
            stream = reasoning_for_prompt(self.name, self._prompt(out.index)).stream()
            self.streams[out.index] = stream
        part = stream.feed(out.text)
        reasoning, content = part.reasoning_content, part.content
        if out.finish_reason is not None:
            tail = stream.finish()
            reasoning, content = reasoning + tail.reasoning_content, content + tail.content
        return {**d, "reasoning_content_delta": reasoning, "content_delta": content}
