"""KVDiskTier: the disk tier under the radix tree (`--kv-cache-dir`).

The radix tree keeps prefixes in the KV pool only; this tier keeps them in
files too, so a prefix evicted from the pool, or lost in a restart, is read
back instead of computed again, as SGLang's HiCache storage tier does.

Blocks. The tier stores fixed blocks of `block_size` tokens aligned to the
start of the sequence, keyed by a hash chain over the tokens (disk_key.py);
only full blocks are stored, so up to block_size - 1 tokens at the end of a
prefix are always recomputed. A block holds every per-slot buffer of the
pool (`TokenToKVPool.slot_buffers()`), the pool's own bytes, whatever the
KV dtype.

Writing (`offer`) copies a block's rows out of the pool on the caller's
thread (so the slots can be reused at once) and hands them to the store's
writer thread (disk_store.py). Two callers: the radix cache, for a leaf it
evicts (`on_evict`, as an `EvictionSink`), and, with the write-through
policy, the scheduler for every prefix it hands to the cache, so that a
restart finds what was still in the pool. Blocks already stored are only
marked as used.

Reading. `lookup` says which stored blocks continue a request's pool hit;
`load` reads them on the loader thread into tensors of the request's own
(the pool is not touched off the scheduler's thread); `write_to_pool` then
copies them into slots the scheduler allocated, and the scheduler inserts
them into the tree as an ordinary node (scheduler/kv_manager.py). A block
that fails its checks ends the chain there: what came before it is used,
nothing after it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple

import torch

from radixlm.mem_cache.disk_block_file import BlockMeta
from radixlm.mem_cache.disk_key import BlockHasher, PseudoTokenHashes, pool_layout
from radixlm.mem_cache.disk_store import DiskStore, PendingBlock
from radixlm.mem_cache.memory_pool import TokenToKVPool

logger = logging.getLogger(__name__)


class DiskHit(NamedTuple):
    """Stored blocks that continue a prefix: tokens [start, start + len(tokens))."""

    start: int  # block-aligned position of the first block
    keys: list[bytes]  # the blocks' keys, in order
    tokens: list[int]  # their tokens

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


class DiskLoad:
    """A load on the loader thread: `rows` (per buffer [len(hit.tokens), *row_shape]) are
    valid for the first `num_tokens()` tokens once `done()`."""

    def __init__(self, hit: DiskHit) -> None:
        self.hit = hit
        self.rows: list[torch.Tensor] = []
        self.future: Future[int] = Future()
        self.started = time.perf_counter()
        self.seconds = 0.0  # how long the read took, once done

    def done(self) -> bool:
        return self.future.done()

    def num_tokens(self) -> int:
        """Tokens read intact from hit.start on (0 when the load failed). Call when done."""
        try:
            return self.future.result(timeout=0)
        except Exception:  # noqa: BLE001 - a failed read is a miss, already logged
            return 0



class KVDiskTier:
    """Blocks of the pool's KV on disk (see the module docstring)."""

    def __init__(self, pool: TokenToKVPool, store: DiskStore, namespace: bytes,
                 block_size: int, vocab_size: int) -> None:
        self.pool = pool
        self.store = store
        self.block_size = block_size
        self.layout = pool_layout(pool.slot_buffers())
        self.bytes_per_token = sum(s.row_bytes for s in self.layout)
        self.pseudo = PseudoTokenHashes()
        self.hasher = BlockHasher(namespace, block_size, vocab_size, self.pseudo)
        self._loader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="radixlm-kv-disk-load")
        # Blocks of one load are read (and checksummed: hashlib and file reads release
        # the GIL) by a few threads at once: the cores are idle while a request waits.
        self._readers = ThreadPoolExecutor(max_workers=min(os.cpu_count() or 1, 4),
                                           thread_name_prefix="radixlm-kv-disk-read")
        self.num_offered_blocks = 0  # blocks copied out of the pool for writing

    @property
    def namespace(self) -> bytes:
        return self.hasher.namespace

    def set_namespace(self, namespace: bytes) -> None:
        """Key later blocks under another model identity (new weights)."""
        self.hasher = BlockHasher(namespace, self.block_size, self.hasher.vocab_size,
                                  self.pseudo)

    # ------------------------------------------------------------------ writing

    def on_evict(self, key: list[int], kv_indices: torch.Tensor, start: int) -> None:
        """EvictionSink: a leaf holding positions [start, len(key)) of `key` leaves the pool."""
        self.offer(key, kv_indices, start)

    def offer(self, tokens: Sequence[int], kv_indices: torch.Tensor, start: int) -> int:
        """Store the full blocks of `tokens` that end after position `start` (kv_indices[i]:
        the slot of tokens[i]); returns the end of the last full block. Copies the rows
        now, writes them on the writer thread."""
        bs = self.block_size
        num_blocks = len(tokens) // bs
        first = start // bs
        if first >= num_blocks:
            return num_blocks * bs
        keys = self.hasher.keys(tokens, num_blocks)
        todo = [j for j in range(first, len(keys)) if not self.store.contains(keys[j])]
        self.store.touch(keys[first:])
        if todo:
            self._copy_out(tokens, kv_indices, keys, todo)
        return num_blocks * bs

    def _copy_out(self, tokens: Sequence[int], kv_indices: torch.Tensor, keys: list[bytes],
                  todo: list[int]) -> None:
        bs = self.block_size
        slots = torch.cat([kv_indices[j * bs : (j + 1) * bs] for j in todo])
        slots = slots.to(device=self.pool.device, dtype=torch.int64)
        # [len(todo) * bs, *row_shape] per buffer: copies, so the slots may be reused now
        gathered = [buf.index_select(0, slots).cpu() for _, buf in self.pool.slot_buffers()]
        num_bytes = bs * self.bytes_per_token
        # The last block first: the store's LRU then drops a chain's tail before its head.
        for i in reversed(range(len(todo))):
            j = todo[i]
            meta = BlockMeta(self.namespace, keys[j], tokens[j * bs : (j + 1) * bs], self.layout)
            rows = [g[i * bs : (i + 1) * bs] for g in gathered]
            if self.store.put(PendingBlock(meta, rows, num_bytes)):
                self.num_offered_blocks += 1

    # ------------------------------------------------------------------ reading

    def lookup(self, tokens: Sequence[int], start: int, keys: list[bytes] | None = None
               ) -> DiskHit | None:
        """The stored blocks that continue a prefix of `tokens` whose first `start` tokens
        the pool holds: blocks start // block_size, ... while stored (None: not the first).
        keys: `hasher.keys(tokens)`, when the caller has them."""
        bs = self.block_size
        num_blocks = len(tokens) // bs
        first = start // bs
        if first >= num_blocks:
            return None
        if keys is None:
            keys = self.hasher.keys(tokens, num_blocks)
        last = first
        while last < len(keys) and self.store.contains(keys[last]):
            last += 1
        if last == first:
            return None
        return DiskHit(first * bs, keys[first:last], list(tokens[first * bs : last * bs]))

    def load(self, hit: DiskHit) -> DiskLoad:
        """Start reading `hit` on the loader thread."""
        load = DiskLoad(hit)
        namespace = self.namespace

        def run() -> None:
            if load.future.set_running_or_notify_cancel():
                try:
                    load.future.set_result(self._read(load, namespace))
                except Exception as e:  # noqa: BLE001 - reported to the scheduler as a miss
                    logger.warning("KV disk tier: a load failed: %s", e)
                    load.future.set_exception(e)

        self._loader.submit(run)
        return load

    def _read(self, load: DiskLoad, namespace: bytes) -> int:
        hit, bs = load.hit, self.block_size
        n = len(hit.tokens)
        load.rows = [torch.empty((n, *s.row_shape), dtype=getattr(torch, s.dtype))
                     for s in self.layout]

        def read_one(i: int) -> bool:
            meta = BlockMeta(namespace, hit.keys[i], hit.tokens[i * bs : (i + 1) * bs],
                             self.layout)
            return self.store.read(meta, [r[i * bs : (i + 1) * bs] for r in load.rows])

        # The chain ends at the first block that is missing or fails its checks.
        num_read = 0
        for ok in self._readers.map(read_one, range(len(hit.keys))):
            if not ok:
                break
            num_read += 1
        self.store.touch(hit.keys[:num_read])
        load.seconds = time.perf_counter() - load.started
        return num_read * bs

    def write_to_pool(self, load: DiskLoad, offset: int, slots: torch.Tensor) -> None:
        """Copy the loaded rows [offset, offset + len(slots)) into the pool at `slots`."""
        end = offset + slots.numel()
        assert end <= load.num_tokens(), "writing rows the load did not read"
        for (_, buf), rows in zip(self.pool.slot_buffers(), load.rows, strict=True):
            buf.index_copy_(0, slots, rows[offset:end].to(buf.device))

    # ------------------------------------------------------------------ admin

    def flush(self) -> None:
        """Delete every stored block of this model (/flush_cache)."""
        num = self.store.flush(self.namespace)
        logger.info("KV disk tier: flushed %d blocks", num)

    def close(self, timeout: float = 3.0) -> None:
        """Finish queued writes (up to `timeout` s) and stop the threads."""
        self._loader.shutdown(wait=False, cancel_futures=True)
        self._readers.shutdown(wait=False, cancel_futures=True)
        self.store.close(timeout)

    def check_integrity(self) -> None:
        self.store.check_integrity()

    def stats(self) -> dict[str, Any]:
        out = self.store.stats()
        out.update(kv_disk_block_size=self.block_size,
                   kv_disk_offered_blocks_total=self.num_offered_blocks)
        return out
