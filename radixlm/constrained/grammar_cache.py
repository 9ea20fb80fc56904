"""Grammar compilation off the scheduler loop, cached by (kind, text).

Rationale: compiling a JSON schema can take 10 ms to seconds, and the loop
must keep serving other requests meanwhile. `get_or_submit` returns at once
with a Future (a new compilation goes to the thread pool; a grammar already
compiling or compiled returns the same Future, so two requests share one
compilation). The loop then calls `poll` each step; it never waits. A failed
compilation stays cached as failed (its GrammarError), so a broken grammar is
not recompiled per request. Each caller gets its own matcher: `poll` returns
`compiled.copy()`, never the cached object itself.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import NamedTuple

from radixlm.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarError,
)

GrammarKey = tuple[str, str]  # (kind, text)


class PollResult(NamedTuple):
    """`ready` False: still compiling. Else exactly one of grammar / error is set."""

    ready: bool
    grammar: BaseGrammarObject | None = None
    error: GrammarError | None = None


class GrammarCache:
    def __init__(
        self,
        backend: BaseGrammarBackend,
        *,
        num_threads: int = 4,
        compile_timeout_s: float = 60.0,
        max_entries: int = 1024,
    ) -> None:
        """compile_timeout_s: a compilation still running after this long is reported as
        a GrammarError to its pollers (the worker thread itself cannot be interrupted)."""
        self.backend = backend
        self.compile_timeout_s = compile_timeout_s
        self.max_entries = max_entries
        self.executor = ThreadPoolExecutor(num_threads, thread_name_prefix="grammar-compile")
        self.futures: dict[GrammarKey, Future[BaseGrammarObject]] = {}
        self.submit_times: dict[GrammarKey, float] = {}
        self.lock = threading.Lock()  # the loop and a tokenizer thread may both submit

    def get_or_submit(self, kind: str, text: str) -> Future[BaseGrammarObject]:
        """The Future of the compiled grammar for (kind, text); never blocks."""
        key = (kind, text)
        with self.lock:
            future = self.futures.get(key)
            if future is None:
                self._evict_if_full()
                future = self.executor.submit(self.backend.compile, kind, text)
                self.futures[key] = future
                self.submit_times[key] = time.monotonic()
            return future

    def poll(self, key: GrammarKey) -> PollResult:
        """A fresh grammar object once compiled, the error if it failed or timed out, or
        ready=False while it is still compiling. Never blocks; submits if unknown."""
        future = self.get_or_submit(*key)
        if not future.done():
            if time.monotonic() - self.submit_times[key] > self.compile_timeout_s:
                return PollResult(True, error=self._timeout_error(key))
            return PollResult(False)
        error = future.exception()
        if error is not None:
            if not isinstance(error, GrammarError):
                error = GrammarError(f"Failed to compile {key[0]} grammar: {error}")
            return PollResult(True, error=error)
        return PollResult(True, grammar=future.result().copy())

    def _timeout_error(self, key: GrammarKey) -> GrammarError:
        error = GrammarError(
            f"Failed to compile {key[0]} grammar: timed out after {self.compile_timeout_s:g} s"
        )
        with self.lock:  # cache the timeout as a failure for later requests
            timed_out: Future[BaseGrammarObject] = Future()
            timed_out.set_exception(error)
            self.futures[key] = timed_out
        return error

    def _evict_if_full(self) -> None:
        """Drop the oldest finished entries (dicts keep insertion order). Holds the lock."""
        for key in list(self.futures):
            if len(self.futures) < self.max_entries:
                break
            if self.futures[key].done():
                del self.futures[key]
                self.submit_times.pop(key, None)

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
