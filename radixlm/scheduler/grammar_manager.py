"""The scheduler's side of constrained decoding: requests whose grammar is not ready yet.

A constrained request does not enter the waiting queue until its grammar
object exists. `add` parks it here and starts (or joins) the compilation;
`poll`, called once per scheduler step, hands back the requests whose grammar
is ready and the ones whose grammar failed. Nothing here ever blocks the loop.

The grammar backend itself (tokenizer information for the whole vocabulary,
built from the full Hugging Face tokenizer; xgrammar's import alone takes
seconds) is built in a background thread that `start` launches once the
scheduler is ready, so the server serves unconstrained requests before
grammars are ready, and its start-up does not wait for them.

With --reasoning-parser, a request whose `reasoning_phase` is "start" or
"inside" gets its grammar wrapped in a ReasonerGrammar: free inside the think
block, enforced after it (constrained/reasoner_grammar.py). A request with a
thinking budget and no grammar of its own waits here too (for the token texts
built with the backend) and gets the gate around a FreeGrammar.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, NamedTuple

from radixlm.messages.forward_step import VocabMask
from radixlm.scheduler.request import Req
from radixlm.scheduler.step_plan import ScheduledReq
from radixlm.server_args import ServerArgs

if TYPE_CHECKING:
    from radixlm.constrained.base_grammar_backend import (
        BaseGrammarBackend,
        BaseGrammarObject,
        GrammarError,
    )
    from radixlm.constrained.grammar_cache import GrammarCache
    from radixlm.constrained.reasoner_grammar import TokenTexts

logger = logging.getLogger(__name__)


class GrammarPoll(NamedTuple):
    ready: list[Req]  # req.grammar is set
    failed: list[tuple[Req, str]]  # the message for the user (HTTP 400)


class GrammarManager:
    def __init__(
        self,
        server_args: ServerArgs,
        tokenizer_path: str,
        vocab_size: int,
        eos_token_ids: set[int],
    ) -> None:
        """server_args.grammar_backend names the backend (not "none")."""
        self.args = server_args
        self.tokenizer_path = tokenizer_path
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids)
        self.queue: list[Req] = []
        self.cache: GrammarCache | None = None
        self.build_started = 0.0
        self._builder: ThreadPoolExecutor | None = None
        self._cache_future: Future[GrammarCache] | None = None
        self.token_texts: TokenTexts | None = None  # with a reasoning parser
        self.think_tags: tuple[str, str] | None = None
        if server_args.reasoning_parser:
            from radixlm.reasoning import get_reasoning_parser

            reasoner = get_reasoning_parser(server_args.reasoning_parser)
            self.think_tags = (reasoner.start_tag, reasoner.end_tag)

    def start(self) -> None:
        """Build the backend in the background (also done by the first `add`)."""
        if self._cache_future is None:
            self.build_started = time.monotonic()
            self._builder = ThreadPoolExecutor(1, thread_name_prefix="grammar-backend")
            self._cache_future = self._builder.submit(self._build_cache)

    def _build_cache(self) -> GrammarCache:
        from radixlm.constrained.grammar_cache import GrammarCache
        from radixlm.constrained.registry import create_grammar_backend
        from radixlm.tokenizer_utils import load_tokenizer

        start = time.monotonic()
        tokenizer = load_tokenizer(self.tokenizer_path)
        if self.think_tags is not None:
            from radixlm.constrained.reasoner_grammar import TokenTexts

            self.token_texts = TokenTexts.from_tokenizer(tokenizer, self.vocab_size)
        backend: BaseGrammarBackend = create_grammar_backend(
            self.args.grammar_backend,
            tokenizer,
            self.vocab_size,
            self.eos_token_ids,
            json_whitespace_pattern=self.args.constrained_json_whitespace_pattern,
            json_disable_any_whitespace=self.args.constrained_json_disable_any_whitespace,
            json_bounded_numbers=not self.args.constrained_json_unbounded_numbers,
        )
        logger.info("Grammar backend %s ready in %.1f s", backend.name, time.monotonic() - start)
        return GrammarCache(backend, num_threads=2,
                            compile_timeout_s=self.args.grammar_compile_timeout)

    @property
    def has_pending(self) -> bool:
        return bool(self.queue)

    def add(self, req: Req) -> None:
        """Park a constrained request until its grammar is compiled."""
        self.queue.append(req)
        self.start()
        cache = self._ready_cache()
        if cache is not None and req.grammar_key is not None:
            cache.get_or_submit(*req.grammar_key)

    def poll(self) -> GrammarPoll:
        """Requests whose grammar is ready or failed since the last poll; never blocks."""
        ready: list[Req] = []
        failed: list[tuple[Req, str]] = []
        if not self.queue:
            return GrammarPoll(ready, failed)
        cache = self._ready_cache()
        if cache is None:
            error = self._build_error()
            if error is not None:
                failed = [(req, error) for req in self.queue]
                self.queue = []
            return GrammarPoll(ready, failed)
        still: list[Req] = []
        for req in self.queue:
            if req.grammar_key is None:  # a thinking budget alone
                from radixlm.constrained.reasoner_grammar import FreeGrammar

                req.grammar = self._gated(req, FreeGrammar())
                ready.append(req)
                continue
            result = cache.poll(req.grammar_key)
            if not result.ready:
                still.append(req)
            elif result.error is not None:
                failed.append((req, str(result.error)))
            else:
                req.grammar = self._gated(req, result.grammar)
                ready.append(req)
        self.queue = still
        return GrammarPoll(ready, failed)

    def _gated(self, req: Req, grammar: BaseGrammarObject | None) -> BaseGrammarObject | None:
        """The grammar, gated by the think block when the request reasons first."""
        phase = req.sampling_params.reasoning_phase
        if grammar is None or phase not in ("start", "inside") or self.think_tags is None:
            return grammar
        from radixlm.constrained.reasoner_grammar import ReasonerGrammar

        assert self.token_texts is not None  # built with the backend
        return ReasonerGrammar(grammar, self.token_texts, *self.think_tags, phase=phase,
                               budget=req.sampling_params.thinking_token_budget)

    def _ready_cache(self) -> GrammarCache | None:
        if self.cache is None and self._cache_future is not None and self._cache_future.done():
            if self._cache_future.exception() is None:
                self.cache = self._cache_future.result()
                for req in self.queue:  # start the compilations that waited for the backend
                    if req.grammar_key is not None:
                        self.cache.get_or_submit(*req.grammar_key)
        return self.cache

    def _build_error(self) -> str | None:
        """Why grammars cannot be served (backend failed or took too long), or None."""
        assert self._cache_future is not None
        if self._cache_future.done():
            error: BaseException | GrammarError | None = self._cache_future.exception()
            return f"The {self.args.grammar_backend} grammar backend failed to start: {error}"
        waited = time.monotonic() - self.build_started
        if waited > self.args.grammar_compile_timeout + 60:
            return f"The {self.args.grammar_backend} grammar backend is not ready after {waited:.0f} s"
        return None

    def shutdown(self) -> None:
        if self.cache is not None:
            self.cache.shutdown()
        if self._builder is not None:
            self._builder.shutdown(wait=False, cancel_futures=True)


def build_vocab_mask(items: list[ScheduledReq], vocab_size: int) -> VocabMask | None:
    """The step's grammar masks: one bitmask over its sampled rows, each constrained
    request's grammar filling its row; None when no sampled row is constrained."""
    constrained = [item.req.grammar is not None and item.num_sample_rows > 0 for item in items]
    if not any(constrained):
        return None
    from radixlm.constrained.base_grammar_backend import allocate_vocab_mask

    num_rows = sum(item.num_sample_rows for item in items)
    bitmask = allocate_vocab_mask(num_rows, vocab_size)  # [S, ceil(V/32)] int32, all allowed
    rows: list[int] = []
    row = 0
    for item, has_grammar in zip(items, constrained):
        if has_grammar:
            grammar = item.req.grammar
            assert grammar is not None
            # A drafted row is masked by the grammar as it would be after the draft up
            # to it (the drafter checked that the grammar accepts the draft).
            for i, token_id in enumerate([*item.draft_ids, None]):
                grammar.fill_vocab_mask(bitmask, row + i)
                rows.append(row + i)
                if token_id is not None:
                    grammar.accept_token(token_id)
            if item.draft_ids:
                grammar.rollback(len(item.draft_ids))
        row += item.num_sample_rows
    return VocabMask(bitmask, rows)
