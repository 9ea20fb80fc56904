"""The tensor-parallel group of one engine: which rank this process is, and how to join.

One `TPConfig` travels to every rank process (pickled, like ServerArgs). Rank 0
is the scheduler process; ranks 1..N-1 are worker processes (worker.py), on
this node or, with `--nnodes`, on others. They join one torch.distributed group
(gloo on the CPU, NCCL on CUDA) through a TCP rendezvous at `init_addr`; every
collective then fails after `timeout` seconds instead of waiting for a dead
peer forever.

Models read this process's rank and size through `tp_rank_size()` when they
build their layers (as SGLang's get_tensor_model_parallel_rank()): (0, 1) until
`init_tp_group` runs, so single-process code and tests are unchanged.
"""

from __future__ import annotations

import datetime
import logging
import socket
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)

_TP_RANK = 0
_TP_SIZE = 1

# Architectures whose layers are tensor-parallel (the decoder families of models/decoder.py).
TP_ARCHITECTURES = frozenset({
    "LlamaForCausalLM", "MistralForCausalLM", "MinistralForCausalLM", "Qwen2ForCausalLM",
    "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Gemma3ForCausalLM", "Phi3ForCausalLM",
    "SmolLM3ForCausalLM"})


@dataclass(frozen=True)
class TPConfig:
    """How rank `rank` of `size` joins its group."""

    rank: int
    size: int
    init_addr: str  # HOST:PORT of rank 0's rendezvous
    backend: str  # "gloo" | "nccl"
    timeout: float  # seconds any collective may wait
    local_rank: int = 0  # this rank's index on its node (its CUDA device)
    num_local_ranks: int = 1  # ranks on this node (they share its cores)


def tp_rank_size() -> tuple[int, int]:
    """(rank, size) of this process in its tensor-parallel group; (0, 1) without one."""
    return _TP_RANK, _TP_SIZE


def init_tp_group(cfg: TPConfig) -> None:
    """Join the group (blocks until every rank has joined, at most cfg.timeout seconds)."""
    global _TP_RANK, _TP_SIZE
    import torch.distributed as dist

    dist.init_process_group(
        backend=cfg.backend,
        init_method=f"tcp://{cfg.init_addr}",
        rank=cfg.rank,
        world_size=cfg.size,
        timeout=datetime.timedelta(seconds=cfg.timeout),
    )
    _TP_RANK, _TP_SIZE = cfg.rank, cfg.size
    logger.info("Joined the TP group as rank %d of %d (%s, %s)", cfg.rank, cfg.size,
                cfg.backend, cfg.init_addr)


def destroy_tp_group() -> None:
    global _TP_RANK, _TP_SIZE
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    _TP_RANK, _TP_SIZE = 0, 1


def check_tp_layout(config: Any, tp_size: int) -> None:
    """Raise ValueError, saying which sizes would work, when `tp_size` cannot split the model.

    Query heads and the MLP width must divide by tp_size; KV heads either divide by it
    or (more ranks than KV heads) divide it, each KV head then replicated on
    tp_size / num_kv_heads ranks, as SGLang does. The vocabulary needs no division
    (the last rank's part is padded).
    """
    if tp_size == 1:
        return
    text = getattr(config, "text_config", None) or config
    archs = list(getattr(config, "architectures", None) or [])
    if not archs or archs[0] not in TP_ARCHITECTURES:
        raise ValueError(f"--tp-size {tp_size}: tensor parallelism supports "
                         f"{', '.join(sorted(TP_ARCHITECTURES))}, not {archs or 'this model'}")
    num_heads = int(text.num_attention_heads)
    num_kv_heads = int(getattr(text, "num_key_value_heads", None) or num_heads)
    inter = int(text.intermediate_size)
    # A mixture of experts splits each expert's MLP too.
    moe_inter = int(getattr(text, "moe_intermediate_size", None) or inter)

    def fits(n: int) -> bool:
        kv_ok = num_kv_heads % n == 0 or n % num_kv_heads == 0
        return num_heads % n == 0 and inter % n == 0 and moe_inter % n == 0 and kv_ok

    if not fits(tp_size):
        sizes = [n for n in range(1, num_heads + 1) if fits(n)]
        raise ValueError(
            f"--tp-size {tp_size} cannot split this model: it has {num_heads} attention "
            f"heads, {num_kv_heads} KV heads and an MLP of {inter}; the attention heads and "
            f"the MLP must divide by the TP size, and the KV heads must divide by it or into "
            f"it (replicated). TP sizes that fit: {', '.join(map(str, sizes))}")


def kv_heads_per_rank(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each rank holds: its share, or one replicated head when ranks outnumber them."""
    return 1 if tp_size >= num_kv_heads else num_kv_heads // tp_size


def free_loopback_addr() -> str:
    """127.0.0.1:PORT with a port free right now (the single-node rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"
