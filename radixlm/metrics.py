"""Prometheus metrics (`--enable-metrics`), served at /metrics.

Two sources:
- per-request latencies, observed in the HTTP process: time to first token,
  time per output token, end-to-end latency and request counts by finish
  reason when a sample finishes (`on_sample_finished`), and the latency
  between a stream's outputs per token (`on_tokens`), both hooked to the
  TokenizerManager;
- the scheduler's state, read at scrape time (`update_from_server_info`):
  running, queued and compiling (grammar) requests, KV usage, cache hit
  rate, generation throughput of the latest decode log line, the prompt,
  cached and generated token totals (counters the scheduler keeps, exposed as
  Prometheus counters), SGLang's `realtime_tokens_total` by mode
  (prefill_compute, prefill_cache, decode), `forward_execution_seconds_total`
  by category (extend, decode, mixed: the steps' forward passes, grammar masks
  included) and, with speculative decoding, `spec_accept_length` (tokens kept
  per verifying forward, the model's own one included) and `spec_accept_rate`.

Every series exists twice, with the same labels and values: `radixlm:<name>`
and SGLang's `sglang:<name>`, so dashboards and alerts written for SGLang
(sglang:num_running_reqs, sglang:token_usage, sglang:gen_throughput,
sglang:time_to_first_token_seconds, sglang:prompt_tokens_total, ...) work
unchanged; the prefix cache's series per tier (`KVTierCollector`: pool and
disk) have no SGLang counterpart and exist as `radixlm:` only. Each `Metrics`
has its own registry, so several servers in one process (tests) do not collide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixlm.messages.generate_output import GenerateOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIXES = ("radixlm", "sglang")

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                    160.0, 320.0)
_TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
                 2.5, 5.0)


class _SchedulerCollector(Collector):
    """Scheduler state from the latest /get_server_info snapshot."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.info: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        info = self.info
        total = float(info.get("max_total_num_tokens") or 0)
        used = float(info.get("num_used_tokens") or 0)
        prompt = float(info.get("num_prompt_tokens_total") or 0)
        cached = float(info.get("num_cached_prompt_tokens_total") or 0)
        gauges = [
            ("num_running_reqs", "Requests decoding or prefilling.",
             info.get("num_running_reqs", 0)),
            ("num_queue_reqs", "Requests waiting for admission.",
             info.get("num_waiting_reqs", 0)),
            ("num_grammar_queue_reqs", "Constrained requests waiting for their grammar.",
             info.get("num_compiling_reqs", 0)),
            ("num_used_tokens", "KV slots held by requests.", used),
            ("max_total_num_tokens", "KV slots in the pool.", total),
            ("token_usage", "Fraction of KV slots held by requests.",
             used / total if total else 0.0),
            ("cache_hit_rate", "Fraction of prompt tokens served from the prefix cache.",
             cached / prompt if prompt else 0.0),
            ("gen_throughput", "Generated tokens per second (the latest decode log line).",
             info.get("gen_throughput", 0.0)),
        ]
        counters = [
            ("prompt_tokens", "Prompt tokens processed.", prompt),
            ("cached_tokens", "Prompt tokens found in the prefix cache.", cached),
            ("generation_tokens", "Tokens generated.",
             float(info.get("num_generation_tokens_total") or 0)),
            ("num_retractions", "Requests retracted to the waiting queue (memory or "
             "priority preemption).", float(info.get("num_retractions") or 0)),
        ]
        verify_steps = float(info.get("spec_num_verify_steps") or 0)
        accepted = float(info.get("spec_num_accepted_tokens") or 0)
        gauges += [
            ("spec_accept_length", "Tokens kept per verifying forward pass of speculative "
             "decoding (accepted drafts plus the model's own token); 0 without it.",
             (accepted + verify_steps) / verify_steps if verify_steps else 0.0),
            ("spec_accept_rate", "Accepted drafted tokens over drafted tokens.",
             float(info.get("spec_accept_rate") or 0.0)),
        ]
        for prefix in PREFIXES:
            for name, doc, value in gauges:
                g = GaugeMetricFamily(f"{prefix}:{name}", doc, labels=["model_name"])
                g.add_metric([self.model_name], float(value))
                yield g
            for name, doc, value in counters:
                c = CounterMetricFamily(f"{prefix}:{name}", doc, labels=["model_name"])
                c.add_metric([self.model_name], value)
                yield c
            yield from self._labelled_counters(prefix, prompt, cached)

    def _labelled_counters(self, prefix: str, prompt: float, cached: float
                           ) -> Iterator[Metric]:
        info = self.info
        tokens = CounterMetricFamily(
            f"{prefix}:realtime_tokens", "Tokens processed. mode: prefill_compute, "
            "prefill_cache, decode.", labels=["model_name", "mode"])
        for mode, value in (("prefill_compute", prompt - cached), ("prefill_cache", cached),
                            ("decode", float(info.get("num_generation_tokens_total") or 0))):
            tokens.add_metric([self.model_name, mode], max(0.0, value))
        yield tokens
        seconds = CounterMetricFamily(
            f"{prefix}:forward_execution_seconds", "Time spent in forward passes (grammar "
            "masks included). category: extend, decode, mixed.",
            labels=["model_name", "category"])
        for category in ("extend", "decode", "mixed"):
            value = float(info.get(f"forward_seconds_{category}") or 0.0)
            seconds.add_metric([self.model_name, category], value)
        yield seconds


