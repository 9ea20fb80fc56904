"""Incremental JSON scanning, one character at a time, for the streaming tool parsers.

`JsonScanner` checks that the characters pushed so far are a prefix of one JSON
value (RFC 8259, strict: no NaN, no raw control characters in strings) and says
exactly where the value ends. `JsonStringDecoder` decodes the inside of a JSON
string as it arrives, holding back an escape sequence until it is complete.

Both keep O(1) work per character, so a parser fed token by token does O(n)
work over an output of n characters.
"""

from __future__ import annotations

import enum
import json

MAX_DEPTH = 128  # nesting past this is rejected (json.loads would recurse that deep)
_WHITESPACE = " \t\n\r"
_DIGITS = "0123456789"
_HEX = "0123456789abcdefABCDEF"
_SIMPLE_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_LITERALS = {"t": "true", "f": "false", "n": "null"}
# Number states: which may end the number, and the transitions on a digit / "." / "e" / sign.
_NUMBER_COMPLETE = {"zero", "int", "frac", "exp"}


class Step(enum.Enum):
    """What one pushed character did to the value."""

    MORE = "more"  # consumed; the value goes on
    DONE = "done"  # consumed, and it completed the value
    DONE_BEFORE = "done_before"  # the value (a number) had ended before it; not consumed
    FAIL = "fail"  # it cannot continue the value; the scanner is unchanged


class _State(enum.Enum):
    VALUE = "value"  # a value is expected (whitespace allowed)
    STRING = "string"
    NUMBER = "number"
    LITERAL = "literal"
    KEY_OR_CLOSE = "key_or_close"  # just after "{"
    KEY = "key"  # after "," in an object
    COLON = "colon"  # after a key
    VALUE_OR_CLOSE = "value_or_close"  # just after "["
    AFTER_VALUE = "after_value"  # inside a container, after a member


class JsonScanner:
    """Validates one JSON value pushed character by character.

    Leading whitespace before the value is accepted. After DONE (or DONE_BEFORE) the
    scanner accepts nothing more.
    """

    def __init__(self) -> None:
        self._stack: list[str] = []  # "{" or "[" per open container
        self._state = _State.VALUE
        self._string_is_key = False
        self._escape = 0  # 0: none; 1: after "\"; 2..5: hex digits of \uXXXX still to come, +1
        self._literal_rest = ""
        self._number = ""
        self.started = False  # a non-whitespace character was consumed
        self.finished = False

    @property
    def depth(self) -> int:
        """Open containers (0 at top level)."""
        return len(self._stack)

    @property
    def in_string(self) -> bool:
        return self._state is _State.STRING

    def can_end(self) -> bool:
        """Whether the text may stop here (a complete value; a top-level number counts)."""
        if self.finished:
            return True
        return not self._stack and self._state is _State.NUMBER and self._number in _NUMBER_COMPLETE

    def push(self, ch: str) -> Step:
        if self.finished:
            return Step.FAIL
        state = self._state
        if state is _State.STRING:
            return self._push_string(ch)
        if state is _State.NUMBER:
            return self._push_number(ch)
        if state is _State.LITERAL:
            if ch != self._literal_rest[0]:
                return Step.FAIL
            self._literal_rest = self._literal_rest[1:]
            return Step.MORE if self._literal_rest else self._end_value()
        if ch in _WHITESPACE:
            return Step.MORE
        if state is _State.VALUE:
            return self._start_value(ch)
        if state is _State.VALUE_OR_CLOSE:
            return self._close() if ch == "]" else self._start_value(ch)
        if state in (_State.KEY_OR_CLOSE, _State.KEY):
            if ch == "}" and state is _State.KEY_OR_CLOSE:
                return self._close()
            if ch != '"':
                return Step.FAIL
            self._state, self._string_is_key = _State.STRING, True
            return Step.MORE
        if state is _State.COLON:
            if ch != ":":
                return Step.FAIL
            self._state = _State.VALUE
            return Step.MORE
        # AFTER_VALUE
        top = self._stack[-1]
        if ch == ",":
            self._state = _State.KEY if top == "{" else _State.VALUE
            return Step.MORE
        if (ch == "}" and top == "{") or (ch == "]" and top == "["):
            return self._close()
        return Step.FAIL

    def _start_value(self, ch: str) -> Step:
        if ch in "{[":
            if len(self._stack) >= MAX_DEPTH:
                return Step.FAIL
            self._stack.append(ch)
            self._state = _State.KEY_OR_CLOSE if ch == "{" else _State.VALUE_OR_CLOSE
        elif ch == '"':
            self._state, self._string_is_key = _State.STRING, False
        elif ch == "-" or ch in _DIGITS:
            self._state = _State.NUMBER
            self._number = "minus" if ch == "-" else ("zero" if ch == "0" else "int")
        elif ch in _LITERALS:
            self._state, self._literal_rest = _State.LITERAL, _LITERALS[ch][1:]
        else:
            return Step.FAIL
        self.started = True
        return Step.MORE

    def _push_string(self, ch: str) -> Step:
        if self._escape == 1:
            if ch == "u":
                self._escape = 5
            elif ch in _SIMPLE_ESCAPES:
                self._escape = 0
            else:
                return Step.FAIL
            return Step.MORE
        if self._escape > 1:
            if ch not in _HEX:
                return Step.FAIL
            self._escape = 0 if self._escape == 2 else self._escape - 1
            return Step.MORE
        if ch == "\\":
            self._escape = 1
            return Step.MORE
        if ch < " ":
            return Step.FAIL
        if ch != '"':
            return Step.MORE
        if self._string_is_key:
            self._state = _State.COLON
            return Step.MORE
        return self._end_value()

    def _push_number(self, ch: str) -> Step:
        state = self._number
        if ch in _DIGITS:
            nxt = {"minus": "zero" if ch == "0" else "int", "int": "int", "dot": "frac",
                   "frac": "frac", "e": "exp", "esign": "exp", "exp": "exp"}.get(state)
        elif ch == ".":
            nxt = "dot" if state in ("zero", "int") else None
        elif ch in "eE":
            nxt = "e" if state in ("zero", "int", "frac") else None
        elif ch in "+-":
            nxt = "esign" if state == "e" else None
        else:
            if state not in _NUMBER_COMPLETE:
                return Step.FAIL
            # The number ended before `ch`, which belongs to what follows it.
            if not self._stack:
                self.finished = True
                return Step.DONE_BEFORE
            self._state = _State.AFTER_VALUE
            step = self.push(ch)
            if step is Step.FAIL:
                self._state = _State.NUMBER  # unchanged, as FAIL promises
            return step
        if nxt is None:
            return Step.FAIL
        self._number = nxt
        return Step.MORE

    def _close(self) -> Step:
        self._stack.pop()
        return self._end_value()

    def _end_value(self) -> Step:
        if not self._stack:
            self.finished = True
            return Step.DONE
        self._state = _State.AFTER_VALUE
        return Step.MORE


