"""Llama-family decoder layers in one C++ call (csrc/layer_stack.cpp) on the CPU.

With every linear layer packed (the bf16 pairs kernel or oneDNN) and the step's
attention all in the CPU paged kernel, the Python loop over layers only strings
kernels together, and does so slowly: ~150 us a layer of module calls and
operator dispatch, ~5 ms of a 17 ms one-request bf16 decode step at 30 layers.
`LayerStack.run` hands the whole loop to C++, which calls the same kernels and
operators in the same order on the same arguments: the result is the Python
loop's, bit for bit, in bf16, in float32 over bf16 weights and in the exact float32
mode alike.

A model takes this path when `stack_for` finds it eligible (Llama's layer only:
no q/k norms, sliding windows, NoPE, MoE or Gemma norms; bf16 or float32 on
the CPU, one tensor-parallel rank, every projection prepared in a form the C++
loop runs: `PreparedWeight.cpp_kind`, so not int8, dense or with a small-batch
plain copy) and a step when `LayerStack.run` does (no module hooks,
its attention metadata covers every row in the kernel, the pool in the model's
dtype); anything else runs the Python loop, and `fast_path_report` says why in
the start-up log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.nn.modules import module as module_state

from radixlm.layers.cpu_attention import CpuPagedAttnBackend, CpuPagedMetadata
from radixlm.layers.cpu_kernels import load_cpu_kernels, use_fused_cpu_kernel
from radixlm.layers.prepared_weight import CPP_ONEDNN

if TYPE_CHECKING:
    from radixlm.model_executor.forward_batch import ForwardBatch


def _hooked(hook_dicts: list[dict[Any, Any]]) -> bool:
    """Whether a forward hook would see the layers run (the C++ loop calls none):
    hook_dicts, the layers' modules' hook dicts (register_forward_hook adds to them)."""
    return bool(module_state._global_forward_hooks or module_state._global_forward_pre_hooks
                or any(hook_dicts))


def _key(qkv_proj: Any) -> int:
    """Identifies the prepared weights a stack was built from (a reload prepares new ones)."""
    return id(qkv_proj.prepared)


class LayerStack:
    """A model's layer weights as the C++ loop takes them (see the module docstring)."""

    def __init__(self, layers: Any) -> None:  # DecoderLayer modules (Llama's layer)
        first = layers[0].self_attn
        self.key = _key(first.qkv_proj)  # the packed weights this stack was built from
        self.hook_dicts = [d for layer in layers for m in layer.modules()
                           for d in (m._forward_hooks, m._forward_pre_hooks)]
        self.num_heads, self.num_kv_heads = first.num_heads, first.num_kv_heads
        self.head_dim = first.head_dim
        self.eps = float(layers[0].input_layernorm.eps)
        self.dtype = layers[0].input_layernorm.weight.dtype
        # The fused elementwise kernels where the Python layers take them (bf16, and
        # float32 in the bf16_weights mode).
        norm = layers[0].input_layernorm
        self.fused = use_fused_cpu_kernel(norm.weight, norm.fuse_float32)
        self.norms: list[torch.Tensor] = []
        self.packed: list[torch.Tensor] = []
        self.biases: list[torch.Tensor | None] = []
        # per projection: PreparedWeight.cpp_kind (csrc/prepared_linear.cpp runs it)
        self.kinds: list[int] = []
        for layer in layers:
            attn, mlp = layer.self_attn, layer.mlp
            self.norms += [layer.input_layernorm.weight.data, layer.post_attention_layernorm.weight.data]
            for proj in (attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj):
                prepared = proj.prepared
                self.packed.append(prepared.cpp_tensor)
                self.kinds.append(prepared.cpp_kind)
                bias = None if proj.bias is None else proj.bias.data
                # as the Python kernels take it: in the activations' dtype for the pairs
                # kernels (bf16, or float32 over bf16 weights), as loaded for oneDNN
                if bias is not None and prepared.cpp_kind != CPP_ONEDNN:
                    bias = bias.to(self.dtype)
                self.biases.append(bias)

    def run(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
            forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(hidden, residual) after the last layer, or None where this step needs the
        Python loop."""
        md = forward_batch.attn_metadata
        pool = forward_batch.token_to_kv_pool
        if (not isinstance(forward_batch.attn_backend, CpuPagedAttnBackend)
                or not isinstance(md, CpuPagedMetadata) or md.kernel_args is None
                or not md.covers_all_rows or pool.dtype != self.dtype
                or hidden.dtype != self.dtype or hidden.dim() != 2 or hidden.shape[0] == 0
                or cos.dtype != self.dtype or _hooked(self.hook_dicts)):
            return None
        rows, seq_lens, q_starts, q_lens = md.kernel_args
        return torch.ops.radixlm.llama_layer_stack(
            hidden, cos, sin, self.norms, self.packed, self.biases, self.kinds,
            pool.k_buffers, pool.v_buffers, forward_batch.out_cache_loc,
            forward_batch.req_to_token, rows, seq_lens, q_starts, q_lens, self.num_heads,
            self.num_kv_heads, self.head_dim, self.eps, self.head_dim**-0.5, self.fused)


def stack_for(model: Any) -> LayerStack | None:
    """The model's LayerStack (built once per set of packed weights), or None where its
    layers must run in Python."""
    layers = model.layers
    if not layers or load_cpu_kernels() is None:
        return None
    key = _key(layers[0].self_attn.qkv_proj)
    cached: tuple[int, LayerStack | None] | None = getattr(model, "_layer_stack", None)
    if cached is None or cached[0] != key:
        cached = (key, LayerStack(layers) if refusal(model) is None else None)
        model._layer_stack = cached
    return cached[1]


def refusal(model: Any) -> str | None:
    """Why the C++ stack cannot run this decoder (models/decoder.py's DecoderModel), or
    None where it can. The stack is Llama's layer: any other layer, a second rotary table
    or a partial rotary, more than one rank, or weights that are not packed runs the
    Python loop instead."""
    layers = model.layers
    blockers = sorted({why for layer in layers for why in getattr(layer, "stack_blockers", ())})
    if blockers:
        return "its layers have " + ", ".join(blockers)
    if model.rotary_for_stack() is None:
        return "its rotary embedding is partial or per kind of layer"
    projections = [p for layer in layers for p in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                  layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    norms = [n for layer in layers for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    dtype = norms[0].weight.dtype
    if any(p.tp_size != 1 for p in projections):
        return "it is tensor-parallel"
    if any(p.prepared is None or p.prepared.cpp_kind is None for p in projections):
        return ("not every projection is in a form the C++ loop runs (int8, dense, or kept "
                "plain for small batches)")
    if (dtype not in (torch.bfloat16, torch.float32)
            or any(n.weight.dtype != dtype or n.weight.device.type != "cpu" for n in norms)
            or len({n.eps for n in norms}) != 1):
        return "its norms are not all bf16 or float32 on the CPU with one eps"
    return None


def fast_path_report(model: Any) -> str | None:
    """A start-up line on which path the decoder layers take (None: the model has no
    decoder stack, e.g. an encoder)."""
    decoder = getattr(model, "model", None)
    if decoder is None or not hasattr(decoder, "rotary_for_stack"):
        language_model = getattr(model, "language_model", None)
        return fast_path_report(language_model) if language_model is not None else None
    name = type(model).__name__
    if load_cpu_kernels() is None:
        return f"{name}: the Python layer loop (no CPU kernels)"
    why = refusal(decoder)
    if why is None:
        return f"{name}: the C++ layer stack (one call for all {len(decoder.layers)} layers)"
    return f"{name}: the Python layer loop, not the C++ stack: {why}"
