"""What the scheduler answers besides requests: its state, cache flushes, weight updates.

process.py hands these messages over between steps. `server_info` is the
scheduler's part of /get_server_info (the KV pool and cache, the queues,
retraction and step counts, throughput, grammar-mask time, and the output,
thread-policy and drafter stats); `runner_info` the model facts the
TokenizerManager gets once, when the scheduler is ready. A cache flush or a
weight swap is refused while requests are in flight.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixlm.messages.io_struct import (
    FlushCacheOut,
    ServerInfoOut,
    UpdateWeightsFromDiskOut,
    UpdateWeightsFromDiskReq,
)

if TYPE_CHECKING:
    from radixlm.scheduler.scheduler import Scheduler


def update_weights_from_disk(scheduler: Scheduler, msg: UpdateWeightsFromDiskReq
                             ) -> UpdateWeightsFromDiskOut:
    """Swap the model's weights between steps; the prefix cache is flushed after.

    The TokenizerManager sends this only once no request is in flight (new ones
    wait), as SGLang does, so no request mixes two sets of weights.
    """
    if scheduler.has_work:
        return UpdateWeightsFromDiskOut(False, "Cannot update weights while requests run")
    ok, message = scheduler.runner.update_weights_from_disk(msg.model_path, msg.load_format)
    if ok:
        scheduler.kv.cache.reset()
        if scheduler.kv.disk is not None:  # the disk tier keys blocks by the new weights
            from radixlm.scheduler.kv_disk import disk_namespace

            scheduler.kv.disk.tier.set_namespace(disk_namespace(scheduler.args, scheduler.runner))
    return UpdateWeightsFromDiskOut(ok, message)


def flush_cache(scheduler: Scheduler) -> FlushCacheOut:
    if scheduler.waiting or scheduler.running or scheduler.num_compiling:
        return FlushCacheOut(False, "Cannot flush the cache while requests are running")
    scheduler.kv.flush()  # the pool's radix tree and the disk tier
    return FlushCacheOut(True)


def server_info(scheduler: Scheduler) -> ServerInfoOut:
    s, runner = scheduler, scheduler.runner
    info: dict[str, Any] = dict(s.kv.stats())
    info.update(s.kv.kv_pool.info())  # the KV cache's dtype and real size
    info.update(
        num_running_reqs=len(s.running),
        num_waiting_reqs=len(s.waiting),
        num_compiling_reqs=s.num_compiling,
        num_retractions=s.num_retractions,
        num_preemptions=s.num_preemptions,
        gen_throughput=round(s.batch_log.gen_throughput, 3),
        num_steps=s.num_steps,
        new_token_ratio=round(s.new_token_ratio.value, 4),
        context_length=runner.context_len,
        grammar_mask_seconds_total=round(
            s.grammar_fill_seconds + runner.grammar_mask_seconds, 6),
        num_grammar_mask_steps=runner.num_grammar_mask_steps,
        **{f"forward_seconds_{kind}": round(value, 6)
           for kind, value in s.forward_seconds.items()},
    )
    info.update(s.output.stats())
    if runner.thread_governor is not None:
        info.update(runner.thread_governor.stats())
    if s.drafter is not None:
        info.update(s.drafter.stats())
    return ServerInfoOut(info)


def runner_info(scheduler: Scheduler) -> dict[str, Any]:
    # NOTE: a lazy import: process.py imports this module, and importing it loads no torch.
    from radixlm.scheduler.pooling import pooling_info

    runner = scheduler.runner
    return {
        "architectures": list(getattr(runner.config, "architectures", None) or []),
        "context_length": runner.context_len,
        "vocab_size": runner.vocab_size,
        "max_total_num_tokens": scheduler.kv.kv_pool.size,
        "kv_cache_dtype": scheduler.kv.kv_pool.kv_cache_dtype,
        "eos_token_ids": sorted(runner.eos_token_ids),
        "is_generation": runner.is_generation,
        **pooling_info(runner.model),
    }
