"""Streaming readers for the JSON pieces of tool calls, one character at a time.

- `ArgumentsReader`: a call's arguments object, kept as the model wrote it, so
  that the fragments streamed are exactly the final arguments. The one change:
  a raw control character inside a string (a model writing code with real
  newlines) is written as its JSON escape, so the arguments stay valid JSON.
- `CallObjectReader`: `{"name": "f", "arguments": {...}}` (the key for the
  arguments configurable: Llama writes "parameters"), in either key order.
- `CallArrayReader`: `[call, call, ...]`.

Readers append `CallStart` / `CallArgs` / `CallEnd` events to a shared list. A
call starts (its first event) only once its name is known and valid and its
arguments have begun as an object (or the object closed without them), so most
malformed calls fail before anything of them was emitted; `CallEnd` follows
once the call is complete (its object closed).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Collection
from typing import NamedTuple

from radixlm.function_call.json_scan import JsonScanner, Step, loads_strict

WHITESPACE = " \t\n\r"
_CONTROL_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


class CallStart(NamedTuple):
    name: str


class CallArgs(NamedTuple):
    text: str


class CallEnd(NamedTuple):
    """The call started last is complete."""


class Content(NamedTuple):
    text: str


Event = CallStart | CallArgs | CallEnd | Content


def escape_control(ch: str) -> str:
    """The JSON escape of a control character."""
    return _CONTROL_ESCAPES.get(ch, f"\\u{ord(ch):04x}")


class ArgumentsReader:
    """Reads one JSON object (leading whitespace allowed), keeping its text.

    push(ch) returns a Step; `take()` returns the argument text added since the last
    take (for streaming). The text is a prefix of the final arguments at every point.
    """

    def __init__(self) -> None:
        self._scanner = JsonScanner()
        self.text = ""
        self._taken = 0

    @property
    def started(self) -> bool:
        return self._scanner.started

    @property
    def finished(self) -> bool:
        return self._scanner.finished

    def push(self, ch: str) -> Step:
        if not self._scanner.started:
            if ch in WHITESPACE:
                return Step.MORE
            if ch != "{":
                return Step.FAIL
        if self._scanner.in_string and ch < " ":
            piece = escape_control(ch)
            for c in piece:
                self._scanner.push(c)  # a valid escape inside a string: always MORE
        else:
            piece = ch
            step = self._scanner.push(ch)
            if step is Step.FAIL:
                return step
        self.text += piece
        if self._scanner.finished:
            try:
                loads_strict(self.text)
            except ValueError:
                return Step.FAIL
            return Step.DONE
        return Step.MORE

    def take(self) -> str:
        new = self.text[self._taken :]
        self._taken = len(self.text)
        return new


class KeyReader:
    """Reads one JSON string (its opening quote included) and decodes it."""

    def __init__(self) -> None:
        self._scanner = JsonScanner()
        self._raw = ""
        self.value: str | None = None

    def push(self, ch: str) -> Step:
        if not self._raw and ch != '"':
            return Step.FAIL
        step = self._scanner.push(ch)
        if step is Step.FAIL:
            return step
        self._raw += ch
        if step is Step.DONE:
            self.value = str(json.loads(self._raw))
        return step


class _Phase(enum.Enum):
    BEFORE = "before"  # whitespace, then "{"
    KEY_OR_CLOSE = "key_or_close"
    KEY = "key"
    COLON = "colon"
    VALUE = "value"
    AFTER_VALUE = "after_value"
    DONE = "done"


class CallObjectReader:
    """Reads `{"name": ..., "<args key>": {...}}` and emits the call's events.

    name_keys / args_keys: the accepted keys; the arguments may also be a JSON string
    holding an object (as OpenAI-trained models sometimes write) or null.
    tool_names: the names a call may have (None: any). extra_keys: whether other keys
    ("id", "type") are skipped rather than rejected.
    """

    def __init__(
        self,
        events: list[Event],
        *,
        tool_names: Collection[str] | None,
        name_keys: tuple[str, ...] = ("name",),
        args_keys: tuple[str, ...] = ("arguments", "parameters"),
        extra_keys: bool = True,
    ) -> None:
        self._events = events
        self._tool_names = tool_names
        self._name_keys = name_keys
        self._args_keys = args_keys
        self._extra_keys = extra_keys
        self._phase = _Phase.BEFORE
        self._key: KeyReader | None = None
        self._key_name = ""
        self._seen_keys: set[str] = set()
        self._value: JsonScanner | None = None
        self._value_raw = ""
        self._args: ArgumentsReader | None = None
        self._args_text: str | None = None  # set when the arguments are complete, not streamed
        self.name: str | None = None
        self._started_call = False

    @property
    def started(self) -> bool:
        """Whether anything but whitespace was read."""
        return self._phase is not _Phase.BEFORE

    @property
    def finished(self) -> bool:
        return self._phase is _Phase.DONE

    def push(self, ch: str) -> Step:
        phase = self._phase
        if phase is _Phase.VALUE:
            return self._push_value(ch)
        if phase in (_Phase.KEY_OR_CLOSE, _Phase.KEY) and self._key is not None:
            return self._push_key(ch)
        if ch in WHITESPACE:
            return Step.MORE
        if phase is _Phase.BEFORE:
            if ch != "{":
                return Step.FAIL
            self._phase = _Phase.KEY_OR_CLOSE
            return Step.MORE
        if phase in (_Phase.KEY_OR_CLOSE, _Phase.KEY):
            if ch == "}" and phase is _Phase.KEY_OR_CLOSE:
                return self._close()
            self._key = KeyReader()
            return self._push_key(ch)
        if phase is _Phase.COLON:
            if ch != ":":
                return Step.FAIL
            self._phase = _Phase.VALUE
            return Step.MORE
        if phase is _Phase.AFTER_VALUE:
            if ch == ",":
                self._phase = _Phase.KEY
                return Step.MORE
            if ch == "}":
                return self._close()
        return Step.FAIL

    def _push_key(self, ch: str) -> Step:
        assert self._key is not None
        step = self._key.push(ch)
        if step is Step.FAIL:
            return step
        if step is Step.DONE:
            key = self._key.value or ""
            known = key in self._name_keys or key in self._args_keys
            if key in self._seen_keys or not (known or self._extra_keys):
                return Step.FAIL
            self._seen_keys.add(key)
            self._key, self._key_name, self._phase = None, key, _Phase.COLON
        return Step.MORE

    def _push_value(self, ch: str) -> Step:
        key = self._key_name
        if key in self._args_keys:
            return self._push_args(ch)
        if self._value is None:
            if ch in WHITESPACE:
                return Step.MORE
            if key in self._name_keys and ch != '"':
                return Step.FAIL
            self._value, self._value_raw = JsonScanner(), ""
        step = self._value.push(ch)
        if step is Step.FAIL:
            return step
        if step is Step.DONE_BEFORE:  # a number ended; `ch` follows it
            self._value, self._phase = None, _Phase.AFTER_VALUE
            return self.push(ch)
        self._value_raw += ch
        if step is Step.DONE:
            if key in self._name_keys:
                name = str(json.loads(self._value_raw))
                if self._tool_names is not None and name not in self._tool_names:
                    return Step.FAIL
                self.name = name
            self._value, self._phase = None, _Phase.AFTER_VALUE
            self._maybe_start()
        return Step.MORE

    def _push_args(self, ch: str) -> Step:
        if self._args is None and self._value is None:
            if ch in WHITESPACE:
                return Step.MORE
            if ch == "{":
                self._args = ArgumentsReader()
            elif ch in '"n':  # a JSON string holding the object, or null
                self._value, self._value_raw = JsonScanner(), ""
            else:
                return Step.FAIL
        if self._args is not None:
            step = self._args.push(ch)
            if step is Step.FAIL:
                return step
            if step is Step.DONE:
                self._args_done_phase()
            self._maybe_start()
            return Step.MORE
        assert self._value is not None
        step = self._value.push(ch)
        if step is Step.FAIL:
            return step
        self._value_raw += ch
        if step is Step.DONE:
            args_text = _unwrap_arguments(self._value_raw)
            if args_text is None:
                return Step.FAIL
            self._args_text = args_text
            self._value = None
            self._args_done_phase()
            self._maybe_start()
        return Step.MORE

    def _args_done_phase(self) -> None:
        self._phase = _Phase.AFTER_VALUE

    def _close(self) -> Step:
        if self.name is None:
            return Step.FAIL
        if self._args is None and self._args_text is None:
            self._args_text = "{}"
        self._phase = _Phase.DONE
        self._maybe_start()
        self._events.append(CallEnd())
        return Step.DONE

    def _maybe_start(self) -> None:
        """Emit the call's start once it is certain, then any new argument text."""
        if not self._started_call:
            args_begun = self._args is not None or self._args_text is not None
            if self.name is None or not args_begun:
                return
            self._events.append(CallStart(self.name))
            self._started_call = True
        if self._args is not None:
            new = self._args.take()
            if new:
                self._events.append(CallArgs(new))
        elif self._args_text:
            self._events.append(CallArgs(self._args_text))
            self._args_text = ""  # emitted; "" keeps "arguments given" true


