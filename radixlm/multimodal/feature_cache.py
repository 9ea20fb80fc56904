"""A bounded LRU cache of vision features, keyed by the item's content hash.

A chunked prefill can cut an image's placeholder tokens in two: the second
chunk needs the rest of the same features. The same image in a later request
(a retry, a multi-turn chat) needs them again. Both read them from here
instead of running the vision tower again. The bound is in bytes because one
anyres image can have ten times the features of another.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import torch

DEFAULT_MAX_BYTES = 512 << 20  # about ten LLaVA-NeXT-7B images in float32


class FeatureCache:
    """Least-recently-used map key → features tensor, holding at most `max_bytes`.

    A tensor larger than the whole budget is not stored. `num_hits` and
    `num_misses` count `get` results (tests and metrics read them).
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self.num_hits = 0
        self.num_misses = 0
        self._entries: OrderedDict[Hashable, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> torch.Tensor | None:
        """The cached tensor (now the most recently used), or None."""
        features = self._entries.get(key)
        if features is None:
            self.num_misses += 1
            return None
        self._entries.move_to_end(key)
        self.num_hits += 1
        return features

    def put(self, key: Hashable, features: torch.Tensor) -> None:
        """Store features under key, evicting the least recently used entries to fit."""
        size = features.numel() * features.element_size()
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.num_bytes -= old.numel() * old.element_size()
        while self._entries and self.num_bytes + size > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.num_bytes -= evicted.numel() * evicted.element_size()
        self._entries[key] = features
        self.num_bytes += size

    def clear(self) -> None:
        self._entries.clear()
        self.num_bytes = 0
