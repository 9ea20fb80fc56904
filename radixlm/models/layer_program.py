"""A decoder layer as a program of kernel calls: the one definition both loops run.

A family declares each layer as a short program over numbered registers
(models/decoder.py builds the shared layouts from a family's DecoderArch and
LayerSpec; a family with another layout writes its own builder with
`ProgramBuilder`). Register 0 holds the hidden state and register 1 the
residual stream, carried from layer to layer (the residual is None before the
first layer's input norm); the others are the layer's temporaries.

Two interpreters run the same program:

- `LayerProgram.run`, in Python: each instruction calls its module (a norm, a
  linear layer, an activation, a MoE block) or the attention backend, so every
  device, weight format and tensor-parallel reduction works, and the hooks of
  those modules and of the layer fire (containers such as `self_attn` and `mlp`
  hold weights but are not called);
- csrc/layer_program.cpp, all layers in one C++ call on the CPU
  (models/layer_stack.py encodes the programs with `Instr.encode`): each
  instruction calls the kernel or the torch operators its Python twin calls in
  the same case, in the same order, so its results equal the Python loop's bit
  for bit.

So a family is written once, and adding one needs C++ only for a new kernel (a
new instruction, in both interpreters). An instruction the C++ loop cannot run
(a weight format without a C++ kernel, attention options the paged kernel
lacks, tensor parallelism) says why (`Instr.refusal`), and the model's layers
then run in Python, as the start-up log says (layer_stack.fast_path_report).

Instructions (the C++ opcodes of csrc/layer_program.cpp):
  Norm       out = rms_norm(x)              over the last dim: rows, or each head
  AddNorm    out, res = norm(x + res), x + res  (res None: res = x, out = norm(x))
  Linear     out = x W^T + b                a PreparedWeight (any format)
  Columns    out = x[:, a:a+n] as [T, -1, head_dim]  (a view)
  Heads      out = x[:, a:a+n] of [T, heads, D]      (a view)
  Rope       out = x rotated by a rotary table (partial rotary included)
  Attention  out = attention(q, k, v) of one layer, K/V stored; scale, window, softcap
  GatedAct   out = act(x[:, :d]) * x[:, d:]  (silu, gelu_tanh)
  Moe        out = a top-k mixture of gated experts (router included)
  Add        out = a + b
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
from torch import nn

from radixlm.layers.activation import GeluTanhAndMul, SiluAndMul
from radixlm.layers.attention import AttnOptions
from radixlm.layers.layernorm import RMSNorm
from radixlm.layers.prepared_weight import CPP_ONEDNN
from radixlm.layers.rotary import apply_rotary

if TYPE_CHECKING:
    from radixlm.model_executor.forward_batch import ForwardBatch

HIDDEN, RESIDUAL = 0, 1
WIDTH = 12  # int64s per encoded instruction: opcode, 2 outputs, 3 inputs, 6 parameters
NONE = -1  # an absent parameter (no window, no softcap)


class Opcode(IntEnum):
    NORM = 0
    ADD_NORM = 1
    LINEAR = 2
    COLUMNS = 3
    HEADS = 4
    ROPE = 5
    ATTENTION = 6
    GATED_ACT = 7
    MOE = 8
    ADD = 9
    END_LAYER = 10


# The activations the C++ loop runs (csrc/layer_ops.h), by module type.
ACTIVATIONS: dict[type[nn.Module], int] = {SiluAndMul: 0, GeluTanhAndMul: 1}

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each [T, 1, rotary_dim / 2]


class StepContext(NamedTuple):
    """What every layer of one forward shares."""

    ropes: dict[str, Rope]  # by rotary table name
    forward_batch: ForwardBatch


class ProgramEncoder:
    """Collects the C++ loop's arguments while instructions encode themselves: the
    tensors (norm weights, prepared weights with their kind and bias), the floats and
    the rotary tables, each referred to by index."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype  # the activations'
        self.code: list[int] = []
        self.floats: list[float] = []
        self.tensors: list[torch.Tensor] = []
        self.kinds: list[int] = []
        self.biases: list[torch.Tensor | None] = []
        self.rope_tables: list[str] = []
        self.num_regs = 2

    def emit(self, op: Opcode, outs: Sequence[int] = (), ins: Sequence[int] = (),
             params: Sequence[int] = ()) -> None:
        assert len(outs) <= 2 and len(ins) <= 3 and len(params) <= 6
        regs = [*outs, *ins]
        self.num_regs = max([self.num_regs, *(r + 1 for r in regs)])
        self.code += [int(op), *_pad(outs, 2), *_pad(ins, 3), *_pad(params, 6)]

    def float(self, value: float) -> int:
        self.floats.append(float(value))
        return len(self.floats) - 1

    def tensor(self, t: torch.Tensor) -> int:
        self.tensors.append(t)
        self.kinds.append(NONE)
        self.biases.append(None)
        return len(self.tensors) - 1

    def linear(self, module: Any) -> int:
        """A linear layer's prepared weight (its kernel's kind) and bias, by index."""
        prepared = module.prepared
        bias = None if module.bias is None else module.bias.data
        # as the Python kernels take it: in the activations' dtype for the pairs kernels
        # (bf16, or float32 over bf16 weights), as loaded for oneDNN
        if bias is not None and prepared.cpp_kind != CPP_ONEDNN:
            bias = bias.to(self.dtype)
        index = self.tensor(prepared.cpp_tensor)
        self.kinds[index], self.biases[index] = prepared.cpp_kind, bias
        return index

    def rope(self, table: str) -> int:
        if table not in self.rope_tables:
            self.rope_tables.append(table)
        return self.rope_tables.index(table)


