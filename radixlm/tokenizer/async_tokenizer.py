"""Tokenizer work off the event loop: tokenizing, templating, detokenizing.

A 16 MiB prompt takes ~25 s to tokenize; on the event loop that froze every
route, `/health` included. `AsyncTokenizer` runs such work in a small thread
pool (Hugging Face's fast tokenizers release the GIL while they encode, so the
loop stays responsive), so at most `num_workers` jobs run at once and the rest
wait their turn.

A prompt whose size alone proves it longer than the context is refused before
it is tokenized: no token covers more than `max_token_bytes` bytes, so a text
of C characters (at least C bytes) has at least C / max_token_bytes tokens.
NOTE: a normalizer can shrink a text before tokenizing (NFC joins a letter and
its combining marks into one character), so the bound is halved.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from radixlm.tokenizer.validation import prompt_too_long

T = TypeVar("T")

NUM_WORKERS = 2


class AsyncTokenizer:
    def __init__(self, tokenizer: Any, num_workers: int = NUM_WORKERS) -> None:
        self.tokenizer = tokenizer
        self._pool = ThreadPoolExecutor(num_workers, thread_name_prefix="radixlm-tokenize")
        vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
        self.max_token_bytes = max((len(t.encode("utf-8")) for t in vocab), default=1) or 1

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """`fn(*args)` in a tokenizer worker (for templates and other tokenizer work)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def min_num_tokens(self, text: str) -> int:
        """A lower bound on the number of tokens of `text`, from its length alone."""
        return len(text) // (2 * self.max_token_bytes)

    def check_fits(self, text: str, max_tokens: int) -> None:
        """Raise ValueError if `text` provably has `max_tokens` tokens or more."""
        at_least = self.min_num_tokens(text)
        if at_least >= max_tokens:
            raise ValueError(prompt_too_long(at_least, max_tokens, at_least=True))

    async def encode(self, text: str, add_special_tokens: bool = True,
                     max_tokens: int | None = None) -> list[int]:
        """Token ids of `text`; with `max_tokens`, refuse (ValueError) a text its size
        proves too long before tokenizing it."""
        if max_tokens is not None:
            self.check_fits(text, max_tokens)
        ids = await self.run(self._encode, text, add_special_tokens)
        return ids

    async def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return await self.run(self._decode, ids, skip_special_tokens)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def _decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
