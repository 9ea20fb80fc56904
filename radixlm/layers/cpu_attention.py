"""The CPU attention backend: paged attention over the pool, read in place.

Every request of a step, decode or prefill chunk, is attended by one call of the
C++ kernel (`radixlm/csrc/attention.cpp`, its work in `attention*_body.h`): it reads
each request's keys and values where they lie in the pool, through its row of the
slot table, instead of gathering copies every layer (the torch-native backend's
decode copies ~600 MB per step at 32 requests of 400 tokens). Up to 16 new rows a request
(decodes, jump-forward runs, a speculative step's 1 + K) are scored row by
row; longer chunks go through the kernel's blocked flash attention (online
softmax over blocks of 64 keys, causal blocks skipped), 2-5x faster here than
torch's CPU flash attention, which in bfloat16 skips no causal block and with
grouped KV heads falls back to its math kernel. Head dims other than 64 and
128 have no blocked kernel: their longer chunks go through `extend_attention`
(flash attention, split at the cached prefix).

Exact against `TorchNativeAttnBackend` up to float summation order. Used by
default on the CPU when the kernels build (`--attention-backend auto`).

The kernel takes a layer's softmax scale and sliding window (it never reads keys
outside a row's window). It has no logit softcap: softcapped layers run through
the torch-native masked path (attention_masked.py), exactly, and the backend says
so at start-up, naming the layers; so do windowed layers in a step with extends
longer than the kernel takes at their head dim (not 64 or 128).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from radixlm.layers.attention import (
    PLAIN_ATTENTION,
    AttentionBackend,
    AttnOptions,
    ExtendReq,
    extend_attention,
    extend_request,
    masked_layers,
    stored_kv,
)
from radixlm.layers.attention_masked import MaskedPlans, masked_attention
from radixlm.layers.cpu_kernels import load_cpu_kernels

if TYPE_CHECKING:
    from radixlm.model_executor.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

# Head dims with the kernel's blocked path: every extend goes through the kernel.
BLOCKED_HEAD_DIMS = (64, 128)
# Other head dims: extends up to this many rows use the kernel (row by row), longer
# ones flash attention.
MAX_KERNEL_ROWS = 16


@dataclass
class CpuPagedMetadata:
    # The kernel's requests: [Bk] int64 each (CPU tensors); None when there are none.
    kernel_args: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None
    covers_all_rows: bool  # the kernel computes every row of the batch
    extends: list[ExtendReq] = field(default_factory=list)
    masked: MaskedPlans | None = None  # for layers with a window or a softcap


class CpuPagedAttnBackend(AttentionBackend):
    """Paged attention through the C++ kernel (see the module docstring)."""

    def __init__(self, model: nn.Module | None = None) -> None:
        super().__init__(model)
        if load_cpu_kernels() is None:  # registers torch.ops.radixlm.*
            raise RuntimeError("the cpu_paged attention backend needs the CPU kernels")
        for what, layer_ids in masked_layers(model).items():
            if "softcap" in what:
                logger.info("Attention: layers %s (%s) run through the torch-native masked "
                            "path: the paged kernel has no logit softcap", _ranges(layer_ids),
                            what)
            else:
                logger.info("Attention: layers %s (%s) run in the paged kernel with their "
                            "window", _ranges(layer_ids), what)

    def init_forward_metadata(self, forward_batch: ForwardBatch) -> None:
        fb = forward_batch
        starts = fb.extend_start_loc
        pool_rows: list[int] = fb.req_pool_indices.tolist()
        max_rows = (None if fb.token_to_kv_pool.head_dim in BLOCKED_HEAD_DIMS
                    else MAX_KERNEL_ROWS)
        kernel_ids = [i for i, n in enumerate(fb.extend_lens)
                      if max_rows is None or n <= max_rows]
        kernel_args = None
        if kernel_ids:
            kernel_args = (
                torch.tensor([pool_rows[i] for i in kernel_ids], dtype=torch.int64),
                torch.tensor([fb.prefix_lens[i] + fb.extend_lens[i] for i in kernel_ids],
                             dtype=torch.int64),
                torch.tensor([starts[i] for i in kernel_ids], dtype=torch.int64),
                torch.tensor([fb.extend_lens[i] for i in kernel_ids], dtype=torch.int64),
            )
        extends = [
            extend_request(fb, i, pool_rows[i], starts[i])
            for i, n in enumerate(fb.extend_lens)
            if max_rows is not None and n > max_rows
        ]
        fb.attn_metadata = CpuPagedMetadata(kernel_args, not extends, extends, MaskedPlans(fb))

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        layer_id: int,
        forward_batch: ForwardBatch,
        options: AttnOptions = PLAIN_ATTENTION,
    ) -> torch.Tensor:
        md: CpuPagedMetadata = forward_batch.attn_metadata
        # k_buf, v_buf [slots, Hkv, row]; k and v are read only by extends outside the kernel
        k, v, k_buf, v_buf = stored_kv(forward_batch, layer_id, k, v, read_back=bool(md.extends))
        num_tokens, num_heads, head_dim = q.shape
        scale = head_dim**-0.5 if options.scale is None else options.scale
        window = 0
        if options is not PLAIN_ATTENTION and options.needs_mask:
            if not in_kernel(options) or md.extends:  # a softcap, or extends outside it
                plans = md.masked if md.masked is not None else MaskedPlans(forward_batch)
                out = masked_attention(q, k_buf, v_buf, plans.get(options.sliding_window),
                                       scale, options.logit_softcap)
                return out.view(num_tokens, -1)
            window = options.sliding_window or 0
        if md.kernel_args is not None:
            rows, seq_lens, q_starts, q_lens = md.kernel_args
            out = torch.ops.radixlm.paged_attention(
                q, k_buf, v_buf, forward_batch.req_to_token, rows, seq_lens, q_starts, q_lens,
                scale, window,
            )  # [T, H, D]; rows of longer extends are filled below
        else:
            out = q.new_empty(num_tokens, num_heads, head_dim)  # [T, H, D]
        for ext in md.extends:
            out[ext.start : ext.end] = extend_attention(q, k, v, k_buf, v_buf, ext, scale)
        return out.view(num_tokens, -1)


def in_kernel(options: AttnOptions) -> bool:
    """Whether the paged kernel computes a layer with these options (a sliding window
    it does; a logit softcap it does not)."""
    return options.logit_softcap is None


def _ranges(ids: list[int]) -> str:
    """[0, 1, 2, 4] → "0-2, 4"."""
    out: list[str] = []
    for i in sorted(ids):
        if out and out[-1].split("-")[-1] == str(i - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{i}"
        else:
            out.append(str(i))
    return ", ".join(out)
