"""Accuracy gate for --kv-cache-dtype int8 (and bfloat16): the default model with an
int8 KV pool against the same model with today's KV (auto), teacher-forced over a 2,093-token text
(tests/models/data/long_text.txt): chunks of 256 through the C++ paged kernels (every
chunk after the first attends over the quantized prefix on the flash path), then the
last 64 tokens one at a time (the decode path). The top-1 next token must agree at
>= 99% of positions and the mean KL(auto || int8) stay small.

Measured on the AVX-512 machine (torch 2.13, float32 compute; docs/kv-cache.md):

| KV pool   | top-1 agreement with auto | mean KL (nats) |
|-----------|---------------------------|----------------|
| int8      | 99.04%                    | 0.00011        |
| fp8_e4m3  | 93.93%                    | 0.0081         |
| fp8_e5m2  | 89.39%                    | 0.031          |
| bfloat16  | 99.24%                    | 0.00005        |

float32 compute, so that the KV format is the only difference (in bfloat16 the two
runs also differ by bfloat16's own rounding: docs/kv-cache.md gives those figures).
"""

from __future__ import annotations

import os

import pytest
import torch
from _forward_harness import PoolRunner
from _kernels import requires_kernels
from test_accuracy_gate import agreement_and_kl, text_ids

from radixlm.layers.prepared_weight import prepare_model
from radixlm.model_loader.loader import load_model
from radixlm.model_loader.model_path import resolve_model_dir

pytestmark = requires_kernels()

TEXT = os.path.join(os.path.dirname(__file__), "data", "long_text.txt")
CHUNK = 256
DECODE_TAIL = 64
MIN_AGREEMENT = 0.99
KL_BOUND = 0.0005  # int8 measured 0.00011; fp8_e4m3 (outside the gate) 0.0081


def teacher_forced_logits(model_dir: str, ids: list[int], kv_cache_dtype: str) -> torch.Tensor:
    """float32 logits [len(ids), vocab] through a pool stored as kv_cache_dtype."""
    model, config = load_model(model_dir, torch.float32, "cpu")
    prepare_model(model, "none")
    runner = PoolRunner(model, config, num_slots=len(ids) + 8, max_requests=1,
                        max_context=len(ids) + 8, backend="cpu_paged",
                        kv_cache_dtype=kv_cache_dtype)
    row = runner.new_request()
    end = len(ids) - DECODE_TAIL
    parts = [runner.step([(row, ids[i : min(i + CHUNK, end)])])[0] for i in range(0, end, CHUNK)]
    parts += [runner.step([(row, [t])])[0] for t in ids[end:]]
    return torch.cat(parts).float()


@pytest.fixture(scope="module")
def model_dir() -> str:
    return resolve_model_dir(None)


def test_int8_kv_passes_gate(model_dir: str) -> None:
    ids = text_ids(model_dir, TEXT, 2000)
    reference = teacher_forced_logits(model_dir, ids, "auto")
    logits = teacher_forced_logits(model_dir, ids, "int8")
    top1, kl = agreement_and_kl(reference, logits)
    print(f"\nint8 KV: top-1 agreement {top1:.4f}, mean KL {kl:.5f} over {len(ids)} tokens")
    assert top1 >= MIN_AGREEMENT and kl < KL_BOUND, (top1, kl)


def test_bf16_kv_passes_gate(model_dir: str) -> None:
    """--kv-cache-dtype bfloat16 under a float32 model (K/V rounded to bf16; at
    avx512bf16 the prefill chunks' flash attention also rounds the queries and
    probabilities, for the CPU's bf16 dot products). Measured 99.24% top-1 and mean KL
    0.00005 (avx512bf16) / 0.00003 (avx2): int8's gate, with 99.24% this close to 99%
    given half a point."""
    ids = text_ids(model_dir, TEXT, 2000)
    reference = teacher_forced_logits(model_dir, ids, "auto")
    logits = teacher_forced_logits(model_dir, ids, "bfloat16")
    top1, kl = agreement_and_kl(reference, logits)
    print(f"\nbf16 KV: top-1 agreement {top1:.4f}, mean KL {kl:.5f} over {len(ids)} tokens")
    assert top1 >= MIN_AGREEMENT - 0.005 and kl < KL_BOUND, (top1, kl)
