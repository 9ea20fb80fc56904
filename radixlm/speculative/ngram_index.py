"""Prompt lookup: where the sequence's last n tokens occurred before, and what followed.

An `NgramIndex` maps every n-gram of a request's token list (for n in
[min_n, max_n]) to the position right after its latest occurrence whose next
token exists. `update` indexes only the tokens appended since the previous
call (O(new tokens x window sizes)); `draft` looks up the longest suffix
n-gram first and proposes the tokens that followed it. Nothing scans the
whole sequence per step.

A rewrite of the tail (jump-forward replacing tokens) rewinds the indexed
length with `rewind`; entries that point past the end are ignored at lookup.
Drafts are only guesses: the target model verifies every one, so a stale entry
costs speed, never correctness.
"""

from __future__ import annotations


class NgramIndex:
    def __init__(self, min_n: int, max_n: int) -> None:
        assert 1 <= min_n <= max_n
        self.min_n = min_n
        self.max_n = max_n
        # tables[n - min_n]: n-gram -> position of the token that followed its latest occurrence
        self.tables: list[dict[tuple[int, ...], int]] = [{} for _ in range(max_n - min_n + 1)]
        self.num_indexed = 0  # tokens[:num_indexed] are indexed

    def rewind(self, num_tokens: int) -> None:
        """Tokens from `num_tokens` on changed: index them again at the next update."""
        self.num_indexed = min(self.num_indexed, num_tokens)

    def update(self, token_ids: list[int]) -> None:
        """Index the n-grams that end before each token appended since the last call."""
        start = max(min(self.num_indexed, len(token_ids)), 1)
        for pos in range(start, len(token_ids)):
            # The n-grams ending just before `pos` are followed by token_ids[pos].
            for n in range(self.min_n, min(self.max_n, pos) + 1):
                self.tables[n - self.min_n][tuple(token_ids[pos - n : pos])] = pos
        self.num_indexed = len(token_ids)

    def draft(self, token_ids: list[int], max_len: int) -> list[int]:
        """Up to `max_len` tokens that followed the longest earlier match of the sequence's
        suffix (call `update` first); [] when no suffix of at least min_n tokens recurs.

        A match near the end has a short continuation (in a repeating run, the latest
        occurrence is one period back): the draft is then looked up again from its own
        end, as if it were already accepted.
        """
        draft: list[int] = []
        for _ in range(max_len):  # each round adds at least one token
            pos = self._lookup(token_ids, draft)
            if pos is None:
                break
            draft.extend(token_ids[pos : pos + max_len - len(draft)])
            if len(draft) >= max_len:
                break
        return draft

    def _lookup(self, token_ids: list[int], draft: list[int]) -> int | None:
        """Where the longest suffix of token_ids + draft was last followed by a token."""
        num_tokens = len(token_ids) + len(draft)
        for n in range(min(self.max_n, num_tokens), self.min_n - 1, -1):
            if n <= len(draft):
                key = tuple(draft[len(draft) - n :])
            else:
                key = tuple(token_ids[len(token_ids) - (n - len(draft)) :]) + tuple(draft)
            pos = self.tables[n - self.min_n].get(key)
            if pos is not None and pos < len(token_ids):
                return pos
        return None
