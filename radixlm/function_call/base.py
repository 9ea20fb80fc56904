"""The interface every tool-call parser keeps, and the registry of parsers by name.

A parser knows one model family's tool-call format in four directions:
- `parse(text)`: a whole output -> (content, [ToolCall]);
- `stream()`: a `ToolCallStream` fed text pieces, giving OpenAI-style deltas
  whose joined result equals `parse` for every cut of a well-formed text;
- `render(content, calls)`: calls written in the format (for a conversation's
  history, and the inverse of `parse`);
- `constraint(...)`: a grammar (per backend) whose every output parses with
  this parser into calls whose arguments validate against the tools' schemas.

Malformed markup never raises: what does not parse is content. Names are
SGLang's `--tool-call-parser` names.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

from radixlm.function_call.constraint import GrammarConstraint, render_constraint
from radixlm.function_call.grammar_ir import Lit, Node, Tag, alt, repeat, seq
from radixlm.function_call.stream import BlockFormat, ToolCallStream
from radixlm.function_call.types import (
    ParseResult,
    ToolCall,
    ToolChoice,
    ToolConstraintError,
    ToolSpec,
    new_call_id,
)
from radixlm.utils import resolve_lazy


class ToolParser(BlockFormat, abc.ABC):
    """One tool-call format. Stateless apart from the tools: one instance serves any
    number of requests with those tools (each stream has its own state).

    tools: the request's tools; a call naming another function is not a call (it stays
    content). None accepts any name (for tests and offline parsing).
    """

    name: ClassVar[str]
    # Whether tool_choice "auto" can be constrained by a trigger in free text.
    supports_trigger: ClassVar[bool] = True
    # The format's markup strings that tokenizers often hold as single tokens.
    markup: ClassVar[tuple[str, ...]] = ()
    # Whether tool_choice "auto" is constrained even when not asked for: the model was
    # never trained on the format (the generic one), so the grammar is what makes it work.
    constrain_auto: ClassVar[bool] = False

    def __init__(self, tools: Sequence[ToolSpec] | None = None) -> None:
        self.tools = list(tools or [])
        self.tool_names: frozenset[str] | None = (
            None if tools is None else frozenset(t.name for t in self.tools)
        )

    def parse(self, text: str, cut: bool = False) -> ParseResult:
        """Split a whole output into content and calls.

        cut: the output was cut off (max_tokens): a call left unfinished is dropped, not
        returned as content (see ToolCallStream.finish)."""
        stream = ToolCallStream(self, lookahead=True)
        stream.feed(text)
        stream.finish(cut=cut)
        return stream.result()

    def stream(self, id_factory: Callable[[], str] = new_call_id) -> ToolCallStream:
        """A fresh streaming parser (one per request and choice)."""
        return ToolCallStream(self, id_factory=id_factory)

    @abc.abstractmethod
    def render(self, content: str, calls: Sequence[ToolCall]) -> str:
        """The text this format writes for `content` followed by `calls` (arguments must be
        JSON objects)."""

    def constraint(
        self,
        tools: Sequence[ToolSpec],
        choice: ToolChoice,
        *,
        parallel_tool_calls: bool = True,
        max_calls: int | None = None,
        backend: str = "xgrammar",
        marker_token_ids: Mapping[str, int] | None = None,
        bounded_numbers: bool = True,
    ) -> GrammarConstraint:
        """The grammar that enforces `choice` for `tools` on `backend`.

        required: one or more calls (at most max_calls; exactly one when
        parallel_tool_calls is False) and nothing else; named: exactly one call of that
        function; auto: free text in which the format's start marker must begin a valid
        call, after which only calls follow, as many as required allows
        (ToolConstraintError where the format has no such marker or the backend cannot
        express it). After each call the grammar may end. Raises ToolConstraintError for
        "none" and for a backend that cannot express the grammar.
        marker_token_ids: `marker_token_ids(parser, tokenizer)`, computed once per tokenizer.
        bounded_numbers: JSON numbers with bounded digits (constrained/json_bounds.py).
        """
        allowed = choice.allowed_tools(tools)
        if not allowed:
            raise ToolConstraintError(f"tool_choice {choice.mode!r} leaves no tool to constrain")
        limit = max_calls if parallel_tool_calls else 1
        if choice.mode == "named":
            node = self.calls_grammar(allowed, 1)
        elif choice.mode == "required":
            node = self.calls_grammar(allowed, limit)
        else:
            if not self.supports_trigger:
                raise ToolConstraintError(
                    f"The {self.name} tool-call format has no start marker to trigger a grammar on"
                )
            node = self.auto_grammar(allowed, limit)
        return render_constraint(node, backend, marker_token_ids, bounded_numbers)

    @abc.abstractmethod
    def call_grammar(self, tool: ToolSpec) -> Node:
        """One call of `tool`, as this format writes it between calls."""

    @abc.abstractmethod
    def calls_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        """The whole output: one or more calls (at most max_calls), nothing else."""

    @abc.abstractmethod
    def auto_grammar(self, tools: Sequence[ToolSpec], max_calls: int | None) -> Node:
        """The whole output: free text until the start marker, then one or more calls (at
        most max_calls; None: unbounded) and nothing else."""

    def _any_call(self, tools: Sequence[ToolSpec]) -> Node:
        return alt(*(self.call_grammar(tool) for tool in tools))

    def _call_list(self, tools: Sequence[ToolSpec], sep: str, max_calls: int | None) -> Node:
        return repeat(self._any_call(tools), sep, 1, max_calls)

    @staticmethod
    def _chained_tag(tag: Tag, opens: Node, sep: str, max_calls: int | None) -> Tag:
        """The first call's tag, holding the calls after it: `tag.content`, then up to
        max_calls - 1 times `tag.end + sep` and another call's opening (`opens`: a call
        without its end, which every call shares), then `tag.end`.

        NOTE: the end stays the tag's own (xgrammar wants a non-empty end after content
        that may repeat without bound)."""
        if max_calls == 1:
            return tag
        more = None if max_calls is None else max_calls - 1
        chained = seq(tag.content, repeat(seq(Lit(tag.end + sep), opens), "", 0, more))
        return Tag(tag.begin, chained, tag.end)


def marker_token_ids(parser: ToolParser, tokenizer: Any) -> dict[str, int]:
    """The parser's markup strings that are exactly one token of `tokenizer` (a
    transformers tokenizer), with their ids."""
    result = {}
    for marker in parser.markup:
        ids = tokenizer.encode(marker, add_special_tokens=False)
        if len(ids) == 1:
            result[marker] = int(ids[0])
    return result


# NOTE: "module:Name" entries import a parser's module only when it is used.
TOOL_PARSERS: dict[str, str | type[ToolParser]] = {
    "hermes": "radixlm.function_call.hermes:HermesParser",
    "qwen25": "radixlm.function_call.hermes:HermesParser",
    "qwen": "radixlm.function_call.hermes:HermesParser",
    "llama3": "radixlm.function_call.llama3:Llama3Parser",
    "mistral": "radixlm.function_call.mistral:MistralParser",
    "pythonic": "radixlm.function_call.pythonic:PythonicParser",
    "generic": "radixlm.function_call.generic:GenericParser",
    "phi4_mini": "radixlm.function_call.phi4_mini:Phi4MiniParser",
}


def get_tool_parser(name: str, tools: Sequence[ToolSpec] | None = None) -> ToolParser:
    """The parser registered as `name` (SGLang's --tool-call-parser names) for `tools`."""
    if name not in TOOL_PARSERS:
        raise ValueError(f"Unknown tool-call parser {name!r}; expected one of {sorted(TOOL_PARSERS)}")
    cls: type[ToolParser] = resolve_lazy(TOOL_PARSERS[name])
    return cls(tools)
