"""A sparse mixture-of-experts MLP (Qwen3-MoE): top-k routing over gated experts.

Routing is transformers': softmax over the router's logits in float32, the top
k experts per token, their probabilities renormalized to sum to 1 when
`norm_topk_prob`. Each expert is a `GatedMLP` over radixlm's linear layers, so
it takes every weight format they do (float32, bf16, bf16_weights, int8, and
what model loading packs) and is prepared at load like any other linear.

The step groups its rows by expert: each selected expert runs once, on all the
rows routed to it (one matmul for many rows), and an expert no row selected
is never read, so a one-token decode reads k experts' weights, not all of
them. The weighted outputs are summed per token in float32, in ascending expert
order (transformers' order, so float32 results match it), and cast to the
activations' dtype once. With tensor parallelism each rank holds
its slice of every expert's intermediate features; the partial sums of all
experts are all-reduced once.

On the CPU, with every expert's weights prepared in a form the C++ kernels run
(`PreparedWeight.cpp_kind`: bf16 pairs, oneDNN-packed, GGUF blocks), the
routing and the experts run in one C++ call (csrc/moe.cpp, `moe_experts`),
which the C++ layer program calls too (the `Moe` instruction); elsewhere the
torch loop below does the same.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from radixlm.distributed.parallel_state import tp_rank_size
from radixlm.layers.cpu_kernels import load_cpu_kernels, use_fused_cpu_kernel
from radixlm.layers.linear import ColumnParallelLinear
from radixlm.models.decoder import GatedMLP
from radixlm.models.layer_program import ACTIVATIONS, ProgramBuilder, linear_refusal


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

    def program(self, b: ProgramBuilder, x: int, out: int | None = None) -> int:
        """This block as one layer-program instruction, x → the output register."""
        return b.moe(x, self, out)

    def cpp_refusal(self) -> str | None:
        """Why the C++ kernel cannot run this block (None: it can). A tensor-parallel
        shard it can: the partial sums are all-reduced after it."""
        act = type(self.experts[0].act_fn)
        if act not in ACTIVATIONS:
            return f"experts with the activation {act.__name__}"
        for linear in [self.gate, *(getattr(e, p) for e in self.experts
                                    for p in ("gate_up_proj", "down_proj"))]:
            if linear.bias is not None:
                return "experts with biases"
            if (why := linear_refusal(linear, tensor_parallel=True)) is not None:
                return f"a mixture of experts with {why}"
        return None

    def _kernel_args(self) -> tuple[list[torch.Tensor], list[torch.Tensor], list[int],
                                    list[int]] | None:
        """The experts' weights and kinds as `moe_experts` takes them, or None where the
        kernel cannot run them (checked once per set of prepared weights)."""
        experts: list[Any] = list(self.experts)
        key = experts[0].gate_up_proj.prepared
        cached = getattr(self, "_kernel_cache", None)
        if cached is None or cached[0] is not key:
            args = None
            if self.cpp_refusal() is None:
                gate_up = [e.gate_up_proj.prepared for e in experts]
                down = [e.down_proj.prepared for e in experts]
                args = ([p.cpp_tensor for p in gate_up], [p.cpp_tensor for p in down],
                        [p.cpp_kind for p in gate_up], [p.cpp_kind for p in down])
            cached = (key, args)
            self._kernel_cache = cached
        args_: tuple[list[torch.Tensor], list[torch.Tensor], list[int], list[int]] | None
        args_ = cached[1]
        return args_

    def route(self, logits: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [T, E] → (weights [T, k] in `dtype`, expert ids [T, k] int64)."""
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # [T, E]
        weights, experts = torch.topk(probs, self.top_k, dim=-1)  # [T, k] each
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(dtype), experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.gate(x)  # [T, E]
        args = (self._kernel_args() if x.device.type == "cpu" and x.dim() == 2
                and load_cpu_kernels() is not None else None)
        if args is not None:
            gate_up, down, gate_up_kinds, down_kinds = args
            act: Any = self.experts[0].act_fn
            out = torch.ops.radixlm.moe_experts(
                x, logits, self.top_k, self.norm_topk_prob, gate_up, down, gate_up_kinds,
                down_kinds, ACTIVATIONS[type(act)],
                use_fused_cpu_kernel(x, getattr(act, "fuse_float32", False)))  # [T, hidden]
        else:
            out = self._experts_loop(x, logits)
        if self.tp_size > 1:
            torch.distributed.all_reduce(out)
        return out

    def _experts_loop(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """The experts in torch: what csrc/moe.cpp does, on any device and weight."""
        weights, experts = self.route(logits, x.dtype)  # [T, k] each
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)  # [T, hidden]
        flat = experts.reshape(-1)  # [T * k]
        order = torch.argsort(flat, stable=True)  # [T * k], grouped by expert
        counts = torch.bincount(flat, minlength=self.num_experts).tolist()
        tokens = order // self.top_k  # [T * k] the token of each routed row
        flat_weights = weights.reshape(-1).float()  # [T * k]
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue  # never read: its weights stay where they are
            picked = order[start : start + n]  # [n] rows of (token, slot) routed to e
            rows = tokens[start : start + n]  # [n] token rows
            y = self.experts[e](x.index_select(0, rows))  # [n, hidden]
            out.index_add_(0, rows, y.float() * flat_weights[picked][:, None])
            start += n
        return out.to(x.dtype)
