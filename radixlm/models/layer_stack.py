"""Llama-family decoder layers in one C++ call (csrc/layer_stack.cpp) for bf16 steps.

With every linear layer on the bf16 pairs kernel and the step's attention all in
the CPU paged kernel, the Python loop over layers only strings kernels together,
and does so slowly: ~150 us a layer of module calls and operator dispatch, ~5 ms
of a 20 ms one-request decode step at 30 layers. `LayerStack.run` hands the whole
loop to C++, which calls the same kernels in the same order on the same
arguments: the result is the Python loop's, bit for bit.

A model takes this path when `stack_for` finds it eligible (bf16 on the CPU, one
tensor-parallel rank, every projection packed for the pairs kernel, no module
hooks) and a step when `LayerStack.run` does (its attention metadata covers every
row in the kernel, the pool in bf16); anything else runs the Python loop.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from radixlm.layers.cpu_attention import CpuPagedAttnBackend, CpuPagedMetadata
from radixlm.layers.cpu_kernels import load_cpu_kernels

if TYPE_CHECKING:
    from torch import nn

    from radixlm.model_executor.forward_batch import ForwardBatch


def _hooked(modules: list[nn.Module]) -> bool:
    """Whether a forward hook would see these modules run (the C++ loop calls none)."""
    from torch.nn.modules import module as module_state

    return bool(module_state._global_forward_hooks or module_state._global_forward_pre_hooks
                or any(m._forward_hooks or m._forward_pre_hooks for m in modules))


class LayerStack:
    """A model's layer weights as the C++ loop takes them (see the module docstring)."""

    def __init__(self, layers: nn.ModuleList) -> None:
        first = layers[0].self_attn
        self.key = id(first.qkv_proj._pairs)  # the packed weights this stack was built from
        self.modules = [m for layer in layers for m in layer.modules()]
        self.num_heads, self.num_kv_heads = first.num_heads, first.num_kv_heads
        self.head_dim = first.head_dim
        self.eps = float(layers[0].input_layernorm.eps)
        self.norms: list[torch.Tensor] = []
        self.packed: list[torch.Tensor] = []
        self.biases: list[torch.Tensor | None] = []
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.norms += [layer.input_layernorm.weight.data, layer.post_attention_layernorm.weight.data]
            for proj in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
                self.packed.append(proj._pairs)
                bias = proj.bias
                self.biases.append(None if bias is None else bias.data.to(torch.bfloat16))

    def run(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(hidden, residual) after the last layer, or None where this step needs the
        Python loop."""
        md = forward_batch.attn_metadata
        pool = forward_batch.token_to_kv_pool
        if (not isinstance(forward_batch.attn_backend, CpuPagedAttnBackend)
                or not isinstance(md, CpuPagedMetadata) or md.kernel_args is None
                or not md.covers_all_rows or pool.dtype != torch.bfloat16
                or hidden.dtype != torch.bfloat16 or hidden.dim() != 2 or hidden.shape[0] == 0
                or cos.dtype != torch.bfloat16 or _hooked(self.modules)):
            return None
        rows, seq_lens, q_starts, q_lens = md.kernel_args
        return torch.ops.radixlm.llama_layer_stack(
            hidden.contiguous(), None, cos, sin, self.norms, self.packed, self.biases,
            pool.k_buffers, pool.v_buffers, forward_batch.out_cache_loc,
            forward_batch.req_to_token, rows, seq_lens, q_starts, q_lens, self.num_heads,
            self.num_kv_heads, self.head_dim, self.eps, self.head_dim**-0.5)


def stack_for(model: Any) -> LayerStack | None:
    """The model's LayerStack (built once per set of packed weights), or None where its
    layers must run in Python."""
    layers = model.layers
    if not layers or load_cpu_kernels() is None:
        return None
    first = layers[0].self_attn
    cached: LayerStack | None = getattr(model, "_layer_stack", None)
    if cached is not None and cached.key == id(first.qkv_proj._pairs):
        return cached
    projections = [p for layer in layers for p in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                  layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    norms = [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    if (any(p._pairs is None or p.tp_size != 1 for p in projections)
            or any(n.weight.dtype != torch.bfloat16 or n.weight.device.type != "cpu" for n in norms)
            or len({n.eps for n in norms}) != 1):
        return None
    model._layer_stack = LayerStack(layers)
    return model._layer_stack
