"""Tools in a chat request: validation, the prompt, the constraint, and the parsers.

Per request (`plan_tools`):
- `tools` and `tool_choice` are validated (`parse_tools`, `ToolChoice.from_openai`);
  each problem is a 400 naming it. tools together with another constraint
  (response_format, regex, ...) are a 400 unless tool_choice is "none".
- The prompt: the generic parser (a template with no place for tools) rewrites the
  conversation with the tool prompt (`generic_messages`); any other parser
  passes the tools to the template, with past calls' arguments as objects (what
  Hugging Face templates iterate over).
- The constraint: tool_choice required or named, or auto with
  --tool-call-constrained / `tool_call_constrained: true` (or the generic format,
  which always is), becomes the request's one grammar (`parser.constraint`), so a
  call always parses; a backend that cannot express it is a 400.
- The output: a reasoning parser (if any) first, then the tool parser, per
  choice; streaming keeps one `ChoiceParser` per choice. A call is sent once
  complete (one delta per call); an answer cut by max_tokens keeps its complete
  calls and drops the cut one.
- Bounded calls: an answer makes at most `call_limit` calls (--max-tool-calls-
  per-turn; 1 with parallel_tool_calls false), and a call that exactly repeats
  one already made in the answer ends it there (the repeat is dropped). The
  grammar enforces the limit where there is one; `ChoiceParser.stopped` tells
  the route to end the generation in every case (finish_reason "tool_calls").
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from radixlm.entrypoints.http.errors import APIError
from radixlm.entrypoints.openai.agents import AgentSettings
from radixlm.function_call import (
    ContentDelta,
    ToolCallDelta,
    ToolCallStream,
    ToolChoice,
    ToolConstraintError,
    ToolError,
    ToolParser,
    ToolSpec,
    generic_messages,
    generic_tool_prompt,
    new_call_id,
    parse_tools,
)
from radixlm.reasoning import ReasoningParser, ReasoningStream


@dataclass
class ToolPlan:
    """What one request does with its tools."""

    specs: list[ToolSpec]
    choice: ToolChoice
    parallel: bool
    parser: ToolParser
    generic: bool  # the template has no place for tools: generic prompt and format
    openai_tools: list[dict[str, Any]]
    constraint: tuple[str, str] | None = None  # (kind, text) for the sampling params
    max_calls: int | None = None  # --max-tool-calls-per-turn

    @property
    def call_limit(self) -> int | None:
        """The most calls one answer may make."""
        return self.max_calls if self.parallel else 1

    @property
    def active(self) -> bool:
        return self.choice.mode != "none"

    def template_tools(self) -> list[dict[str, Any]] | None:
        return None if self.generic or not self.active else self.openai_tools

    def messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The conversation as the template gets it."""
        if self.generic:
            if not self.active:
                return _without_tool_prompt(messages, self.specs) if _has_tool_turns(
                    messages) else messages
            return generic_messages(messages, self.specs, self.choice,
                                    parallel_tool_calls=self.parallel)
        if self.active and getattr(self.parser, "system_message_tools", False):
            messages = system_message_tools(messages, self.specs)
        return template_messages(messages)


def system_message_tools(messages: list[dict[str, Any]], specs: list[ToolSpec]
                         ) -> list[dict[str, Any]]:
    """The tools as a JSON string in the system message's `tools` field, where templates
    like Phi-4-mini's read them (a system message is added when there is none)."""
    tools = json.dumps([{"name": t.name, **({"description": t.description} if t.description
                                             else {}), "parameters": dict(t.parameters)}
                        for t in specs], ensure_ascii=False)
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "tools": tools}, *messages[1:]]
    return [{"role": "system", "content": "", "tools": tools}, *messages]


def _without_tool_prompt(messages: list[dict[str, Any]], specs: list[ToolSpec]
                         ) -> list[dict[str, Any]]:
    """tool_choice "none" on the generic format: past calls and results as plain turns,
    and no tool prompt (the model is not to call)."""
    choice = ToolChoice("auto")
    out = generic_messages(messages, specs, choice)
    prompt = generic_tool_prompt(specs, choice)
    system = str(out[0].get("content", ""))
    if system == prompt:
        return out[1:]
    out[0] = {**out[0], "content": system.removesuffix("\n\n" + prompt)}
    return out


