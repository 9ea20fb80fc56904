"""Prometheus metrics (`--enable-metrics`), served at /metrics.

Two sources:
- per-request latencies, observed in the HTTP process when a sample finishes
  (`on_sample_finished`, hooked to the TokenizerManager): time to first
  token, time per output token, end-to-end latency, and request counts by
  finish reason;
- the scheduler's state, read at scrape time (`update_from_server_info`):
  running and queued requests, KV usage, cache hit rate, and the prompt,
  cached and generated token totals (counters the scheduler keeps, exposed as
  Prometheus counters).

Every series is prefixed `radixlm:`. Each `Metrics` has its own registry, so
several servers in one process (tests) do not collide.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from radixlm.tokenizer.generate_output import GenerateOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
                    160.0, 320.0)
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5, 5.0)


class _SchedulerCollector(Collector):
    """Scheduler state from the latest /get_server_info snapshot."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.info: dict[str, Any] = {}

    def collect(self) -> Iterator[Metric]:
        info, labels = self.info, [self.model_name]

        def gauge(name: str, doc: str, value: float) -> Metric:
            g = GaugeMetricFamily(f"radixlm:{name}", doc, labels=["model_name"])
            g.add_metric(labels, value)
            return g

        def counter(name: str, doc: str, value: float) -> Metric:
            c = CounterMetricFamily(f"radixlm:{name}", doc, labels=["model_name"])
            c.add_metric(labels, value)
            return c

        total = float(info.get("max_total_num_tokens") or 0)
        used = float(info.get("num_used_tokens") or 0)
        prompt = float(info.get("num_prompt_tokens_total") or 0)
        cached = float(info.get("num_cached_prompt_tokens_total") or 0)
        yield gauge("num_running_reqs", "Requests decoding or prefilling.",
                    info.get("num_running_reqs", 0))
        yield gauge("num_queue_reqs", "Requests waiting for admission.",
                    info.get("num_waiting_reqs", 0))
        yield gauge("num_used_tokens", "KV slots held by requests.", used)
        yield gauge("max_total_num_tokens", "KV slots in the pool.", total)
        yield gauge("token_usage", "Fraction of KV slots held by requests.",
                    used / total if total else 0.0)
        yield gauge("cache_hit_rate", "Fraction of prompt tokens served from the prefix cache.",
                    cached / prompt if prompt else 0.0)
        yield counter("prompt_tokens", "Prompt tokens processed.", prompt)
        yield counter("cached_tokens", "Prompt tokens found in the prefix cache.", cached)
        yield counter("generation_tokens", "Tokens generated.",
                      float(info.get("num_generation_tokens_total") or 0))


class Metrics:
    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.model_name = model_name
        self.scheduler = _SchedulerCollector(model_name)
        self.registry.register(self.scheduler)
        labels = ["model_name"]
        self.ttft = Histogram("radixlm:time_to_first_token_seconds",
                              "Time from arrival to the first output token.", labels,
                              buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.tpot = Histogram("radixlm:time_per_output_token_seconds",
                              "Average time between output tokens of a request.", labels,
                              buckets=_TPOT_BUCKETS, registry=self.registry)
        self.e2e = Histogram("radixlm:e2e_request_latency_seconds",
                             "Time from arrival to the last output token.", labels,
                             buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.requests = Counter("radixlm:num_requests", "Finished samples by finish reason.",
                                ["model_name", "finish_reason"], registry=self.registry)

    def on_sample_finished(self, out: GenerateOutput) -> None:
        """Observe one finished sample (its last output)."""
        reason = out.finish_reason.type if out.finish_reason is not None else "unknown"
        self.requests.labels(self.model_name, reason).inc()
        self.e2e.labels(self.model_name).observe(out.e2e_latency)
        if out.first_token_time is None:
            return
        ttft = max(0.0, out.first_token_time - out.created)
        self.ttft.labels(self.model_name).observe(ttft)
        if out.completion_tokens > 1:
            tpot = max(0.0, out.e2e_latency - ttft) / (out.completion_tokens - 1)
            self.tpot.labels(self.model_name).observe(tpot)

    def update_from_server_info(self, info: dict[str, Any]) -> None:
        self.scheduler.info = dict(info)

    def render(self) -> bytes:
        return generate_latest(self.registry)
