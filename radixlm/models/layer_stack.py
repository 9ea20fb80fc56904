"""A decoder's layers in one C++ call on the CPU: their layer programs
(models/layer_program.py) run by csrc/layer_program.cpp.

With every linear layer prepared for a C++ kernel and the step's attention all
in the CPU paged kernel, the Python loop over layers only strings kernels
together, and does so slowly: ~150 us a layer of module calls and operator
dispatch, ~5 ms of a 17 ms one-request bf16 decode step at 30 layers.
`LayerStack.run` hands the whole loop to the C++ interpreter of the same
programs, which calls the same kernels and operators in the same order on the
same arguments: the result is the Python loop's, bit for bit, in bf16, in
float32 over bf16 weights and in the exact float32 mode alike.

A model takes this path when `refusal` finds nothing in the way (every
instruction of every layer runs in C++: weights prepared with a
`PreparedWeight.cpp_kind`, attention options the paged kernel has, one
tensor-parallel rank; norms in one dtype, bf16 or float32, on the CPU; one
setting of the fused float32 kernels) and a step when `LayerStack.run` does
(no module hooks, attention metadata covering every row in the kernel, the pool
and rotary tables in the model's dtype); anything else runs the Python loop,
and `fast_path_report` says why in the start-up log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.nn.modules import module as module_state

from radixlm.layers.cpu_attention import CpuPagedAttnBackend, CpuPagedMetadata
from radixlm.layers.cpu_kernels import load_cpu_kernels, use_fused_cpu_kernel
from radixlm.models.layer_program import AddNorm, Linear, ProgramEncoder

if TYPE_CHECKING:
    from radixlm.model_executor.forward_batch import ForwardBatch
    from radixlm.models.layer_program import LayerProgram, Rope


def _hooked(hook_dicts: list[dict[Any, Any]]) -> bool:
    """Whether a forward hook would see the layers run (the C++ loop calls none):
    hook_dicts, the layers' modules' hook dicts (register_forward_hook adds to them)."""
    return bool(module_state._global_forward_hooks or module_state._global_forward_pre_hooks
                or any(hook_dicts))


def _programs(model: Any) -> list[LayerProgram]:
    return [layer.program for layer in model.layers]


def _key(model: Any) -> object:
    """Identifies the prepared weights a stack was built from (a reload prepares new ones):
    the first linear layer's."""
    first = next((i for i in _programs(model)[0].instrs if isinstance(i, Linear)), None)
    return None if first is None else getattr(first.linear, "prepared", None)


def _dtype(program: LayerProgram) -> torch.dtype | None:
    norm = next((i.norm for i in program.instrs if isinstance(i, AddNorm)), None)
    return None if norm is None else norm.weight.dtype