def _pad(values: Sequence[int], n: int) -> list[int]:
    return [int(v) for v in values] + [NONE] * (n - len(values))


class Instr(ABC):
    """One kernel call: `run` in Python, `encode` for the C++ loop, `refusal` when the
    C++ loop cannot run it."""

    @abstractmethod
    def run(self, regs: list[Any], ctx: StepContext) -> None:
        """Read this instruction's input registers, write its outputs."""

    @abstractmethod
    def encode(self, enc: ProgramEncoder) -> None:
        """Append this instruction to `enc` (one WIDTH-long record)."""

    def refusal(self) -> str | None:
        """Why the C++ loop cannot run this instruction (None: it can)."""
        return None

    def modules(self) -> list[nn.Module]:
        """The modules this instruction calls (their hooks, their fuse flags)."""
        return []


def _norm_refusal(norm: RMSNorm) -> str | None:
    if norm.weight.device.type != "cpu":
        return "norms off the CPU"
    return None


def linear_refusal(module: Any, tensor_parallel: bool = False) -> str | None:
    """Why the C++ kernels cannot run this linear layer (None: they can); tensor_parallel:
    whether a tensor-parallel shard is fine (its caller reduces)."""
    if getattr(module, "tp_size", 1) != 1 and not tensor_parallel:
        return "tensor parallelism"
    prepared = module.prepared
    if prepared is None:
        return "weights not prepared (dense)"
    if prepared.cpp_kind is None:
        return f"{prepared.describe()} weights"
    return None


@dataclass(eq=False)
class Norm(Instr):
    out: int
    x: int
    norm: RMSNorm

    def run(self, regs: list[Any], ctx: StepContext) -> None:
        regs[self.out] = self.norm(regs[self.x])

    def encode(self, enc: ProgramEncoder) -> None:
        enc.emit(Opcode.NORM, [self.out], [self.x],
                 [enc.tensor(self.norm.weight.data), enc.float(self.norm.eps)])

    def refusal(self) -> str | None:
        return _norm_refusal(self.norm)

    def modules(self) -> list[nn.Module]:
        return [self.norm]


@dataclass(eq=False)
class AddNorm(Instr):
    out: int
    x: int
    norm: RMSNorm
    residual: int = RESIDUAL

    def run(self, regs: list[Any], ctx: StepContext) -> None:
        x, residual = regs[self.x], regs[self.residual]
        if residual is None:  # the first layer's input norm starts the residual stream
            regs[self.residual] = x
            regs[self.out] = self.norm(x)
        else:
            regs[self.out], regs[self.residual] = self.norm.add_and_norm(x, residual)

    def encode(self, enc: ProgramEncoder) -> None:
        enc.emit(Opcode.ADD_NORM, [self.out, self.residual], [self.x],
                 [enc.tensor(self.norm.weight.data), enc.float(self.norm.eps)])

    def refusal(self) -> str | None:
        return _norm_refusal(self.norm)

    def modules(self) -> list[nn.Module]:
        return [self.norm]


@dataclass(eq=False)
class Linear(Instr):
    out: int
    x: int
    linear: nn.Module  # a layers/linear.py layer

    def run(self, regs: list[Any], ctx: StepContext) -> None:
        regs[self.out] = self.linear(regs[self.x])

    def encode(self, enc: ProgramEncoder) -> None:
        enc.emit(Opcode.LINEAR, [self.out], [self.x], [enc.linear(self.linear)])

    def refusal(self) -> str | None:
        return linear_refusal(self.linear)

    def modules(self) -> list[nn.Module]:
        return [self.linear]


