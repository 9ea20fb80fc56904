"""The data-parallel controller (`--dp-size N`): one process between the TokenizerManager
and N scheduler replicas, each with its own KV pool, prefix cache and TP ranks.

    TokenizerManager ──> controller ──> replica i's scheduler ──> detokenizer (shared)
                 ^            │  ^                  │
                 └────────────┘  └─ control replies, loads

- A request goes to one replica: `round_robin`, or `shortest_queue`, the replica
  with the fewest unfinished requests. Loads are exact, not sampled: a replica
  reports (requests received, requests unfinished) whenever they change, and the
  controller adds what it sent since that report.
- An abort goes to every replica (the one without the request ignores it).
- A flush goes to every replica; it succeeds when all succeed. Server info
  is summed over the replicas, and each replica's own numbers are under
  `replicas` (the per-replica metrics; /get_load lists them as SGLang does).
- Ready when every replica is; any replica's failure is forwarded at once.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections import deque
from typing import Any

import zmq

from radixlm.messages.io_struct import (
    AbortReq,
    FlushCacheOut,
    FlushCacheReq,
    GetServerInfoReq,
    ProcessError,
    ReplicaLoad,
    SchedulerReady,
    ServerInfoOut,
    TokenizedGenerateReq,
)
from radixlm.server_args import ServerArgs
from radixlm.utils import PortArgs, configure_logging, parent_alive

logger = logging.getLogger(__name__)


class LoadBalancer:
    """Which replica takes the next request."""

    def __init__(self, num_replicas: int, method: str) -> None:
        self.method = method
        self._next = itertools.cycle(range(num_replicas))
        self.num_sent = [0] * num_replicas  # requests sent to each replica
        self._reported = [(0, 0)] * num_replicas  # (received, unfinished) at its last report

    def report(self, load: ReplicaLoad) -> None:
        self._reported[load.dp_rank] = (load.num_received, load.num_unfinished)

    def num_unfinished(self, i: int) -> int:
        received, unfinished = self._reported[i]
        return unfinished + self.num_sent[i] - received  # plus those not yet received

    def choose(self) -> int:
        if self.method == "shortest_queue":
            i = min(range(len(self.num_sent)), key=self.num_unfinished)
        else:
            i = next(self._next)
        self.num_sent[i] += 1
        return i


def merge_server_info(infos: list[dict[str, Any]]) -> dict[str, Any]:
    """Numbers summed over replicas (ratios and sizes that do not add: the first's), each
    replica's own under `replicas`; kv_integrity is "ok" only when every replica's is."""
    merged: dict[str, Any] = dict(infos[0])
    for key, value in infos[0].items():
        if isinstance(value, int | float) and not isinstance(value, bool) and key not in (
                "new_token_ratio", "context_length"):
            merged[key] = sum(info.get(key, 0) for info in infos)
    bad = [f"replica {i}: {info.get('kv_integrity')}" for i, info in enumerate(infos)
           if info.get("kv_integrity", "ok") != "ok"]
    merged["kv_integrity"] = "; ".join(bad) if bad else "ok"
    merged["replicas"] = [{"dp_rank": i, **info} for i, info in enumerate(infos)]
    return merged


def run_dp_controller_process(args: ServerArgs, model_dir: str, ports: PortArgs,
                              replica_ports: list[PortArgs]) -> None:
    configure_logging(args.log_level, prefix="dp")
    ctx = zmq.Context(1)
    ctx.setsockopt(zmq.LINGER, 0)
    from_tm = ctx.socket(zmq.PULL)
    from_tm.bind(ports.scheduler_input)
    from_replicas = ctx.socket(zmq.PULL)
    from_replicas.bind(replica_ports[0].tokenizer_input)  # the replicas' common reply address
    to_tm = ctx.socket(zmq.PUSH)
    to_tm.connect(ports.tokenizer_input)
    to_replicas = []
    for rp in replica_ports:
        sock = ctx.socket(zmq.PUSH)
        sock.connect(rp.scheduler_input)
        to_replicas.append(sock)
    _Controller(args, from_tm, from_replicas, to_tm, to_replicas).run()
    os._exit(0)


class _Controller:
    def __init__(self, args: ServerArgs, from_tm: zmq.Socket[bytes],
                 from_replicas: zmq.Socket[bytes], to_tm: zmq.Socket[bytes],
                 to_replicas: list[zmq.Socket[bytes]]) -> None:
        self.from_tm, self.from_replicas = from_tm, from_replicas
        self.to_tm, self.to_replicas = to_tm, to_replicas
        n = len(to_replicas)
        self.balancer = LoadBalancer(n, args.load_balance_method)
        self.ready: dict[int, SchedulerReady] = {}
        # Control replies per type, per replica, in order: merged one from each.
        self.replies: dict[type, list[deque[Any]]] = {
            t: [deque() for _ in range(n)] for t in (FlushCacheOut, ServerInfoOut)}

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.from_tm, zmq.POLLIN)
        poller.register(self.from_replicas, zmq.POLLIN)
        parent = os.getppid()
        while parent_alive(parent):
            for sock, _ in poller.poll(1000):
                if sock is self.from_tm:
                    self._from_tm(self.from_tm.recv_pyobj())
                else:
                    dp_rank, msg = self.from_replicas.recv_pyobj()
                    self._from_replica(dp_rank, msg)

    def _from_tm(self, msg: Any) -> None:
        if isinstance(msg, TokenizedGenerateReq):
            self.to_replicas[self.balancer.choose()].send_pyobj(msg)
        elif isinstance(msg, AbortReq | FlushCacheReq | GetServerInfoReq):
            for sock in self.to_replicas:
                sock.send_pyobj(msg)
        else:  # e.g. profiling: replica 0 answers for the server (its reply is forwarded)
            self.to_replicas[0].send_pyobj(msg)

    def _from_replica(self, dp_rank: int, msg: Any) -> None:
        if isinstance(msg, ReplicaLoad):
            self.balancer.report(msg)
        elif isinstance(msg, SchedulerReady):
            self.ready[dp_rank] = msg
            if len(self.ready) == len(self.to_replicas):
                info = dict(self.ready[0].model_info)
                info["max_total_num_tokens"] = sum(
                    r.model_info.get("max_total_num_tokens", 0) for r in self.ready.values())
                info["dp_size"] = len(self.to_replicas)
                self.to_tm.send_pyobj(SchedulerReady(info))
        elif isinstance(msg, ProcessError):
            self.to_tm.send_pyobj(ProcessError(f"{msg.who} (replica {dp_rank})", msg.message))
        elif type(msg) in self.replies:
            queues = self.replies[type(msg)]
            queues[dp_rank].append(msg)
            if all(queues):
                self.to_tm.send_pyobj(self._merge([q.popleft() for q in queues]))
        else:
            self.to_tm.send_pyobj(msg)

    @staticmethod
    def _merge(replies: list[Any]) -> Any:
        if isinstance(replies[0], FlushCacheOut):
            failed = [r.message for r in replies if not r.success]
            return FlushCacheOut(not failed, "; ".join(m for m in failed if m))
        return ServerInfoOut(merge_server_info([r.info for r in replies]))
