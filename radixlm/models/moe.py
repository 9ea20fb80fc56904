"""A sparse mixture-of-experts MLP (Qwen3-MoE): top-k routing over gated experts.

Routing is transformers': softmax over the router's logits in float32, the top
k experts per token, their probabilities renormalized to sum to 1 when
`norm_topk_prob`. Each expert is a `GatedMLP` over radixlm's linear layers, so
it takes every weight format they do (float32, bf16, bf16_weights, int8, and
what model loading packs) and is prepared at load like any other linear.

The step groups its rows by expert: each selected expert runs once, on all the
rows routed to it (one matmul for many rows), and an expert no row selected
is never read, so a one-token decode reads k experts' weights, not all of
them. The outputs are summed per token in ascending expert order (transformers'
order, so float32 results match it). With tensor parallelism each rank holds
its slice of every expert's intermediate features; the partial sums of all
experts are all-reduced once.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.distributed.parallel_state import tp_rank_size
from radixlm.layers.linear import ColumnParallelLinear
from radixlm.models.decoder import GatedMLP


class SparseMoeBlock(nn.Module):
    """Hugging Face names: `gate` (the router, [E, hidden]) and `experts.{e}.*_proj`."""

    def __init__(self, config: Any, dtype: torch.dtype, activation: str = "silu") -> None:
        super().__init__()
        self.num_experts = int(config.num_experts)
        self.top_k = int(config.num_experts_per_tok)
        self.norm_topk_prob = bool(getattr(config, "norm_topk_prob", False))
        self.tp_size = tp_rank_size()[1]
        # The router is replicated: every rank routes every token the same way.
        self.gate = ColumnParallelLinear(config.hidden_size, self.num_experts, bias=False,
                                         params_dtype=dtype)
        self.experts = nn.ModuleList(
            GatedMLP(config.hidden_size, config.moe_intermediate_size, dtype, activation,
                     reduce_results=False)
            for _ in range(self.num_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [T, hidden] → (weights [T, k] in x's dtype, expert ids [T, k] int64)."""
        logits = self.gate(x)  # [T, E]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # [T, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # [T, k] each
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, experts = self.route(x)  # [T, k] each
        out = torch.zeros_like(x)  # [T, hidden]
        flat = experts.reshape(-1)  # [T * k]
        order = torch.argsort(flat, stable=True)  # [T * k], grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // self.top_k  # [T * k] the token of each routed row
        flat_weights = weights.reshape(-1)  # [T * k]
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue  # never read: its weights stay where they are
            picked = order[start : start + n]  # [n] rows of (token, slot) routed to e
            rows = tokens[start : start + n]  # [n] token rows
            y = self.experts[e](x.index_select(0, rows))  # [n, hidden]
            out.index_add_(0, rows, y * flat_weights[picked][:, None])
            start += n
        if self.tp_size > 1:
            torch.distributed.all_reduce(out)
        return out