class _Twin:
    """One histogram or counter under every prefix, observed together."""

    def __init__(self, kind: type[Histogram] | type[Counter], name: str, doc: str,
                 labels: list[str], registry: CollectorRegistry, **kwargs: Any) -> None:
        self.metrics = [kind(f"{p}:{name}", doc, labels, registry=registry, **kwargs)
                        for p in PREFIXES]

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        for m in self.metrics:
            m.labels(*labels).observe(value)  # type: ignore[union-attr]

    def inc(self, labels: tuple[str, ...]) -> None:
        for m in self.metrics:
            m.labels(*labels).inc()  # type: ignore[union-attr]


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.scheduler = _SchedulerCollector(model_name)
        self.registry.register(self.scheduler)
        self.registry.register(KVTierCollector(model_name, lambda: self.scheduler.info))
        labels = ["model_name"]
        reg = self.registry
        self.ttft = _Twin(Histogram, "time_to_first_token_seconds",
                          "Time from arrival to the first output token.", labels, reg,
                          buckets=_LATENCY_BUCKETS)
        self.tpot = _Twin(Histogram, "time_per_output_token_seconds",
                          "Average time between output tokens of a request.", labels, reg,
                          buckets=_TPOT_BUCKETS)
        self.itl = _Twin(Histogram, "inter_token_latency_seconds",
                         "Time between a stream's outputs, per token they carry.", labels,
                         reg, buckets=_TPOT_BUCKETS)
        self.e2e = _Twin(Histogram, "e2e_request_latency_seconds",
                         "Time from arrival to the last output token.", labels, reg,
                         buckets=_LATENCY_BUCKETS)
        self.requests = _Twin(Counter, "num_requests", "Finished samples by finish reason.",
                              ["model_name", "finish_reason"], reg)

    def on_sample_finished(self, out: GenerateOutput) -> None:
        """Observe one finished sample (its last output)."""
        reason = out.finish_reason.type if out.finish_reason is not None else "unknown"
        model = (self.model_name,)
        self.requests.inc((self.model_name, reason))
        self.e2e.observe(model, out.e2e_latency)
        if out.first_token_time is None:
            return
        ttft = max(0.0, out.first_token_time - out.created)
        self.ttft.observe(model, ttft)
        if out.completion_tokens > 1:
            tpot = max(0.0, out.e2e_latency - ttft) / (out.completion_tokens - 1)
            self.tpot.observe(model, tpot)

    def on_tokens(self, seconds: float, num_tokens: int) -> None:
        """`num_tokens` new tokens arrived `seconds` after the sample's previous ones."""
        per_token = max(0.0, seconds) / max(num_tokens, 1)
        for _ in range(min(num_tokens, 64)):  # bounded: a jump-forward may add many
            self.itl.observe((self.model_name,), per_token)

    def update_from_server_info(self, info: dict[str, Any]) -> None:
        self.scheduler.info = dict(info)

    def render(self) -> bytes:
        return generate_latest(self.registry)


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
    """The prefix cache's tiers (the KV pool, and the disk tier of `--kv-cache-dir`),
    from `info()`, the latest /get_server_info snapshot, under `radixlm:` only (SGLang
    has no such series):

    - `cache_hit_tokens_total{tier="pool"|"disk"}`: prompt tokens whose KV a request
      found in that tier at its admission (their sum is `cached_tokens`);
    - with a disk tier: its size (`kv_disk_bytes`, `kv_disk_max_bytes`,
      `kv_disk_blocks`, `kv_disk_pending_blocks`), and counters of blocks and bytes
      spilled (written) and loaded (read), loads started, blocks dropped (write queue
      full), evicted (LRU) and damaged (skipped), and write errors.
    """

    def __init__(self, model_name: str, info: Callable[[], dict[str, Any]]) -> None:
        self.model_name = model_name
        self.info = info

    def collect(self) -> Iterator[Metric]:
        info = self.info()
        cached = float(info.get("num_cached_prompt_tokens_total") or 0)
        disk = float(info.get("num_cached_prompt_tokens_disk_total") or 0)
        hits = CounterMetricFamily("radixlm:cache_hit_tokens",
                                   "Prompt tokens found in the prefix cache, by tier.",
                                   labels=["model_name", "tier"])
        hits.add_metric([self.model_name, "pool"], cached - disk)
        hits.add_metric([self.model_name, "disk"], disk)
        yield hits
        if "kv_disk_max_bytes" not in info:
            return
        for name, key, doc in _DISK_GAUGES:
            g = GaugeMetricFamily(f"radixlm:{name}", doc, labels=["model_name"])
            g.add_metric([self.model_name], float(info.get(key) or 0))
            yield g
        for name, key, doc in _DISK_COUNTERS:
            c = CounterMetricFamily(f"radixlm:{name}", doc, labels=["model_name"])
            c.add_metric([self.model_name], float(info.get(key) or 0))
            yield c
