"""AttnOptions (scale, sliding window, logit softcap) in both attention backends against a
plain reference: each request's queries over its whole sequence with the causal and window
mask, scores scaled and softcapped as transformers' eager attention does.

One batch holds every shape a step has: decodes of different lengths, an extend after a
prefix longer than the window, a fresh prompt, a 1-token prompt.
"""

from __future__ import annotations

import pytest
import torch

from radixlm.layers.attention import AttnOptions, create_attention_backend
from radixlm.layers.cpu_kernels import load_cpu_kernels
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.model_executor.forward_batch import ForwardBatch

H, HKV, D = 4, 2, 16
BACKENDS = ["torch_native"] + (["cpu_paged"] if load_cpu_kernels() is not None else [])
OPTIONS = {
    "scale": AttnOptions(scale=0.3),
    "window": AttnOptions(sliding_window=5),
    "softcap": AttnOptions(logit_softcap=2.0),
    "all": AttnOptions(scale=0.4, sliding_window=3, logit_softcap=1.5),
}


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix: int,
               options: AttnOptions) -> torch.Tensor:
    """q [n, H, D] at positions prefix.., k and v [L, Hkv, D] of positions 0..L-1."""
    n, seq = q.shape[0], k.shape[0]
    k = k.repeat_interleave(H // HKV, dim=1)
    v = v.repeat_interleave(H // HKV, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q, k) * options.scale_for(D)  # [H, n, L]
    if options.logit_softcap:
        scores = options.logit_softcap * torch.tanh(scores / options.logit_softcap)
    qpos = torch.arange(prefix, prefix + n)[:, None]
    kpos = torch.arange(seq)[None, :]
    visible = kpos <= qpos
    if options.sliding_window:
        visible &= kpos > qpos - options.sliding_window
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_options_match_reference(backend: str, name: str) -> None:
    options = OPTIONS[name]
    g = torch.Generator().manual_seed(0)
    kv = TokenToKVPool(256, 1, HKV, D, torch.float32, "cpu")
    rows = ReqToTokenPool(8, 64, "cpu")
    # (tokens already in the pool, tokens this step)
    shapes = [(11, 1), (4, 1), (9, 6), (0, 7), (0, 1), (20, 1)]
    seqs = [(torch.randn(p + n, H, D, generator=g), torch.randn(p + n, HKV, D, generator=g),
             torch.randn(p + n, HKV, D, generator=g)) for p, n in shapes]
    pool_rows, locs = [], []
    for (p, n), (_, k, v) in zip(shapes, seqs):
        row = rows.alloc()
        slots = kv.alloc(p + n)
        assert row is not None and slots is not None
        rows.req_to_token[row, : p + n] = slots
        kv.set_kv_buffer(0, slots[:p], k[:p], v[:p])  # the cached prefix
        pool_rows.append(row)
        locs.append(slots[p:])
    q = torch.cat([s[0][p:] for (p, _), s in zip(shapes, seqs)])
    k_new = torch.cat([s[1][p:] for (p, _), s in zip(shapes, seqs)])
    v_new = torch.cat([s[2][p:] for (p, _), s in zip(shapes, seqs)])
    fb = ForwardBatch(input_ids=torch.zeros(q.shape[0], dtype=torch.int64),
                      positions=torch.zeros(q.shape[0], dtype=torch.int64),
                      out_cache_loc=torch.cat(locs), req_pool_indices=torch.tensor(pool_rows),
                      req_to_token=rows.req_to_token, token_to_kv_pool=kv,
                      prefix_lens=[p for p, _ in shapes], extend_lens=[n for _, n in shapes])
    attn = create_attention_backend(backend)
    fb.attn_backend = attn
    attn.init_forward_metadata(fb)
    out = attn.forward(q, k_new, v_new, 0, fb, options).view(-1, H, D)
    expected = torch.cat([_reference(s[0][p:], s[1], s[2], p, options)
                          for (p, _), s in zip(shapes, seqs)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
