"""A fake runtime for the HTTP layer's unit tests: no model, no child processes.

`FakeTokenizerManager` has the TokenizerManager's interface. Its tokenizer is a
real Hugging Face tokenizer built in memory (one token per byte, chatml
template), so templates, encode and decode behave as with a real model. A
sample "generates" the bytes of `REPLY` cycled, one token per `delay` seconds,
honouring max_new_tokens, stop strings, logprobs and aborts; validation is the
runtime's own (`validate_request`), and so is the multimodal processing
(`mm_processor`: text-only by default, or a real one over a tiny LLaVA folder).
Every request it was given is kept in `received`. Grammars are checked for
kind only (`grammar_backend`), never applied.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

from radixlm.messages.generate_output import GenerateOutput
from radixlm.messages.io_struct import FinishReason, FlushCacheOut, sample_rid
from radixlm.multimodal.processor import BaseMultimodalProcessor, TextOnlyProcessor
from radixlm.server_args import ServerArgs
from radixlm.tokenizer.async_tokenizer import AsyncTokenizer
from radixlm.tokenizer.request_input import GenerateReqInput
from radixlm.tokenizer.tokenizer_manager import EngineDeadError
from radixlm.tokenizer.validation import validate_request

REPLY = "Hello world.\nThe end."
CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>",
                                 bos_token="<|im_start|>", unk_token="<|endoftext|>")
    hf.chat_template = CHATML
    return hf


@dataclass
class _Sample:
    rid: str
    aborted: bool = False


@dataclass
class _Delta:
    text: str = ""
    ids: list[int] = field(default_factory=list)
    lps: list[Any] = field(default_factory=list)
    tops: list[Any] = field(default_factory=list)

    def extend(self, other: _Delta) -> None:
        self.text += other.text
        self.ids.extend(other.ids)
        self.lps.extend(other.lps)
        self.tops.extend(other.tops)


class FakeTokenizerManager:
    def __init__(self, tokenizer: Any, context_length: int = 256, delay: float = 0.0,
                 grammar_backend: str = "xgrammar",
                 mm_processor: BaseMultimodalProcessor | None = None, reply: str = REPLY) -> None:
        self.tokenizer = tokenizer
        self.reply = reply  # what every sample "generates" (cycled)
        self.tokenizer_workers = AsyncTokenizer(tokenizer)
        self.mm_processor = mm_processor or TextOnlyProcessor("fake-model")
        self.prepared: list[tuple[list[int], Any]] = []  # (input_ids, mm_inputs) per prompt
        self.grammar_backend = grammar_backend
        self.received: list[GenerateReqInput] = []
        self.model_dir = "/fake/model"
        self.model_path = self.model_dir
        self.model_info = {"context_length": context_length, "vocab_size": len(tokenizer),
                           "max_total_num_tokens": 4096, "eos_token_ids": [258],
                           "architectures": ["FakeForCausalLM"]}
        self.delay = delay
        self.states: dict[str, _Sample] = {}
        self.dead_reason: str | None = None
        self.last_receive_time = time.monotonic()
        self.on_sample_finished: Any = None
        self.cached: set[tuple[int, ...]] = set()
        self.num_generated = 0
        self.closed = False

    async def generate(self, obj: GenerateReqInput) -> AsyncIterator[GenerateOutput]:
        if self.dead_reason:
            raise EngineDeadError(self.dead_reason)
        self.received.append(obj)
        singles = obj.normalize()
        prepared = []
        vocab, context = self.model_info["vocab_size"], self.model_info["context_length"]
        for s in singles:
            ids = (s.input_ids if s.input_ids is not None
                   else await self.tokenizer_workers.encode(s.text, max_tokens=context))
            ids, mm = await self.mm_processor.process(ids, s.image_data or [],
                                                      s.video_data or [], vocab, context)
            self.prepared.append((ids, mm))
            prepared.append((s, ids, validate_request(s, ids, vocab, context,
                                                      self.grammar_backend, mm)))
        queue: asyncio.Queue = asyncio.Queue()
        tasks, rids = [], []
        base = 0
        for single, ids, params in prepared:
            for i in range(params.n):
                rid = sample_rid(single.rid, i, params.n)
                self.states[rid] = _Sample(rid)
                rids.append(rid)
                tasks.append(asyncio.create_task(
                    self._run(rid, base + i, single, ids, params, queue)))
            base += params.n
        try:
            remaining = len(tasks)
            while remaining:
                out = await queue.get()
                if isinstance(out, Exception):
                    raise out
                remaining -= out.finished
                yield out
        finally:
            for t in tasks:
                t.cancel()
            for rid in rids:
                self.states.pop(rid, None)

    async def _run(self, rid: str, index: int, single: Any, ids: list[int], params: Any,
                   queue: asyncio.Queue) -> None:
        """One sample: a GenerateOutput per token for a stream, else one at the end."""
        created = time.monotonic()
        cached = len(ids) - 1 if tuple(ids) in self.cached else 0
        self.cached.add(tuple(ids))
        reply_ids = self.tokenizer.encode(self.reply)
        out_ids: list[int] = []
        text = ""
        input_lps: tuple[list[Any], list[Any]] | None = None
        if single.return_logprob and single.logprob_start_len >= 0:
            start = single.logprob_start_len
            input_lps = (
                [None if p == 0 else [-1.0, t, self.tokenizer.decode([t])]
                 for p, t in enumerate(ids[start:], start)],
                [None if p == 0 else self._tops(t, single.top_logprobs_num)
                 for p, t in enumerate(ids[start:], start)])
        first_token_time = None
        finish: FinishReason | None = None
        acc = _Delta()  # what a non-streaming sample produced, sent at its end
        while finish is None:
            sample = self.states.get(rid)
            delta = _Delta()
            if sample is None or sample.aborted:
                finish = FinishReason("abort", message="Aborted by request")
            elif len(out_ids) >= params.max_new_tokens:
                finish = FinishReason("length")
            else:
                if self.delay:
                    await asyncio.sleep(self.delay)
                tok = reply_ids[len(out_ids) % len(reply_ids)]
                out_ids.append(tok)
                self.num_generated += 1
                first_token_time = first_token_time or time.monotonic()
                piece = self.tokenizer.decode([tok])
                delta.ids.append(tok)
                delta.text = piece
                if single.return_logprob:
                    delta.lps.append([-0.5, tok, piece])
                    delta.tops.append(self._tops(tok, single.top_logprobs_num))
                matched = next((s for s in params.stop if (text + piece).endswith(s)), None)
                if matched is not None:
                    finish = FinishReason("stop", matched=matched)
                    delta.text = (piece[: len(piece) - len(matched)]
                                  if len(matched) <= len(piece) else "")
            text += delta.text
            self.last_receive_time = time.monotonic()
            if not single.stream:
                acc.extend(delta)
                if finish is None:
                    continue
                delta = acc
            out = GenerateOutput(
                index=index, rid=rid, text=delta.text, token_ids=delta.ids,
                prompt_tokens=len(ids), completion_tokens=len(out_ids), cached_tokens=cached,
                forward_steps=len(out_ids), jump_forward_tokens=0, finish_reason=finish,
                created=created, first_token_time=first_token_time,
                e2e_latency=time.monotonic() - created)
            if single.return_logprob:
                out.output_token_logprobs, out.output_top_logprobs = delta.lps, delta.tops
                if input_lps is not None:
                    out.input_token_logprobs, out.input_top_logprobs = input_lps
                    input_lps = None  # sent once
            if finish is not None and self.on_sample_finished is not None:
                self.on_sample_finished(out)
            await queue.put(out)
            await asyncio.sleep(0)

    def _tops(self, tok: int, num: int) -> list[list[Any]]:
        ids = [tok] + [t for t in (65, 66, 67, 68, 69) if t != tok]
        return [[-0.5 - i, t, self.tokenizer.decode([t])] for i, t in enumerate(ids[:num])]

    def abort_request(self, rid: str | None = None, abort_all: bool = False,
                      message: str = "Aborted by request") -> None:
        for key, sample in self.states.items():
            if abort_all or key == rid:
                sample.aborted = True

    async def get_server_info(self) -> dict[str, Any]:
        return {"num_free_tokens": 4096, "num_used_tokens": 0, "max_total_num_tokens": 4096,
                "num_running_reqs": len(self.states), "num_waiting_reqs": 0,
                "kv_integrity": "ok", "num_prompt_tokens_total": 10,
                "num_cached_prompt_tokens_total": 4,
                "num_generation_tokens_total": self.num_generated}

    async def flush_cache(self) -> FlushCacheOut:
        if self.states:
            return FlushCacheOut(False, "Requests are running")
        self.cached.clear()
        return FlushCacheOut(True)

    def stalled_seconds(self) -> float:
        return time.monotonic() - self.last_receive_time if self.states else 0.0

    def close(self) -> None:
        self.closed = True
        self.mm_processor.close()
        self.tokenizer_workers.close()


class FakeRuntime:
    def __init__(self, tm: FakeTokenizerManager) -> None:
        self.tokenizer_manager = tm
        self.stopped = False

    async def shutdown(self) -> None:
        self.tokenizer_manager.close()
        self.stopped = True


def fake_starter(tm: FakeTokenizerManager, ready: asyncio.Event | None = None) -> Any:
    async def start(_: ServerArgs) -> FakeRuntime:
        if ready is not None:
            await ready.wait()
        return FakeRuntime(tm)

    return start


def new_rid() -> str:
    return uuid.uuid4().hex


def serve_fake(tokenizer: Any, reply: str = REPLY, context_length: int = 4096,
               **args: Any) -> Iterator[tuple[Any, FakeTokenizerManager]]:
    """A TestClient over the real app on a fake runtime that "generates" `reply`, once
    healthy (a generator: `yield from` it in a fixture); `args` are ServerArgs fields."""
    from starlette.testclient import TestClient

    from radixlm.entrypoints.http.server import create_app

    tm = FakeTokenizerManager(tokenizer, context_length=context_length, reply=reply)
    app = create_app(ServerArgs(served_model_name="fake", **args), fake_starter(tm))
    with TestClient(app, raise_server_exceptions=False, base_url="http://localhost") as c:
        for _ in range(1000):
            if c.get("/health").status_code == 200:
                break
        yield c, tm
