"""DiskStore: a folder of KV block files with an LRU index, a byte bound and a writer thread.

Files live at `root/<namespace>/<key[:2]>/<key>.kvb` (hex; see disk_key.py for
the keys and disk_block_file.py for the format). The index (key → path,
size) is the store's truth about what it holds; it is rebuilt at start-up by
scanning the folder, in the order of the files' modification times, so a
restart keeps the LRU order. Leftover temporary files of a writer that died
are removed then.

Writing is off the caller's thread: `put` records the block as pending (the
rows are copies, never views of the KV pool) and queues it; one writer thread
writes it (checksum, temporary file, rename), adds it to the index, and
deletes least recently used files until the store fits in `max_bytes`. The
queue is bounded in bytes (`max_pending_bytes`): a `put` beyond it is dropped
and counted, so a slow disk never holds up the scheduler. A pending block is
readable at once, from memory.

Reading (`read`, from the loader thread) fills the caller's tensors and
verifies the file on the way (disk_block_file.read_block); a damaged or
partial file is logged as a warning, deleted and forgotten, never served.

Invariants (`check_integrity`): the index's sizes sum to `num_bytes` <=
`max_bytes`; the pending blocks' sizes sum to `num_pending_bytes`; the
files the index names exist with their recorded sizes (checked for the most
recently used ones). One store per folder: two live processes sharing a
folder each keep their own index (files stay content-addressed and are
checked on every read, so sharing is safe, but the byte bound is per process).
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, NamedTuple

import torch

from radixlm.mem_cache.disk_block_file import (
    SUFFIX,
    TMP_SUFFIX,
    BlockFileError,
    BlockMeta,
    read_block,
    write_block,
)

logger = logging.getLogger(__name__)

_STALE_TMP_SECONDS = 60.0  # a temporary file this old belongs to a writer that died
_NUM_CHECKED_FILES = 256  # files check_integrity stats (the most recently used)


class PendingBlock(NamedTuple):
    meta: BlockMeta
    rows: list[torch.Tensor]  # per buffer [num_tokens, *row_shape], contiguous CPU copies
    num_bytes: int  # payload bytes


class _Entry(NamedTuple):
    path: str
    size: int


class DiskStore:
    """Block files under `root`, at most `max_bytes` of them (see the module docstring)."""

    def __init__(self, root: str, max_bytes: int, max_pending_bytes: int | None = None) -> None:
        if max_bytes < 1:
            raise ValueError(f"the disk tier needs a positive byte bound, got {max_bytes}")
        self.root = os.path.abspath(root)
        self.max_bytes = max_bytes
        self.max_pending_bytes = max_pending_bytes or min(max_bytes, 1 << 30)
        os.makedirs(self.root, mode=0o700, exist_ok=True)  # KV is served from here
        self._lock = threading.Lock()
        self._index: OrderedDict[bytes, _Entry] = OrderedDict()  # least recently used first
        self._num_bytes = 0
        self._pending: dict[bytes, PendingBlock] = {}
        self._num_pending_bytes = 0
        self._generation = 0  # a flush bumps it; the writer drops blocks of older ones
        self._queue: queue.Queue[tuple[int, PendingBlock] | None] = queue.Queue()
        self._dirs: set[str] = set()
        self.counters = {"written_blocks": 0, "written_bytes": 0, "read_blocks": 0,
                         "read_bytes": 0, "dropped_blocks": 0, "damaged_blocks": 0,
                         "evicted_blocks": 0, "write_errors": 0}
        self._scan()
        self._writer = threading.Thread(target=self._write_loop, daemon=True,
                                        name="radixlm-kv-disk-writer")
        self._writer.start()

    # ------------------------------------------------------------------ paths and start-up

    def path(self, namespace: bytes, key: bytes) -> str:
        hexkey = key.hex()
        return os.path.join(self.root, namespace.hex()[:32], hexkey[:2], hexkey + SUFFIX)

    def _scan(self) -> None:
        """Index the files already in the folder (oldest first), drop dead writers' temps."""
        found: list[tuple[int, bytes, _Entry]] = []
        now = time.time()
        for folder, _, files in os.walk(self.root):
            for name in files:
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path)
                    if name.endswith(TMP_SUFFIX):
                        if now - st.st_mtime > _STALE_TMP_SECONDS:
                            os.unlink(path)
                        continue
                    key = bytes.fromhex(name[: -len(SUFFIX)]) if name.endswith(SUFFIX) else None
                except (OSError, ValueError):
                    continue
                if key:
                    found.append((st.st_mtime_ns, key, _Entry(path, st.st_size)))
        found.sort(key=lambda f: f[0])
        for _, key, entry in found:
            self._index[key] = entry
            self._num_bytes += entry.size
        _unlink_all(self._evict_to_fit_locked())
        if found:
            logger.info("KV disk tier %s: %d blocks, %.1f MiB", self.root, len(self._index),
                        self._num_bytes / (1 << 20))

    # ------------------------------------------------------------------ queries

    def contains(self, key: bytes) -> bool:
        """Whether the store holds (or is writing) the block `key`."""
        with self._lock:
            return key in self._index or key in self._pending

    def touch(self, keys: Sequence[bytes]) -> None:
        """Mark blocks as just used. Give a chain's keys in order: the first block ends up
        the most recently used, so the LRU drops a chain's tail before its head (a block
        is only usable after every block before it)."""
        with self._lock:
            for key in reversed(keys):
                if key in self._index:
                    self._index.move_to_end(key)

    # ------------------------------------------------------------------ writing

    def put(self, block: PendingBlock) -> bool:
        """Queue a block for writing (False: dropped, the pending bytes are at their bound;
        True also when the store already holds it, which then counts as a use)."""
        key = block.meta.key
        with self._lock:
            if key in self._index:
                self._index.move_to_end(key)
                return True
            if key in self._pending:
                return True
            if (self._num_pending_bytes + block.num_bytes > self.max_pending_bytes
                    or block.meta.file_bytes > self.max_bytes):
                self.counters["dropped_blocks"] += 1
                return False
            self._pending[key] = block
            self._num_pending_bytes += block.num_bytes
            generation = self._generation
        self._queue.put((generation, block))
        return True

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            generation, block = item
            path = self.path(block.meta.namespace, block.meta.key)
            size = None
            if generation == self._generation:
                size = self._write(path, block, generation)
            with self._lock:
                if self._pending.get(block.meta.key) is block:
                    del self._pending[block.meta.key]
                    self._num_pending_bytes -= block.num_bytes
                victims: list[str] = []
                if size is not None:
                    if generation != self._generation:
                        victims.append(path)  # flushed while it was being written
                    else:
                        victims = self._add_locked(block.meta.key, _Entry(path, size))
            _unlink_all(victims)

    def _write(self, path: str, block: PendingBlock, generation: int) -> int | None:
        folder = os.path.dirname(path)
        try:
            if folder not in self._dirs:
                os.makedirs(folder, mode=0o700, exist_ok=True)
                self._dirs.add(folder)
            size = write_block(path, block.meta, block.rows)
        except OSError as e:
            self._dirs.discard(folder)
            if generation == self._generation:  # else a flush removed its folder meanwhile
                self.counters["write_errors"] += 1
                logger.warning("KV disk tier: could not write %s: %s", path, e)
            return None
        self.counters["written_blocks"] += 1
        self.counters["written_bytes"] += size
        return size

    def _add_locked(self, key: bytes, entry: _Entry) -> list[str]:
        old = self._index.pop(key, None)
        if old is not None:
            self._num_bytes -= old.size
        self._index[key] = entry
        self._num_bytes += entry.size
        return self._evict_to_fit_locked()

    def _evict_to_fit_locked(self) -> list[str]:
        """Forget least recently used blocks until the store fits; their paths to delete."""
        victims: list[str] = []
        while self._index and self._num_bytes > self.max_bytes:
            _, entry = self._index.popitem(last=False)
            self._num_bytes -= entry.size
            victims.append(entry.path)
            self.counters["evicted_blocks"] += 1
        return victims

    # ------------------------------------------------------------------ reading

    def read(self, meta: BlockMeta, dest: Sequence[torch.Tensor]) -> bool:
        """Fill dest (per buffer [num_tokens, *row_shape], contiguous) with block `meta`.

        False when the store does not hold it, or holds a file that fails its checks
        (logged as a warning, deleted and forgotten). Thread-safe."""
        with self._lock:
            pending = self._pending.get(meta.key)
            entry = self._index.get(meta.key)
        if pending is not None:
            for d, src in zip(dest, pending.rows, strict=True):
                d.copy_(src)
            return True
        if entry is None:
            return False
        try:
            size = read_block(entry.path, meta, dest)
        except FileNotFoundError:
            self._forget(meta.key, entry)
            return False
        except (BlockFileError, OSError) as e:
            logger.warning("KV disk tier: skipping damaged block file %s: %s", entry.path, e)
            self._forget(meta.key, entry, damaged=True)
            return False
        with self._lock:  # several reader threads count here
            self.counters["read_blocks"] += 1
            self.counters["read_bytes"] += size
        try:
            os.utime(entry.path)  # the LRU order survives a restart
        except OSError:
            pass
        return True

    def _forget(self, key: bytes, entry: _Entry, damaged: bool = False) -> None:
        """Drop `entry` from the index if it is still there; a damaged one's file is
        deleted too, while still indexed and under the lock (put() queues no rewrite of
        an indexed key): deleting after forgetting it could delete the file that a
        rewrite of the same key had just put at the same path."""
        with self._lock:
            self.counters["damaged_blocks"] += damaged
            if self._index.get(key) == entry:
                del self._index[key]
                self._num_bytes -= entry.size
                if damaged:
                    _unlink_all([entry.path])

    # ------------------------------------------------------------------ flush, close, checks

    def flush(self, namespace: bytes) -> int:
        """Delete every block of `namespace` (written or pending); returns how many."""
        prefix = os.path.join(self.root, namespace.hex()[:32]) + os.sep
        with self._lock:
            self._generation += 1
            num = len(self._pending)
            self._pending.clear()
            self._num_pending_bytes = 0
            victims = [k for k, e in self._index.items() if e.path.startswith(prefix)]
            for key in victims:
                self._num_bytes -= self._index.pop(key).size
            self._dirs.clear()
        shutil.rmtree(prefix, ignore_errors=True)
        return num + len(victims)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every queued block is written (True) or `timeout` seconds pass."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending:
                    return True
            time.sleep(0.005)
        return False

    def close(self, timeout: float = 3.0) -> None:
        """Finish the queued writes (up to `timeout` seconds) and stop the writer."""
        self._queue.put(None)
        self._writer.join(timeout)

    def check_integrity(self) -> None:
        """Raise AssertionError on a broken invariant (see the module docstring)."""
        with self._lock:
            items = list(self._index.items())
            entries = [e for _, e in items]
            pending = list(self._pending.values())
            num_bytes, num_pending_bytes = self._num_bytes, self._num_pending_bytes
        assert sum(e.size for e in entries) == num_bytes, "disk tier byte count is off"
        assert num_bytes <= self.max_bytes, f"disk tier holds {num_bytes} > {self.max_bytes}"
        assert sum(p.num_bytes for p in pending) == num_pending_bytes, "pending bytes off"
        assert len({e.path for e in entries}) == len(entries), "two blocks share a file"
        for key, entry in items[-_NUM_CHECKED_FILES:]:
            try:
                size = os.stat(entry.path).st_size
            except FileNotFoundError:
                with self._lock:  # evicted or dropped as damaged since the snapshot: fine
                    still_indexed = self._index.get(key) == entry
                if still_indexed:
                    raise AssertionError(f"disk tier file {entry.path} is missing") from None
                continue
            assert size == entry.size, f"disk tier file {entry.path} changed size"

    def stats(self) -> dict[str, Any]:
        with self._lock:
            out: dict[str, Any] = {
                "kv_disk_bytes": self._num_bytes, "kv_disk_max_bytes": self.max_bytes,
                "kv_disk_blocks": len(self._index), "kv_disk_pending_blocks": len(self._pending),
                "kv_disk_pending_bytes": self._num_pending_bytes,
            }
        out.update({f"kv_disk_{k}_total": v for k, v in self.counters.items()})
        return out


def _unlink_all(paths: Sequence[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except OSError:
            pass
