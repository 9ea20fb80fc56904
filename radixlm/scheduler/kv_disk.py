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
install that finds no room (every slot locked by running requests) is
dropped and the request computes its prefix instead; one whose pool hit
shrank below the loaded blocks' start looks up again.

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
from typing import TYPE_CHECKING, Any

import torch

from radixlm.mem_cache.disk_key import make_namespace, model_identity, pool_layout
from radixlm.mem_cache.disk_store import DiskStore
from radixlm.mem_cache.disk_tier import DiskLoad, KVDiskTier
from radixlm.mem_cache.radix_cache import RadixCache
from radixlm.server_args import ServerArgs

if TYPE_CHECKING:
    from radixlm.model_executor.model_runner import ModelRunner
    from radixlm.scheduler.kv_manager import KVManager, PrefixMatch
    from radixlm.scheduler.request import Req

logger = logging.getLogger(__name__)


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


def build_disk_tier(args: ServerArgs, runner: ModelRunner) -> KVDiskTier | None:
    """The disk tier `--kv-cache-dir` asks for, hooked to the runner's radix cache; None
    without the flag or for a model that keeps no shareable KV."""
    if args.kv_cache_dir is None:
        return None
    cache = runner.prefix_cache
    if not isinstance(cache, RadixCache) or not runner.is_generation:
        logger.warning("--kv-cache-dir ignored: this model keeps no shared prefix cache")
        return None
    pool = runner.token_to_kv_pool
    store = DiskStore(os.path.expanduser(args.kv_cache_dir), args.kv_cache_disk_bytes)
    tier = KVDiskTier(pool, store, disk_namespace(args, runner),
                      args.kv_cache_disk_block_size, runner.vocab_size)
    cache.eviction_sink = tier
    logger.info("KV disk tier: %s, at most %.1f GiB, blocks of %d tokens (%.1f KiB each), "
                "%s", store.root, args.kv_cache_disk_bytes / (1 << 30),
                tier.block_size, tier.block_size * tier.bytes_per_token / 1024,
                args.kv_cache_disk_write_policy)
    return tier


class DiskPrefetcher:
    """Per waiting request: look its prefix up on disk, load it, install it (see above)."""

    def __init__(self, kv: KVManager, tier: KVDiskTier, write_through: bool) -> None:
        self.kv = kv
        self.tier = tier
        self.write_through = write_through
        self.num_loads = 0  # loads started
        self.num_installed_tokens = 0  # tokens copied from the disk tier into the pool

    def is_loading(self, req: Req) -> bool:
        load: DiskLoad | None = req.disk_load
        return load is not None and not load.done()

    def admission_match(self, req: Req, match: PrefixMatch) -> PrefixMatch | None:
        """`match` (req's pool hit), longer when a finished load was installed; None while
        req waits for a load (one is started here when the disk has more of its prefix)."""
        load: DiskLoad | None = req.disk_load
        if load is None:
            self._register_images(req)
            hit = self.tier.lookup(req.token_ids[: req.max_prefix_len], len(match.kv_indices))
            if hit is None:
                return match
            req.disk_load = self.tier.load(hit)
            self.num_loads += 1
            return None
        if not load.done():
            return None
        req.disk_load = None
        if self._install(req, match, load):
            return self.kv.match(req)
        return match

    def _install(self, req: Req, match: PrefixMatch, load: DiskLoad) -> int:
        """Copy the loaded tokens beyond the pool hit into new slots and the radix tree;
        returns how many (0: nothing to add, or no room)."""
        cache, num_cached = self.kv.cache, len(match.kv_indices)
        start, end = load.hit.start, load.hit.start + load.num_tokens()
        if not start <= num_cached < end:
            return 0
        num_new = end - num_cached
        cache.inc_lock_ref(match.last_node)  # eviction for room must not take the pool part
        slots = self.kv.alloc_slots(num_new)
        cache.dec_lock_ref(match.last_node)
        if slots is None:
            logger.info("Request %s: no room to load %d tokens from the disk tier; "
                        "computing them", req.rid, num_new)
            return 0
        self.tier.write_to_pool(load, num_cached - start, slots)
        kv_indices = torch.cat([match.kv_indices, slots])
        num_present = cache.insert(req.token_ids[:end], kv_indices)
        # NOTE: nothing ran since the match, so the tree held exactly num_cached tokens.
        assert num_present == num_cached, (num_present, num_cached)
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

    def stats(self) -> dict[str, Any]:
        out = self.tier.stats()
        out.update(kv_disk_loads_total=self.num_loads,
                   kv_disk_installed_tokens_total=self.num_installed_tokens)
        return out
