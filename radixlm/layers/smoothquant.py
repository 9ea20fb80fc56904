"""SmoothQuant (Xiao et al., 2023) for W8A8 int8: activation outliers moved into the weights.

With one int8 scale per token, the few input channels that carry activations
far above the rest set every token's scale, and the other channels round to a
handful of levels. SmolLM2-135M, measured over a calibration text: the
down_proj inputs of layers 11 and 28 reach 2,800 and 2,400 against a median
channel of ~1 (layers 2, 9, 10, 27 and 29: 40-100x), and the q/k/v inputs
carry the same few channels (247, 308, 507, 14, 17) at 10-30x the median.

    x W^T = (x diag(s)^-1) (W diag(s))^T

so dividing input channel j by s_j and multiplying the weight's column j by
s_j changes nothing in exact arithmetic while it evens out the ranges int8
sees. s_j = max|x_j|^alpha / max|W[:, j]|^(1 - alpha), max|x_j| from a
calibration pass (radixlm/model_executor/calibration.py). The division costs
nothing at run time: it is folded into whatever produces the input,

- q/k/v and gate/up: the weight of the RMSNorm in front of them (each norm
  feeds only that one projection);
- down_proj: the up_proj rows (SiLU(gate) * up is linear in up);
- the LM head: its input is the final norm's output, which the server can
  also return as hidden states, so the head divides its input at run time
  (one [M, hidden] multiply next to a [hidden, vocab] matmul).

o_proj is not smoothed: its inputs have no outliers worth the GQA-aware fold
into v_proj (quantized alone it costs 1% top-1, below).

Where W8A8 loses accuracy on SmolLM2-135M (teacher-forced over the accuracy
gate's 813 tokens against float32; "w" = int8 weights with float activations,
"a" = float weights with per-token int8 activations; FLOPs = share of one
step's linear-layer multiply-adds):

| int8, the rest float32   | FLOPs | top-1 | KL     | w only        | a only        |
|--------------------------|-------|-------|--------|---------------|---------------|
| everything               | 100%  | 88.7% | 0.0310 | 95.4% / .0037 | 87.9% / .0275 |
| q/k/v (30 layers)        | 12.3% | 93.4% | 0.0105 | 97.9% / .0010 | 93.6% / .0091 |
| o_proj                   | 7.4%  | 99.0% | 0.0003 | 99.5% / .0001 | 99.0% / .0002 |
| gate/up                  | 39.5% | 94.0% | 0.0078 | 98.8% / .0005 | 95.2% / .0071 |
| down_proj                | 19.7% | 95.4% | 0.0070 | 98.8% / .0009 | 95.9% / .0056 |
| LM head                  | 21.1% | 93.6% | 0.0052 | 97.2% / .0011 | 95.4% / .0042 |
| one layer's 4, each      | 2.6%  | 96.1-99.9% | .0003-.0060 |         |               |

(per layer, worst first: 29: 96.1% / 0.0060, 13: 96.9%, 18: 97.3%, 28 and 19:
97.9%; the other 25 layers 98.2-99.9%.) The activations lose most, in every
kind and nearly every layer. Everything in
int8 with SmoothQuant: alpha 0.3 / 0.5 / 0.7 / 0.8 give 93.0 / 93.8 / 92.6 /
91.5% top-1 (KL 0.021 / 0.012 / 0.015 / 0.023). Keeping a named set in float
on top of alpha 0.5 barely moves it: the LM head 94.0%, the two down_projs
with the 2,800-range inputs 93.2%, layers 0-1 93.4%, layers 28-29 94.0%,
all q/k/v 94.3%, all down_proj 93.5%. The massive activations sit on the
first token (the attention sink: 3,065 at layer 11's down_proj input, the
other tokens' max 5.8); leaving it out of the calibration drops alpha 0.5 to
88.7%. So W8A8 stays short of the 95% gate on this model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn

from radixlm.layers.layernorm import RMSNorm
from radixlm.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
    _LinearBase,
)
from radixlm.layers.vocab_embedding import ParallelLMHead

# Migration strength: 0 leaves the activations as they are, 1 moves all of their
# range into the weights. Measured on SmolLM2-135M (see the accuracy gate test).
DEFAULT_ALPHA = 0.5


class SmoothTarget(NamedTuple):
    """A projection whose input can be divided per channel at no run-time cost."""

    name: str
    linear: _LinearBase  # weight [N, K]; its input channels get divided by s [K]
    fold: Callable[[torch.Tensor], None]  # divides the producer of that input by s


def _divide_norm(norm: RMSNorm) -> Callable[[torch.Tensor], None]:
    def fold(s: torch.Tensor) -> None:
        norm.weight.data.div_(s.to(norm.weight.dtype))

    return fold


def _divide_up_rows(gate_up: MergedColumnParallelLinear) -> Callable[[torch.Tensor], None]:
    gate_size, up_size = gate_up.output_sizes

    def fold(s: torch.Tensor) -> None:
        up = gate_up.weight.data.narrow(0, gate_size, up_size)  # [inter, hidden]
        up.div_(s.to(up.dtype)[:, None])
        if gate_up.bias is not None:
            gate_up.bias.data.narrow(0, gate_size, up_size).div_(s.to(up.dtype))

    return fold


def smooth_targets(model: nn.Module) -> list[SmoothTarget]:
    """The smoothable projections of a Llama-family decoder (empty for other models)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    targets: list[SmoothTarget] = []
    for i, layer in enumerate(layers or []):
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        qkv = getattr(attn, "qkv_proj", None)
        gate_up = getattr(mlp, "gate_up_proj", None)
        down = getattr(mlp, "down_proj", None)
        norm1 = getattr(layer, "input_layernorm", None)
        norm2 = getattr(layer, "post_attention_layernorm", None)
        if not (isinstance(qkv, QKVParallelLinear) and isinstance(down, RowParallelLinear)
                and isinstance(gate_up, MergedColumnParallelLinear)
                and len(gate_up.output_sizes) == 2
                and isinstance(norm1, RMSNorm) and isinstance(norm2, RMSNorm)):
            return []
        targets += [
            SmoothTarget(f"layers.{i}.qkv_proj", qkv, _divide_norm(norm1)),
            SmoothTarget(f"layers.{i}.gate_up_proj", gate_up, _divide_norm(norm2)),
            SmoothTarget(f"layers.{i}.down_proj", down, _divide_up_rows(gate_up)),
        ]
    return targets


