"""The scheduler's side of the disk tier (`--kv-cache-dir`): building it, reading a waiting
request's prefix back into the pool, and writing prefixes through.

Reading back. When a waiting request comes up for admission, its pool hit
is looked up further on the disk tier (mem_cache/disk_tier.py). If stored
blocks continue it, the request starts a load on the loader thread and
waits in the queue, without holding a slot or blocking the step; the
requests behind it go on. Once the load is done, the next admission pass
installs it: KV slots are allocated (evicting as for any allocation, with
the request's pool prefix locked meanwhile), the rows copied into them, and
the tokens inserted into the radix tree as an ordinary unlocked node. From
there on it is a plain prefix hit: the request is matched again and admitted
by the usual budget, which charges the new node through its lock cost. An
install waits (keeping the rows) until the rest of the request's prompt
fits in the pool; a request whose pool hit changed meanwhile looks up again.
Requests with the same prefix share one load, and the rows of all loads
alive are bounded (`max_load_bytes`; a request waits for room to start one).

Writing through (`--kv-cache-disk-write-policy write_through`, the default):
every prefix a request hands to the radix tree is offered to the tier as
well, so what was still in the pool at a restart is found again. With
`write_back` only leaves evicted from the pool are written.

KV accounting: loads hold no KV slots; an install moves slots from free to
the cache, so `free + cached + held == total` holds at every step.
"""

from __future__ import annotations

import logging
import os
import time
import weakref
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import torch

from radixlm.mem_cache.disk_key import make_namespace, model_identity, pool_layout
from radixlm.mem_cache.disk_store import DiskStore
from radixlm.mem_cache.disk_tier import DiskHit, DiskLoad, KVDiskTier
from radixlm.mem_cache.radix_cache import RadixCache
from radixlm.server_args import ServerArgs

if TYPE_CHECKING:
    from radixlm.mem_cache.base_prefix_cache import BasePrefixCache
    from radixlm.mem_cache.memory_pool import TokenToKVPool
    from radixlm.model_executor.model_runner import ModelRunner
    from radixlm.scheduler.request import Req

logger = logging.getLogger(__name__)

_MAX_LOAD_BYTES = 1 << 30  # rows of loads alive at once (one load may exceed it alone)


def disk_namespace(args: ServerArgs, runner: ModelRunner) -> bytes:
    """The key namespace of `runner`'s current weights, precision and KV layout (see
    mem_cache/disk_key.py). A GGUF file the user named counts besides the folder it was
    converted into."""
    pool = runner.token_to_kv_pool
    named = args.model_path if args.model_path and os.path.isfile(args.model_path) else None
    precision = {"dtype": str(runner.precision.dtype).removeprefix("torch."),
                 "quantization": runner.precision.quantization}
    return make_namespace(model_identity(named, runner.model_path), precision,
                          pool_layout(pool.slot_buffers()), pool.kv_cache_dtype,
                          args.kv_cache_disk_block_size)


def build_disk_tier(args: ServerArgs, runner: ModelRunner,
                    cache: BasePrefixCache) -> KVDiskTier | None:
    """The disk tier `--kv-cache-dir` asks for, hooked to the scheduler's radix cache
    `cache`; None without the flag or for a model that keeps no shareable KV."""
    if args.kv_cache_dir is None:
        return None
    if not isinstance(cache, RadixCache) or not runner.is_generation:
        logger.warning("--kv-cache-dir ignored: this model keeps no shared prefix cache")
        return None
    pool = runner.token_to_kv_pool
    root = os.path.expanduser(args.kv_cache_dir)
    try:
        store = DiskStore(root, args.kv_cache_disk_bytes)
        if not os.access(store.root, os.W_OK | os.X_OK):
            raise PermissionError("not writable")
    except OSError as e:
        raise ValueError(f"--kv-cache-dir {root!r} cannot be used: {e}") from e
    tier = KVDiskTier(pool, store, disk_namespace(args, runner),
                      args.kv_cache_disk_block_size, runner.vocab_size)
    cache.eviction_sink = tier
    logger.info("KV disk tier: %s, at most %.1f GiB, blocks of %d tokens (%.1f KiB each), "
                "%s", store.root, args.kv_cache_disk_bytes / (1 << 30),
                tier.block_size, tier.block_size * tier.bytes_per_token / 1024,
                args.kv_cache_disk_write_policy)
    return tier


class PrefixMatch(Protocol):
    """kv_manager.PrefixMatch, as far as this module reads it."""

    @property
    def kv_indices(self) -> torch.Tensor: ...
    @property
    def last_node(self) -> Any: ...


M = TypeVar("M", bound=PrefixMatch)
M_co = TypeVar("M_co", bound=PrefixMatch, covariant=True)


class SlotManager(Protocol[M_co]):
    """The KVManager, as far as this module uses it (a Protocol: kv_manager imports this
    module)."""

    cache: BasePrefixCache
    kv_pool: TokenToKVPool

    def match(self, req: Req) -> M_co: ...
    def alloc_slots(self, num_tokens: int) -> torch.Tensor | None: ...
    def num_available_slots(self) -> int: ...