class LayerStack:
    """A model's layer programs as the C++ loop takes them (see the module docstring)."""

    def __init__(self, model: Any) -> None:  # a DecoderModel (refusal(model) is None)
        programs = _programs(model)
        dtype = _dtype(programs[0])
        assert dtype is not None
        self.dtype = dtype
        self.hook_dicts = [d for layer in model.layers for m in layer.modules()
                           for d in (m._forward_hooks, m._forward_pre_hooks)]
        # The fused elementwise kernels where the Python layers take them (bf16, and
        # float32 in the bf16_weights mode): refusal checked that every module agrees.
        self.fused = use_fused_cpu_kernel(torch.empty(0, dtype=dtype), _fuse_float32(model))
        enc = ProgramEncoder(dtype)
        for program in programs:
            program.encode(enc)
        # (code, floats and kinds as tensors: lists of thousands of numbers would be
        # converted at every call)
        self.code = torch.tensor(enc.code, dtype=torch.int64)
        self.floats = torch.tensor(enc.floats, dtype=torch.float64)
        self.kinds = torch.tensor(enc.kinds, dtype=torch.int64)
        self.num_regs, self.tensors, self.biases = enc.num_regs, enc.tensors, enc.biases
        self.rope_tables = enc.rope_tables

    def run(self, hidden: torch.Tensor, ropes: dict[str, Rope],
            forward_batch: ForwardBatch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(hidden, residual) after the last layer, or None where this step needs the
        Python loop. ropes: (cos, sin) per rotary table."""
        md = forward_batch.attn_metadata
        pool = forward_batch.token_to_kv_pool
        tables = [t for name in self.rope_tables for t in ropes[name]]
        if (not isinstance(forward_batch.attn_backend, CpuPagedAttnBackend)
                or not isinstance(md, CpuPagedMetadata) or md.kernel_args is None
                or not md.covers_all_rows or pool.dtype != self.dtype
                or hidden.dtype != self.dtype or hidden.dim() != 2 or hidden.shape[0] == 0
                or any(t.dtype != self.dtype for t in tables) or _hooked(self.hook_dicts)):
            return None
        attn_step = [forward_batch.out_cache_loc, forward_batch.req_to_token, *md.kernel_args]
        return torch.ops.radixlm.layer_program(
            hidden, tables, self.code, self.num_regs, self.floats, self.tensors, self.kinds,
            self.biases, pool.k_buffers, pool.v_buffers, attn_step, self.fused)


def stack_for(model: Any) -> LayerStack | None:
    """The model's LayerStack (built once per set of prepared weights), or None where its
    layers must run in Python."""
    if not model.layers or load_cpu_kernels() is None:
        return None
    key = _key(model)
    cached: tuple[object, LayerStack | None] | None = getattr(model, "_layer_stack", None)
    if cached is None or cached[0] is not key:
        cached = (key, LayerStack(model) if refusal(model) is None else None)
        model._layer_stack = cached
    return cached[1]


def _fuse_float32(model: Any) -> bool:
    return bool(getattr(model.layers[0].input_layernorm, "fuse_float32", False))


def _layer_ranges(ids: list[int]) -> str:
    """[0, 1, 2, 4] → "layers 0-2, 4"."""
    spans: list[list[int]] = []
    for i in sorted(ids):
        if spans and spans[-1][1] == i - 1:
            spans[-1][1] = i
        else:
            spans.append([i, i])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return ("layer " if len(ids) == 1 else "layers ") + text


def refusal(model: Any) -> str | None:
    """Why the C++ loop cannot run this decoder's layers (None: it can): what its
    instructions lack, by layer, or the dtype and fused-kernel setting of its norms."""
    programs = _programs(model)
    by_reason: dict[str, list[int]] = {}
    for layer_id, program in enumerate(programs):
        for why in program.refusals():
            by_reason.setdefault(why, [])
            if layer_id not in by_reason[why]:
                by_reason[why].append(layer_id)
    if by_reason:
        return "; ".join(f"{why} ({_layer_ranges(ids)})" for why, ids in by_reason.items())
    modules = [m for p in programs for m in p.modules()]
    norms = [m.weight for m in modules if hasattr(m, "eps")]
    dtype = _dtype(programs[0])
    if dtype not in (torch.bfloat16, torch.float32) or any(w.dtype != dtype for w in norms):
        return "norms not all in bf16 or all in float32"
    if len({bool(m.fuse_float32) for m in modules if hasattr(m, "fuse_float32")}) > 1:
        return "fused float32 kernels in some layers only"
    return None


def fast_path_report(model: Any) -> str | None:
    """A start-up line on which path the decoder layers take (None: the model has no
    layer programs, e.g. an encoder)."""
    decoder = getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if decoder is None or not layers or not hasattr(layers[0], "program"):
        language_model = getattr(model, "language_model", None)
        return fast_path_report(language_model) if language_model is not None else None
    name = type(model).__name__
    if load_cpu_kernels() is None:
        return f"{name}: the Python layer loop (no CPU kernels)"
    why = refusal(decoder)
    if why is None:
        return f"{name}: the C++ layer stack (one call for all {len(layers)} layers)"
    return f"{name}: the Python layer loop, not the C++ stack: {why}"