def lm_head_of(model: nn.Module) -> ParallelLMHead | None:
    head = getattr(model, "lm_head", None)
    return head if isinstance(head, ParallelLMHead) else None


def smoothing_scales(act_absmax: torch.Tensor, weight: torch.Tensor, alpha: float) -> torch.Tensor:
    """s [K] = max|x_j|^alpha / max|W[:, j]|^(1 - alpha), for weight [N, K]."""
    w_absmax = weight.detach().abs().amax(dim=0).float().clamp(min=1e-5)  # [K]
    a = act_absmax.float().clamp(min=1e-5)  # [K]
    return (a.pow(alpha) / w_absmax.pow(1.0 - alpha)).clamp(min=1e-5)


@torch.no_grad()
def apply_smoothing(targets: list[SmoothTarget], act_absmax: dict[str, torch.Tensor],
                    alpha: float = DEFAULT_ALPHA) -> None:
    """Scale each target's weight columns by s and fold 1/s into its input's producer.

    NOTE: all scales are computed before any weight changes (a fold into the up_proj
    rows changes gate_up_proj's weight, itself a target).
    """
    scales = [smoothing_scales(act_absmax[t.name], t.linear.weight, alpha) for t in targets]
    for target, s in zip(targets, scales):
        weight = target.linear.weight.data  # [N, K]
        weight.mul_(s.to(weight.dtype)[None, :])
        target.fold(s)