class JsonStringDecoder:
    """Decodes the inside of a JSON string as it arrives (the opening quote already seen).

    push(ch) returns the decoded text now certain ("" while an escape is incomplete);
    after the closing quote `closed` is True. Raises ValueError on an invalid escape.
    Raw control characters are accepted (they are kept as they are).
    """

    def __init__(self) -> None:
        self._escape = ""  # the escape sequence so far, from its backslash
        self._high_surrogate = ""  # a decoded \\uD8xx waiting for its low half
        self.closed = False

    def push(self, ch: str) -> str:
        if self.closed:
            raise ValueError("character after the closing quote")
        if self._escape:
            return self._push_escape(ch)
        if ch == "\\":
            self._escape = ch
            return ""
        text = self._flush_surrogate()
        if ch == '"':
            self.closed = True
            return text
        return text + ch

    def _push_escape(self, ch: str) -> str:
        seq = self._escape + ch
        if len(seq) == 2:
            if ch == "u":
                self._escape = seq
                return ""
            if ch not in _SIMPLE_ESCAPES:
                raise ValueError(f"invalid escape \\{ch}")
            self._escape = ""
            return self._flush_surrogate() + _SIMPLE_ESCAPES[ch]
        if ch not in _HEX:
            raise ValueError(f"invalid escape {seq!r}")
        if len(seq) < 6:
            self._escape = seq
            return ""
        self._escape = ""
        code = int(seq[2:], 16)
        if 0xD800 <= code < 0xDC00:
            pending = self._flush_surrogate()
            self._high_surrogate = seq
            return pending
        if 0xDC00 <= code < 0xE000 and self._high_surrogate:
            pair = self._high_surrogate + seq
            self._high_surrogate = ""
            return str(json.loads(f'"{pair}"'))
        return self._flush_surrogate() + chr(code)

    def _flush_surrogate(self) -> str:
        """A high surrogate not followed by a low one stands alone (as json.loads keeps it)."""
        if not self._high_surrogate:
            return ""
        text = str(json.loads(f'"{self._high_surrogate}"'))
        self._high_surrogate = ""
        return text


def loads_strict(text: str) -> object:
    """json.loads that refuses NaN / Infinity and never raises anything but ValueError."""

    def refuse(name: str) -> object:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, parse_constant=refuse)
    except RecursionError as e:
        raise ValueError("JSON nested too deeply") from e