@dataclass(eq=False)
class Columns(Instr):
    """x [T, N] → x[:, start : start + size] viewed as [T, -1, head_dim] (a view)."""

    out: int
    x: int
    start: int
    size: int
    head_dim: int

    def run(self, regs: list[Any], ctx: StepContext) -> None:
        x = regs[self.x]
        regs[self.out] = x[:, self.start : self.start + self.size].view(x.shape[0], -1,
                                                                        self.head_dim)

    def encode(self, enc: ProgramEncoder) -> None:
        enc.emit(Opcode.COLUMNS, [self.out], [self.x], [self.start, self.size, self.head_dim])


@dataclass(eq=False)
class Heads(Instr):
    """x [T, n, D] → x[:, start : start + num] (a view)."""

    out: int
    x: int
    start: int
    num: int

    def run(self, regs: list[Any], ctx: StepContext) -> None:
        regs[self.out] = regs[self.x].narrow(1, self.start, self.num)

    def encode(self, enc: ProgramEncoder) -> None:
        enc.emit(Opcode.HEADS, [self.out], [self.x], [self.start, self.num])


@dataclass(eq=False)
class RopeInstr(Instr):
    """x [T, n, D] rotated by the rotary table `table` (layers/rotary.apply_rotary);
    `owner`'s fuse_float32 (the attention module's) says whether float32 takes the
    fused kernel."""

    out: int
    x: int
    table: str
    owner: nn.Module

    def run(self, regs: list[Any], ctx: StepContext) -> None:
        cos, sin = ctx.ropes[self.table]
        regs[self.out] = apply_rotary(regs[self.x], cos, sin, bool(self.owner.fuse_float32))

    def encode(self, enc: ProgramEncoder) -> None:
        enc.emit(Opcode.ROPE, [self.out], [self.x], [enc.rope(self.table)])

    def modules(self) -> list[nn.Module]:
        return [self.owner]


def paged_kernel_refusal(options: AttnOptions) -> str | None:
    """What the CPU paged attention kernel lacks for `options` (None: it runs them)."""
    if options.logit_softcap is not None:
        return "attention logit softcapping (not in the paged kernel yet)"
    return None


@dataclass(eq=False)
class Attention(Instr):
    """Layer `layer_id`'s attention: K and V into the pool, q over each request's keys,
    as `options` say; [T, H * D]."""

    out: int
    q: int
    k: int
    v: int
    layer_id: int
    options: AttnOptions
    head_dim: int

    def run(self, regs: list[Any], ctx: StepContext) -> None:
        fb = ctx.forward_batch
        backend = fb.attn_backend
        assert backend is not None, "ForwardBatch.attn_backend is not set"
        regs[self.out] = backend.forward(regs[self.q], regs[self.k], regs[self.v], self.layer_id,
                                         fb, self.options)

    def encode(self, enc: ProgramEncoder) -> None:
        o = self.options
        window = o.sliding_window or NONE  # (0 is none, as in CpuPagedAttnBackend)
        softcap = NONE if o.logit_softcap is None else enc.float(o.logit_softcap)
        enc.emit(Opcode.ATTENTION, [self.out], [self.q, self.k, self.v],
                 [self.layer_id, enc.float(o.scale_for(self.head_dim)), window, softcap])

    def refusal(self) -> str | None:
        return paged_kernel_refusal(self.options)


@dataclass(eq=False)
class GatedAct(Instr):
    out: int
    x: int
    act: nn.Module  # SiluAndMul or GeluTanhAndMul

    def run(self, regs: list[Any], ctx: StepContext) -> None:
        regs[self.out] = self.act(regs[self.x])

    def encode(self, enc: ProgramEncoder) -> None:
        enc.emit(Opcode.GATED_ACT, [self.out], [self.x], [ACTIVATIONS[type(self.act)]])

    def refusal(self) -> str | None:
        return None if type(self.act) in ACTIVATIONS else f"the activation {type(self.act).__name__}"

    def modules(self) -> list[nn.Module]:
        return [self.act]


