"""The detokenizer process: token id deltas in, text deltas out.

Per request it keeps an incremental decode state (see
`incremental_detokenizer.py`) and how much text it has already emitted.
While a request runs, text that could be the start of one of its stop strings
is held back, so a stop string is never streamed; when it finishes on a stop
string, the text is cut before it (unless `no_stop_trim`). Stop regexes work
the same way (messages/stop_regex.py): text where a match could still begin is held
back, and at finish the text is cut before the match (after it with
`no_stop_trim`), never past it.
"""

from __future__ import annotations

import logging
import os
import sys
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

import zmq

from radixlm.detokenizer.incremental_detokenizer import DecodeState, IncrementalDetokenizer
from radixlm.detokenizer.stop_strings import safe_stream_len, trim_at_stop
from radixlm.messages.io_struct import BatchStrOut, BatchTokenIDOut, ProcessError, StrOut, TokenOut
from radixlm.messages.stop_regex import safe_regex_stream_len, trim_at_regex
from radixlm.utils import PortArgs, configure_logging, parent_alive

if TYPE_CHECKING:
    from radixlm.server_args import ServerArgs
    from radixlm.tokenizer_utils import TokenDecoder

logger = logging.getLogger(__name__)


@dataclass
class _ReqText:
    state: DecodeState
    text: str = ""  # all confirmed text
    num_emitted: int = 0  # characters of `text` already sent


class DetokenizerManager:
    def __init__(self, tokenizer: TokenDecoder | None) -> None:
        """tokenizer: None with --skip-tokenizer-init (token ids pass through, no text)."""
        self.detok = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self.reqs: dict[str, _ReqText] = {}

    def handle(self, batch: BatchTokenIDOut) -> BatchStrOut:
        """Decode every request of the batch at once (one batch_decode per flag set)."""
        if self.detok is None:
            return BatchStrOut([StrOut(out.rid, "", out) for out in batch.outs])
        entries = []
        for out in batch.outs:
            entry = self.reqs.get(out.rid)
            if entry is None:
                entry = self.reqs[out.rid] = _ReqText(DecodeState())
            entries.append(entry)
        pieces = self.detok.step_batch(
            [e.state for e in entries],
            [out.new_token_ids for out in batch.outs],
            [out.skip_special_tokens for out in batch.outs],
            [out.spaces_between_special_tokens for out in batch.outs],
            finished=[out.finished_reason is not None for out in batch.outs],
        )
        return BatchStrOut([self._emit(out, e, p) for out, e, p in zip(batch.outs, entries, pieces)])

    def _emit(self, out: TokenOut, entry: _ReqText, piece: str) -> StrOut:
        entry.text += piece
        if out.finished_reason is None:
            end = safe_stream_len(entry.text, out.stop)
            if out.stop_regex:
                end = min(end, safe_regex_stream_len(entry.text, out.stop_regex,
                                                     entry.num_emitted))
        else:
            reason = out.finished_reason
            matched = reason.matched
            if isinstance(matched, str) and reason.matched_regex:
                entry.text = trim_at_regex(entry.text, matched, keep_match=out.no_stop_trim)
            elif isinstance(matched, str) and not out.no_stop_trim:
                entry.text = trim_at_stop(entry.text, matched)
            end = len(entry.text)
            del self.reqs[out.rid]
        delta = entry.text[entry.num_emitted : end] if end > entry.num_emitted else ""
        entry.num_emitted = max(entry.num_emitted, end)
        return StrOut(out.rid, delta, out)


def run_detokenizer_process(server_args: ServerArgs, model_dir: str, ports: PortArgs) -> None:
    configure_logging(server_args.log_level, prefix="detokenizer")
    ctx = zmq.Context(1)
    ctx.setsockopt(zmq.LINGER, 0)  # never wait on a dead peer at exit
    recv = ctx.socket(zmq.PULL)
    recv.bind(ports.detokenizer_input)
    send = ctx.socket(zmq.PUSH)
    send.connect(ports.tokenizer_input)
    try:
        from radixlm.tokenizer_utils import load_decode_tokenizer

        manager = DetokenizerManager(
            None if server_args.skip_tokenizer_init
            else load_decode_tokenizer(server_args.tokenizer_path or model_dir))
        poller = zmq.Poller()
        poller.register(recv, zmq.POLLIN)
        parent = os.getppid()
        while parent_alive(parent):
            if poller.poll(1000):
                send.send_pyobj(manager.handle(recv.recv_pyobj()))
        os._exit(0)  # the parent died: exit now
    except Exception as e:  # noqa: BLE001 - report, then die
        logger.error("Detokenizer failed:\n%s", traceback.format_exc())
        send.send_pyobj(ProcessError("detokenizer", f"{type(e).__name__}: {e}"))
        send.close(linger=1000)
        sys.exit(1)
