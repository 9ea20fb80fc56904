"""The streaming machine every tool parser runs: text, and call blocks inside it.

Outside a block, text is content. A block opens at one of the parser's marker
strings (`<tool_call>`, `[TOOL_CALLS]`) or at a character the parser claims
(`{` at the start of a Llama output, `[` of a pythonic call list); the format's
`Block` then reads it character by character and emits call events.

Guarantees, for every way of cutting the text into pieces:
- content never shows a marker, nor a prefix of one, that belongs to a call:
  a possible marker prefix is held back until it is decided;
- the deltas are the same (joined) for every cut: every decision is made per
  character, never per piece;
- a call is shown once it is complete, as one delta carrying its id, name and
  whole arguments (what OpenAI's clients accumulate: one entry per call index
  per chunk, never a call whose arguments do not parse). A call cut off by the
  end of the text, or broken by malformed markup, is never shown;
- whitespace before a call, between calls, after the last call, and at the
  start of content that follows a call is dropped (held back until the next
  character decides); whitespace between text before and after a call stays;
- a block that fails before it showed anything (bad JSON, unknown tool name,
  missing call) is returned as content, exactly as written.

`lookahead=True` (the non-streaming parse) emits a block's events only once
the block is complete, so a block that fails late is content too. A streaming
block that fails after it showed a call (or content, in the generic format)
can no longer be taken back: what it showed stays, its unfinished call is
dropped, and the rest of the text is read as content again (constrained
decoding rules this out).

`finish(cut=True)`: the text was cut off (max_tokens). A block still open is
then not content: its complete calls and its content are kept, its unfinished
call and a held marker prefix are dropped, so markup never reaches content.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Callable

from radixlm.function_call.call_object import (
    WHITESPACE,
    CallArgs,
    CallEnd,
    CallStart,
    Content,
    Event,
)
from radixlm.function_call.json_scan import Step
from radixlm.function_call.types import (
    ContentDelta,
    ParseResult,
    StreamDelta,
    ToolCall,
    ToolCallDelta,
    new_call_id,
)

logger = logging.getLogger(__name__)


class Block(abc.ABC):
    """Reads one call block, one character at a time, into `events`.

    push(ch): MORE (consumed), DONE (consumed; the block is complete), DONE_BEFORE
    (complete before ch, which is not consumed; nor is `pushback`, text the block read
    tentatively and gives back to the content) or FAIL (ch cannot continue it).
    """

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.pushback = ""

    @abc.abstractmethod
    def push(self, ch: str) -> Step: ...

    def finish(self) -> bool:
        """The text ended inside the block: whether what was read is a complete block
        (it may append final events)."""
        return False


class BlockFormat:
    """Where a format's blocks open: marker strings and/or single characters."""

    markers: tuple[str, ...] = ()

    def open_marker(self, marker: str) -> Block:
        """A block after `marker` (the marker itself is not pushed)."""
        raise NotImplementedError

    def open_inline(self, ch: str, at_start: bool) -> Block | None:
        """A block starting with `ch` (which is then pushed into it), or None.

        at_start: no text but whitespace came before (nor any block)."""
        return None