@dataclass(eq=False)
class Moe(Instr):
    """A sparse mixture of experts (models/moe.py's SparseMoeBlock), router included."""

    out: int
    x: int
    moe: nn.Module

    def run(self, regs: list[Any], ctx: StepContext) -> None:
        regs[self.out] = self.moe(regs[self.x])

    def encode(self, enc: ProgramEncoder) -> None:
        moe: Any = self.moe
        router = enc.linear(moe.gate)
        experts = list(moe.experts)
        first = len(enc.tensors)
        for proj in ("gate_up_proj", "down_proj"):
            for expert in experts:
                enc.linear(getattr(expert, proj))
        enc.emit(Opcode.MOE, [self.out], [self.x],
                 [router, first, len(experts), moe.top_k, int(moe.norm_topk_prob),
                  ACTIVATIONS[type(experts[0].act_fn)]])

    def refusal(self) -> str | None:
        if getattr(self.moe, "tp_size", 1) != 1:
            return "tensor parallelism"
        why: str | None = self.moe.cpp_refusal()  # type: ignore[operator]
        return why

    def modules(self) -> list[nn.Module]:
        return list(self.moe.modules())


@dataclass(eq=False)
class Add(Instr):
    out: int
    a: int
    b: int

    def run(self, regs: list[Any], ctx: StepContext) -> None:
        regs[self.out] = regs[self.a] + regs[self.b]

    def encode(self, enc: ProgramEncoder) -> None:
        enc.emit(Opcode.ADD, [self.out], [self.a, self.b])


class LayerProgram:
    """One layer's instructions and how many registers they use."""

    def __init__(self, instrs: list[Instr], num_regs: int) -> None:
        self.instrs = instrs
        self.num_regs = num_regs

    def run(self, hidden: torch.Tensor, residual: torch.Tensor | None,
            ctx: StepContext) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) → (hidden, residual) after this layer: the Python loop."""
        regs: list[Any] = [None] * self.num_regs
        regs[HIDDEN], regs[RESIDUAL] = hidden, residual
        for instr in self.instrs:
            instr.run(regs, ctx)
        return regs[HIDDEN], regs[RESIDUAL]

    def encode(self, enc: ProgramEncoder) -> None:
        for instr in self.instrs:
            instr.encode(enc)
        enc.emit(Opcode.END_LAYER)

    def refusals(self) -> list[str]:
        return [why for instr in self.instrs if (why := instr.refusal()) is not None]

    def modules(self) -> list[nn.Module]:
        return [m for instr in self.instrs for m in instr.modules()]


class ProgramBuilder:
    """Writes a layer's program: each method appends one instruction and returns its
    output register (a new one unless `out` is given)."""

    def __init__(self) -> None:
        self.instrs: list[Instr] = []
        self.num_regs = 2  # HIDDEN, RESIDUAL

    def _out(self, out: int | None) -> int:
        if out is None:
            out = self.num_regs
        self.num_regs = max(self.num_regs, out + 1)
        return out

    def norm(self, x: int, norm: RMSNorm, out: int | None = None) -> int:
        self.instrs.append(Norm(out := self._out(out), x, norm))
        return out

    def add_norm(self, x: int, norm: RMSNorm, out: int | None = None) -> int:
        self.instrs.append(AddNorm(out := self._out(out), x, norm))
        return out

    def linear(self, x: int, linear: nn.Module, out: int | None = None) -> int:
        self.instrs.append(Linear(out := self._out(out), x, linear))
        return out

    def columns(self, x: int, start: int, size: int, head_dim: int) -> int:
        self.instrs.append(Columns(out := self._out(None), x, start, size, head_dim))
        return out

    def heads(self, x: int, start: int, num: int) -> int:
        self.instrs.append(Heads(out := self._out(None), x, start, num))
        return out

    def rope(self, x: int, table: str, owner: nn.Module) -> int:
        self.instrs.append(RopeInstr(out := self._out(None), x, table, owner))
        return out

    def attention(self, q: int, k: int, v: int, layer_id: int, options: AttnOptions,
                  head_dim: int) -> int:
        self.instrs.append(Attention(out := self._out(None), q, k, v, layer_id, options,
                                     head_dim))
        return out

    def gated_act(self, x: int, act: nn.Module) -> int:
        self.instrs.append(GatedAct(out := self._out(None), x, act))
        return out

    def moe(self, x: int, moe: nn.Module, out: int | None = None) -> int:
        self.instrs.append(Moe(out := self._out(out), x, moe))
        return out

    def add(self, a: int, b: int, out: int | None = None) -> int:
        self.instrs.append(Add(out := self._out(out), a, b))
        return out

    def build(self) -> LayerProgram:
        return LayerProgram(self.instrs, self.num_regs)