class DiskPrefetcher(Generic[M]):
    """Per waiting request: look its prefix up on disk, load it, install it (see above)."""

    def __init__(self, kv: SlotManager[M], tier: KVDiskTier, write_through: bool) -> None:
        self.kv = kv
        self.tier = tier
        self.write_through = write_through
        # Loads alive (reading, or read and not installed yet), by their first block's key:
        # requests with the same prefix share one. Weak: a load no request waits for
        # (they were aborted) is dropped with its rows.
        self._loads: weakref.WeakValueDictionary[bytes, DiskLoad] = (
            weakref.WeakValueDictionary())
        pool_bytes = (kv.kv_pool.size + 1) * tier.bytes_per_token
        self.max_load_bytes = min(pool_bytes, _MAX_LOAD_BYTES)
        self.num_loads = 0  # loads started
        self.num_installed_tokens = 0  # tokens copied from the disk tier into the pool

    def is_loading(self, req: Req) -> bool:
        """req waits for a load that is not done yet (or for room to start one)."""
        load: DiskLoad | None = req.disk_load
        return req.disk_waiting and (load is None or not load.done())

    def admission_match(self, req: Req, match: M) -> M | None:
        """`match` (req's pool hit), longer when a finished load was installed; None while
        req waits for a load, which is started here when the disk has more of its prefix
        (and the rows of loads alive stay within `max_load_bytes`)."""
        # NOTE: `held` keeps req's load alive (the registry is weak) until it is looked up.
        held, req.disk_load, req.disk_waiting = req.disk_load, None, False
        hit = self._lookup(req, len(match.kv_indices))
        if hit is None:
            return match
        load = (held if held is not None and hit.keys[0] in held.hit.keys
                else self._loads.get(hit.keys[0]))
        del held
        if load is None:
            alive = sum(len(x.hit.tokens) for x in self._loads.values())
            if alive and (alive + len(hit.tokens)) * self.tier.bytes_per_token > self.max_load_bytes:
                req.disk_waiting = True  # wait for room: loads in flight finish first
                return None
            load = self.tier.load(hit)
            self._loads[hit.keys[0]] = load
            self.num_loads += 1
        if not load.done():
            req.disk_load, req.disk_waiting = load, True
            return None
        num_installed = self._install(req, match, load, hit)
        if num_installed is None:  # no room now: keep the rows, try again next step
            req.disk_load, req.disk_waiting = load, True
            return None
        return self.kv.match(req) if num_installed else match

    def _lookup(self, req: Req, num_cached: int) -> DiskHit | None:
        """The stored blocks after req's pool hit (its chain keys are kept on it)."""
        tokens = req.token_ids[: req.max_prefix_len]
        if req.disk_keys is None or req.disk_keys[0] != len(tokens):
            self._register_images(req)
            req.disk_keys = (len(tokens), self.tier.hasher.keys(tokens))
        return self.tier.lookup(tokens, num_cached, req.disk_keys[1])

    def _install(self, req: Req, match: PrefixMatch, load: DiskLoad, hit: DiskHit
                 ) -> int | None:
        """Copy the loaded tokens beyond the pool hit (as far as the load and req's own
        blocks agree) into new slots and the radix tree; returns how many (0: nothing to
        add), or None when the pool has no room for the rest of req's prompt now.

        NOTE: installing only when the whole rest of the prompt fits: the request needs
        those slots whether they are loaded or computed, and a node installed for a
        request that cannot be admitted is evicted again by the step (churn)."""
        cache, num_cached, bs = self.kv.cache, len(match.kv_indices), self.tier.block_size
        skip = (hit.start - load.hit.start) // bs  # the load may begin before this hit
        keys = load.hit.keys[skip:]
        num_common = next((i for i, (a, b) in enumerate(zip(keys, hit.keys)) if a != b),
                          min(len(keys), len(hit.keys)))
        end = min(load.hit.start + load.num_tokens(), hit.start + num_common * bs)
        if not load.hit.start <= num_cached < end:
            return 0
        num_new = end - num_cached
        cache.inc_lock_ref(match.last_node)  # eviction for room must not take the pool part
        fits = self.kv.num_available_slots() > req.num_tokens - num_cached
        slots = self.kv.alloc_slots(num_new) if fits else None
        cache.dec_lock_ref(match.last_node)
        if slots is None:
            return None
        copy_start = time.perf_counter()
        self.tier.write_to_pool(load, num_cached - load.hit.start, slots)
        kv_indices = torch.cat([match.kv_indices, slots])
        num_present = cache.insert(req.token_ids[: num_cached + num_new], kv_indices)
        # NOTE: nothing ran since the match, so the tree held exactly num_cached tokens.
        assert num_present == num_cached, (num_present, num_cached)
        logger.debug("Request %s: %d tokens from the disk tier (read %.3f s, waited %.3f s, "
                     "copied %.3f s)", req.rid, num_new, load.seconds,
                     copy_start - load.started, time.perf_counter() - copy_start)
        req.disk_hit_len = num_new
        self.num_installed_tokens += num_new
        return num_new

    def offer(self, req: Req, kv_indices: torch.Tensor) -> None:
        """Write through: offer req's KV so far (kv_indices: its row [0, kv_len))."""
        if not self.write_through or req.kv_len <= req.disk_offered_len:
            return
        self._register_images(req)
        req.disk_offered_len = self.tier.offer(req.token_ids[: req.kv_len], kv_indices,
                                               req.disk_offered_len)

    def _register_images(self, req: Req) -> None:
        if req.mm_inputs is not None:
            self.tier.pseudo.add_items(req.mm_inputs.items)

    def check_integrity(self) -> None:
        """The tier's own checks, and the rows of loads alive within their bound."""
        self.tier.check_integrity()
        sizes = [len(x.hit.tokens) * self.tier.bytes_per_token for x in self._loads.values()]
        assert sum(sizes) <= max([self.max_load_bytes, *sizes]), "loads past their bound"

    def stats(self) -> dict[str, Any]:
        out = self.tier.stats()
        out.update(kv_disk_loads_total=self.num_loads,
                   kv_disk_installed_tokens_total=self.num_installed_tokens)
        return out