def _has_tool_turns(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Past calls with their arguments as objects (Hugging Face templates read
    `tool_call.function.arguments` as a mapping); 400 if they are not JSON."""
    out = []
    for i, message in enumerate(messages):
        calls = message.get("tool_calls")
        if not calls:
            out.append(message)
            continue
        fixed = []
        for j, call in enumerate(calls):
            function = dict(call.get("function") or {})
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                try:
                    function["arguments"] = json.loads(arguments) if arguments.strip() else {}
                except json.JSONDecodeError:
                    raise APIError(f"messages[{i}].tool_calls[{j}].function.arguments is not "
                                   "valid JSON", param="messages") from None
            fixed.append({**call, "type": call.get("type", "function"), "function": function})
        out.append({**message, "tool_calls": fixed})
    return out


def plan_tools(agents: AgentSettings, backend: str, tools: list[dict[str, Any]] | None,
               tool_choice: Any, parallel_tool_calls: bool, constrain_auto: bool | None,
               has_other_grammar: bool) -> ToolPlan | None:
    """The request's tool plan, or None without tools; APIError(400) on bad input."""
    if tools is None:
        if tool_choice not in (None, "none", "auto"):  # SGLang's words
            which = "required" if tool_choice == "required" else "a specific tool"
            raise APIError(f"Tools cannot be empty if tool choice is set to {which}.",
                           param="tool_choice")
        return None
    try:
        specs = parse_tools(tools)
        choice = ToolChoice.from_openai(tool_choice, specs)
    except ToolError as e:
        raise APIError(str(e), param=e.param) from e
    parser = agents.parser(specs)
    plan = ToolPlan(specs, choice, parallel_tool_calls, parser,
                    agents.tool_parser == "generic", tools, max_calls=agents.max_calls)
    if not plan.active or not specs:
        return plan
    constrained = choice.mode in ("required", "named") or parser.constrain_auto or (
        agents.tool_call_constrained if constrain_auto is None else constrain_auto)
    if has_other_grammar:
        raise APIError(f"tools with tool_choice {choice.mode!r} cannot be combined with "
                       "response_format or another grammar (regex, json_schema, ebnf, ...): "
                       "tool calls need their own constraint; set tool_choice 'none' or drop "
                       "one", param="response_format")
    if constrained:
        try:
            grammar = parser.constraint(specs, choice, parallel_tool_calls=parallel_tool_calls,
                                        max_calls=agents.max_calls, backend=backend,
                                        marker_token_ids=agents.marker_ids,
                                        bounded_numbers=agents.bounded_numbers)
        except ToolConstraintError as e:
            raise APIError(f"Cannot constrain tool calls (tool_choice {choice.mode!r}, "
                           f"--grammar-backend {backend}): {e}", param="tool_choice") from e
        plan.constraint = (grammar.kind, grammar.text)
    return plan


@dataclass
class ChoiceOutput:
    """What a choice's text became: reasoning, content and calls (OpenAI dicts)."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)


class ChoiceParser:
    """One choice's output through the reasoning parser, then the tool parser.

    feed() returns the new (reasoning, content, tool-call deltas); the call deltas are
    OpenAI chunk dicts, one per call, each complete. `stopped` turns true once the
    answer must end (a repeated call, or the call limit reached): nothing after that
    point is returned, and the route ends the generation.
    """

    def __init__(self, tools: ToolPlan | None, reasoner: ReasoningParser | None) -> None:
        self.reasoning: ReasoningStream | None = reasoner.stream() if reasoner else None
        self.parser = tools.parser if tools is not None and tools.active else None
        self.tools: ToolCallStream | None = self.parser.stream() if self.parser else None
        self.limit = tools.call_limit if tools is not None else None
        self.stopped = False
        self._call_keys: set[str] = set()
        self.result = ChoiceOutput()

    def feed(self, text: str, final: bool = False, cut: bool = False
             ) -> tuple[str, str, list[dict[str, Any]]]:
        """The new parts of `text`; final: the output ended (cut: by max_tokens)."""
        if self.stopped:
            return "", "", []
        reasoning, content = "", text
        if self.reasoning is not None:
            delta = self.reasoning.feed(text)
            if final:
                tail = self.reasoning.finish()
                delta = type(delta)(delta.reasoning_content + tail.reasoning_content,
                                    delta.content + tail.content)
            reasoning, content = delta.reasoning_content, delta.content
        calls: list[dict[str, Any]] = []
        if self.tools is not None:
            deltas = self.tools.feed(content)
            if final:
                deltas += self.tools.finish(cut=cut)
            parts = []
            for d in deltas:
                if self.stopped:
                    break
                if isinstance(d, ContentDelta):
                    parts.append(d.text)
                elif isinstance(d, ToolCallDelta) and self._admit(d.name or "", d.arguments):
                    calls.append(self._call_delta(d))
            content = "".join(parts)
        self.result.reasoning += reasoning
        self.result.content += content
        return reasoning, content, calls

    def _admit(self, name: str, arguments: str) -> bool:
        """Whether a complete call joins the answer; sets `stopped` when it must end."""
        if self.stopped:
            return False
        key = call_key(name, arguments)
        if key in self._call_keys:  # a repeat: the answer ends before it
            self.stopped = True
            return False
        self._call_keys.add(key)
        if self.limit is not None and len(self._call_keys) >= self.limit:
            self.stopped = True
        return True

    def _call_delta(self, delta: ToolCallDelta) -> dict[str, Any]:
        call_id = delta.id or new_call_id()
        self.result.tool_calls.append({"id": call_id, "type": "function", "function": {
            "name": delta.name, "arguments": delta.arguments}})
        return {"index": len(self.result.tool_calls) - 1, "id": call_id, "type": "function",
                "function": {"name": delta.name, "arguments": delta.arguments}}

    def parse_whole(self, text: str, cut: bool = False) -> ChoiceOutput:
        """A whole output (non-streaming): the same parsers, lookahead for the calls;
        cut: it ended early (max_tokens, or the route stopped it)."""
        if self.reasoning is not None:
            self.reasoning.feed(text)
            self.reasoning.finish()
            self.result.reasoning, text = self.reasoning.result()
        if self.parser is None:
            self.result.content = text
            return self.result
        parsed = self.parser.parse(text, cut=cut)
        self.result.content = parsed.content
        for call in parsed.tool_calls:
            if not self._admit(call.name, call.arguments):
                break
            self.result.tool_calls.append({"id": new_call_id(), "type": "function",
                                           "function": {"name": call.name,
                                                        "arguments": call.arguments}})
        return self.result


def call_key(name: str, arguments: str) -> str:
    """What makes two calls the same: the name and the arguments as JSON values (key
    order and spacing aside)."""
    try:
        value = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        value = arguments
    return f"{name}\0{value}"


def finish_reason(finish: str | None, parser: ChoiceParser) -> str | None:
    """OpenAI's finish_reason for a choice: "tool_calls" when it ended with calls (or the
    route ended it at a repeated call or the call limit), else the runtime's."""
    if finish is None:
        return None
    if parser.stopped or (parser.result.tool_calls and finish == "stop"):
        return "tool_calls"
    return finish
