"""Ending an answer with tools where it must end: a repeated call, or the call limit.

A model left to call tools can repeat the same call until max_tokens (the
default 135M model does, under every agent framework). The tool grammar bounds
the number of calls where there is one; a call that repeats one already made in
the answer, or any call past the limit without a grammar, is seen by the
choice's `ChoiceParser` (it sets `stopped`), and the route then aborts that
sample in the runtime: the answer ends there, finish_reason "tool_calls".

A non-streaming request with tools is therefore sent to the runtime as a stream
and watched here (`collect_watching`); its outputs are merged per sample into
the one output a non-streaming request would have had (`merge_outputs`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request

from radixlm.entrypoints.http.utils import collect
from radixlm.messages.generate_output import GenerateOutput

STOP_MESSAGE = "The answer ended: a repeated tool call, or the tool-call limit"


def merge_outputs(outs: list[GenerateOutput]) -> GenerateOutput:
    """One sample's stream outputs (in order) as one output with everything they carry."""
    last = outs[-1]
    merged = GenerateOutput(**{**last.__dict__})
    merged.text = "".join(o.text for o in outs)
    merged.token_ids = [t for o in outs for t in o.token_ids]
    for name in ("output_token_logprobs", "output_top_logprobs", "hidden_states"):
        parts = [getattr(o, name) for o in outs if getattr(o, name) is not None]
        setattr(merged, name, [x for part in parts for x in part] if parts else None)
    for name in ("input_token_logprobs", "input_top_logprobs"):
        setattr(merged, name, next((getattr(o, name) for o in outs
                                    if getattr(o, name) is not None), None))
    return merged


class CallWatch:
    """Per sample, a parser that says when the answer must end, and the abort sent."""

    def __init__(self, tm: Any, new_parser: Callable[[], Any]) -> None:
        self.tm = tm
        self.new_parser = new_parser
        self.parsers: dict[int, Any] = {}
        self.stopped: set[int] = set()

    def see(self, out: GenerateOutput) -> bool:
        """Feed one stream output; True when its sample has just been stopped here."""
        if out.index in self.stopped:
            return False
        parser = self.parsers.setdefault(out.index, self.new_parser())
        finish = out.finish_reason.type if out.finish_reason is not None else None
        parser.feed(out.text, final=finish is not None, cut=finish == "length")
        if not parser.stopped:
            return False
        self.stopped.add(out.index)
        if finish is None:
            self.tm.abort_request(out.rid, message=STOP_MESSAGE)
        return True


async def collect_watching(request: Request, tm: Any, obj: Any,
                           new_parser: Callable[[], Any]) -> list[GenerateOutput]:
    """Like `collect`, for a request with tools: run as a stream, each sample watched
    and stopped at a repeated call or the call limit; one merged output per sample."""
    obj.stream = True
    watch = CallWatch(tm, new_parser)
    per_sample: dict[int, list[GenerateOutput]] = {}

    async def watched() -> Any:
        async for out in tm.generate(obj):
            watch.see(out)
            yield out

    for out in await collect(request, watched()):
        per_sample.setdefault(out.index, []).append(out)
    return [merge_outputs(per_sample[i]) for i in sorted(per_sample)]