class ToolCallStream:
    """Turns text pieces into content and tool-call deltas (see the module doc)."""

    def __init__(
        self,
        fmt: BlockFormat,
        *,
        lookahead: bool = False,
        id_factory: Callable[[], str] = new_call_id,
    ) -> None:
        self._fmt = fmt
        self._lookahead = lookahead
        self._id_factory = id_factory
        self._out: list[StreamDelta] = []
        self._held = ""  # a possible marker prefix
        self._pending_ws = ""  # whitespace after the last content character
        self._after_block = False  # a block came last: leading whitespace is dropped
        self._at_start = True
        self._block: Block | None = None
        self._block_raw = ""
        self._block_ws = ""  # whitespace held when the block opened
        self._block_after_block = False
        self._committed = False
        self._buffer: list[Event] = []
        self._calls: list[list[str]] = []  # [name, arguments] per complete call
        self._pending: list[str] | None = None  # [name, arguments] of the call being read
        self._content: list[str] = []
        self.finished = False

    # -- public ---------------------------------------------------------------------------

    def feed(self, text: str) -> list[StreamDelta]:
        """Read the next piece; return the deltas now certain, in order."""
        if self.finished:
            raise RuntimeError("feed() after finish()")
        for ch in text:
            self._push(ch)
        return self._take()

    def finish(self, cut: bool = False) -> list[StreamDelta]:
        """The output ended: decide everything held back; return the last deltas.

        cut: the output was cut off (max_tokens): an open block keeps only its complete
        calls and its content, and a held marker prefix is dropped."""
        if self.finished:
            return []
        self.finished = True
        while self._block is not None:  # a failed block's text may open another one
            block = self._block
            complete = block.finish()
            self._drain()
            if not complete:
                if cut:
                    self._cut_block()
                else:
                    self._fail_block()
                continue
            self._end_block()
            for c in block.pushback:
                self._push(c)
        if self._held and cut:  # a marker cut short: dropped with the space before it
            self._pending_ws = ""
        elif self._held:
            self._emit_ws_then(self._held)
        self._held = ""
        if self._pending_ws and not self._after_block:
            self._emit_content(self._pending_ws)
        self._pending_ws = ""
        return self._take()

    @property
    def tool_calls(self) -> list[ToolCall]:
        """The calls read so far (complete once finished)."""
        return [ToolCall(name, args) for name, args in self._calls]

    @property
    def content(self) -> str:
        return "".join(self._content)

    def result(self) -> ParseResult:
        return ParseResult(self.content, self.tool_calls)

    # -- characters -----------------------------------------------------------------------

    def _push(self, ch: str) -> None:
        if self._block is not None:
            self._push_block(ch)
            return
        candidate = self._held + ch
        markers = self._fmt.markers
        if any(m.startswith(candidate) for m in markers):
            if candidate in markers:
                self._held = ""
                self._open(self._fmt.open_marker(candidate), raw=candidate)
            else:
                self._held = candidate
            return
        # `candidate` opens no marker: its longest suffix that may is held, the rest is text.
        cut = next(
            (i for i in range(1, len(candidate)) if any(m.startswith(candidate[i:]) for m in markers)),
            len(candidate),
        )
        plain, self._held = candidate[:cut], candidate[cut:]
        for i, c in enumerate(plain):
            if self._block is not None:  # opened inline by an earlier character of `plain`
                rest, self._held = plain[i:] + self._held, ""
                for r in rest:
                    self._push(r)
                return
            self._push_plain(c)

    def _push_plain(self, ch: str, *, inline: bool = True) -> None:
        block = self._fmt.open_inline(ch, self._at_start) if inline else None
        if block is not None:
            self._open(block, raw="")
            self._push_block(ch)
            return
        if ch in WHITESPACE:
            self._pending_ws += ch
            return
        self._emit_ws_then(ch)

    def _push_block(self, ch: str) -> None:
        assert self._block is not None
        step = self._block.push(ch)
        if step is Step.FAIL:
            opened_inline = not self._block_raw  # `ch` would open the same block again
            self._drain()
            self._fail_block()
            if opened_inline:
                self._push_plain(ch, inline=False)
            else:
                self._push(ch)
            return
        if step is not Step.DONE_BEFORE:
            self._block_raw += ch
        self._drain()
        if step is Step.DONE or step is Step.DONE_BEFORE:
            pushback = self._block.pushback
            self._end_block()
            if step is Step.DONE_BEFORE:
                for c in pushback + ch:
                    self._push(c)

    # -- blocks ---------------------------------------------------------------------------

    def _open(self, block: Block, raw: str) -> None:
        self._block, self._block_raw = block, raw
        self._block_ws, self._pending_ws = self._pending_ws, ""
        self._block_after_block = self._after_block
        self._committed, self._buffer = False, []

    def _drain(self) -> None:
        assert self._block is not None
        # NOTE: cleared in place: the block's readers hold this list.
        events = list(self._block.events)
        self._block.events.clear()
        if self._committed:
            self._emit_events(events)
        elif events:
            self._buffer.extend(events)
            # Streaming shows a block once it has something to show: content, or a
            # complete call (a call alone is held until it ends).
            if not self._lookahead and any(isinstance(e, Content | CallEnd) for e in events):
                self._commit()

    def _commit(self) -> None:
        self._committed = True
        events, self._buffer = self._buffer, []
        self._emit_events(events)

    def _end_block(self) -> None:
        if not self._committed:
            self._commit()
        self._block = None
        self._after_block, self._at_start = True, False

    def _cut_block(self) -> None:
        """The text was cut inside the block: keep what is complete, drop the rest."""
        if not self._committed:
            self._commit()
        self._pending = None
        self._block = None
        self._after_block, self._at_start = True, False

    def _fail_block(self) -> None:
        if self._committed:
            logger.warning("A tool call stopped parsing after it was streamed: %r", self._block_raw)
            self._pending = None
            self._block = None
            self._after_block, self._at_start = True, False
            return
        # Nothing of it was shown: it is content, as written.
        self._block = None
        self._buffer = []
        self._after_block = self._block_after_block
        self._pending_ws = self._block_ws
        if self._block_raw:
            self._emit_ws_then(self._block_raw)

    # -- output ---------------------------------------------------------------------------

    def _emit_ws_then(self, text: str) -> None:
        """Content `text` (starting with a non-space), after the held whitespace, unless
        that whitespace follows a block and no content came before (content never starts
        with the space that separated it from a call)."""
        if self._pending_ws and (not self._after_block or self._content):
            self._emit_content(self._pending_ws)
        self._pending_ws = ""
        self._after_block, self._at_start = False, False
        stripped = text.rstrip(WHITESPACE)
        self._emit_content(stripped)
        self._pending_ws = text[len(stripped) :]

    def _emit_content(self, text: str) -> None:
        if not text:
            return
        self._content.append(text)
        if self._out and isinstance(self._out[-1], ContentDelta):
            self._out[-1] = ContentDelta(self._out[-1].text + text)
        else:
            self._out.append(ContentDelta(text))

    def _emit_events(self, events: list[Event]) -> None:
        for event in events:
            if isinstance(event, Content):
                self._emit_content(event.text)
            elif isinstance(event, CallStart):
                self._pending = [event.name, ""]
            elif isinstance(event, CallArgs):
                assert self._pending is not None
                self._pending[1] += event.text
            elif isinstance(event, CallEnd) and self._pending is not None:
                name, arguments = self._pending
                self._pending = None
                self._calls.append([name, arguments])
                self._out.append(
                    ToolCallDelta(len(self._calls) - 1, self._id_factory(), name, arguments)
                )

    def _take(self) -> list[StreamDelta]:
        out, self._out = self._out, []
        return out