def _unwrap_arguments(raw: str) -> str | None:
    """The arguments text from a JSON string holding an object, or null; None if neither."""
    value = json.loads(raw)
    if value is None:
        return "{}"
    if not isinstance(value, str):
        return None
    try:
        inner = loads_strict(value)
    except ValueError:
        return None
    return value if isinstance(inner, dict) else None


class _ArrayPhase(enum.Enum):
    OPEN = "open"
    ITEM_OR_CLOSE = "item_or_close"
    ITEM = "item"
    AFTER_ITEM = "after_item"
    DONE = "done"


class CallArrayReader:
    """Reads `[call, call, ...]` (whitespace allowed around), each a CallObjectReader.

    min_items: fewer calls than this fails at the closing bracket.
    """

    def __init__(
        self, events: list[Event], *, tool_names: Collection[str] | None, min_items: int = 1
    ) -> None:
        self._events = events
        self._tool_names = tool_names
        self._min_items = min_items
        self._phase = _ArrayPhase.OPEN
        self._item: CallObjectReader | None = None
        self.num_items = 0

    @property
    def finished(self) -> bool:
        return self._phase is _ArrayPhase.DONE

    def can_finish(self) -> bool:
        """Complete but for the closing bracket."""
        return self._phase is _ArrayPhase.AFTER_ITEM and self.num_items >= self._min_items

    def push(self, ch: str) -> Step:
        phase = self._phase
        if phase is _ArrayPhase.ITEM:
            assert self._item is not None
            if not self._item.started and ch in WHITESPACE:
                return Step.MORE
            step = self._item.push(ch)
            if step is Step.FAIL:
                return step
            if step is Step.DONE:
                self.num_items += 1
                self._item, self._phase = None, _ArrayPhase.AFTER_ITEM
            return Step.MORE
        if ch in WHITESPACE:
            return Step.MORE
        if phase is _ArrayPhase.OPEN:
            if ch != "[":
                return Step.FAIL
            self._phase = _ArrayPhase.ITEM_OR_CLOSE
            return Step.MORE
        if ch == "]" and phase in (_ArrayPhase.ITEM_OR_CLOSE, _ArrayPhase.AFTER_ITEM):
            if self.num_items < self._min_items:
                return Step.FAIL
            self._phase = _ArrayPhase.DONE
            return Step.DONE
        if phase is _ArrayPhase.AFTER_ITEM:
            if ch != ",":
                return Step.FAIL
            self._phase = _ArrayPhase.ITEM
            self._item = CallObjectReader(self._events, tool_names=self._tool_names)
            return Step.MORE
        if phase is _ArrayPhase.ITEM_OR_CLOSE:
            self._phase = _ArrayPhase.ITEM
            self._item = CallObjectReader(self._events, tool_names=self._tool_names)
            return self.push(ch)
        return Step.FAIL
