"""The scheduler's periodic log lines, worded as SGLang prints them.

An SGLang operator reads (and scripts grep) two lines:

    Prefill batch. #new-seq: 1, #new-token: 115, #cached-token: 351, token usage: 0.02,
        #running-req: 0, #queue-req: 0,
    Decode batch. #running-req: 1, #token: 501, token usage: 0.02, cache hit rate: 75.32%,
        gen throughput (token/s): 65.75, #queue-req: 0,

(each on one line). radixlm's steps mix prefill and decode, so a step that
computes prompt tokens logs a prefill line (new-seq: requests with prompt
work this step, new-token: those tokens, cached-token: the prefix hits of
the requests admitted in it, running-req: requests that were running before
it), and every `--decode-log-interval` steps that decode log a decode line
(gen throughput: tokens generated since the previous decode line over the
time since it; cache hit rate: prompt tokens served from the prefix cache
since start). Token usage is the fraction of KV slots held by requests
(cached-but-unused slots count as free, as SGLang counts them).
"""

from __future__ import annotations

import logging
import time

from radixlm.scheduler.step_plan import ScheduledReq

logger = logging.getLogger("radixlm.scheduler")


class BatchLog:
    def __init__(self, decode_log_interval: int) -> None:
        self.decode_log_interval = decode_log_interval
        self.num_decode_steps = 0
        self.last_decode_time = time.perf_counter()
        self.last_generation_total = 0
        self.gen_throughput = 0.0  # of the latest decode line (also a metric)

    def prefill(self, items: list[ScheduledReq], admitted: list[ScheduledReq],
                num_running: int, num_queued: int, num_used: int, num_total: int) -> None:
        """A step with prompt work: one line (call it only when some item prefills)."""
        prefills = [it for it in items if it.prefix_len < it.req.num_prompt_tokens]
        logger.info(
            "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, "
            "token usage: %.2f, #running-req: %d, #queue-req: %d,",
            len(prefills), sum(it.extend_len for it in prefills),
            sum(it.prefix_len for it in admitted), _usage(num_used, num_total),
            num_running, num_queued)

    def decode(self, num_running: int, num_queued: int, num_used: int, num_total: int,
               generation_total: int, cache_hit_rate: float) -> None:
        """A step that decodes: a line every `decode_log_interval` of them."""
        self.num_decode_steps += 1
        if self.num_decode_steps % self.decode_log_interval:
            return
        now = time.perf_counter()
        gap = max(now - self.last_decode_time, 1e-9)
        self.gen_throughput = (generation_total - self.last_generation_total) / gap
        self.last_decode_time, self.last_generation_total = now, generation_total
        logger.info(
            "Decode batch. #running-req: %d, #token: %d, token usage: %.2f, "
            "cache hit rate: %.2f%%, gen throughput (token/s): %.2f, #queue-req: %d,",
            num_running, num_used, _usage(num_used, num_total), 100.0 * cache_hit_rate,
            self.gen_throughput, num_queued)


def _usage(num_used: int, num_total: int) -> float:
    return num_used / num_total if num_total else 0.0
