"""Prometheus series of the prefix cache's tiers (the KV pool, and the disk tier of
`--kv-cache-dir`), read from the scheduler's /get_server_info snapshot at scrape time.

- `radixlm:cache_hit_tokens_total{tier="pool"|"disk"}`: prompt tokens whose KV a
  request found in that tier at its admission (their sum is `cached_tokens`);
- with a disk tier: its size (`kv_disk_bytes`, `kv_disk_max_bytes`,
  `kv_disk_blocks`, `kv_disk_pending_blocks`), and counters of blocks and bytes
  spilled (written) and loaded (read), loads started, blocks dropped (write queue
  full), evicted (LRU), damaged (skipped), and write errors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

PREFIX = "radixlm"

_DISK_GAUGES = (
    ("kv_disk_bytes", "kv_disk_bytes", "Bytes of KV blocks on the disk tier."),
    ("kv_disk_max_bytes", "kv_disk_max_bytes", "The disk tier's byte bound."),
    ("kv_disk_blocks", "kv_disk_blocks", "KV blocks on the disk tier."),
    ("kv_disk_pending_blocks", "kv_disk_pending_blocks",
     "KV blocks copied out of the pool and waiting to be written."),
)
_DISK_COUNTERS = (
    ("kv_disk_spilled_blocks", "kv_disk_written_blocks_total", "KV blocks written to disk."),
    ("kv_disk_spilled_bytes", "kv_disk_written_bytes_total", "Bytes written to the disk tier."),
    ("kv_disk_loaded_blocks", "kv_disk_read_blocks_total", "KV blocks read back from disk."),
    ("kv_disk_loaded_bytes", "kv_disk_read_bytes_total", "Bytes read back from the disk tier."),
    ("kv_disk_loads", "kv_disk_loads_total", "Prefix reads started for waiting requests."),
    ("kv_disk_dropped_blocks", "kv_disk_dropped_blocks_total",
     "KV blocks not written because the write queue was full."),
    ("kv_disk_evicted_blocks", "kv_disk_evicted_blocks_total",
     "KV blocks deleted to stay within the byte bound (least recently used)."),
    ("kv_disk_damaged_blocks", "kv_disk_damaged_blocks_total",
     "Damaged or partial block files skipped and deleted."),
    ("kv_disk_write_errors", "kv_disk_write_errors_total", "Block writes that failed."),
)


class KVTierCollector(Collector):
    """The tier series from `info()`, the latest /get_server_info snapshot."""

    def __init__(self, model_name: str, info: Callable[[], dict[str, Any]]) -> None:
        self.model_name = model_name
        self.info = info

    def collect(self) -> Iterator[Metric]:
        info = self.info()
        cached = float(info.get("num_cached_prompt_tokens_total") or 0)
        disk = float(info.get("num_cached_prompt_tokens_disk_total") or 0)
        hits = CounterMetricFamily(f"{PREFIX}:cache_hit_tokens",
                                   "Prompt tokens found in the prefix cache, by tier.",
                                   labels=["model_name", "tier"])
        hits.add_metric([self.model_name, "pool"], cached - disk)
        hits.add_metric([self.model_name, "disk"], disk)
        yield hits
        if "kv_disk_max_bytes" not in info:
            return
        for name, key, doc in _DISK_GAUGES:
            g = GaugeMetricFamily(f"{PREFIX}:{name}", doc, labels=["model_name"])
            g.add_metric([self.model_name], float(info.get(key) or 0))
            yield g
        for name, key, doc in _DISK_COUNTERS:
            c = CounterMetricFamily(f"{PREFIX}:{name}", doc, labels=["model_name"])
            c.add_metric([self.model_name], float(info.get(key) or 0))
            yield c
