"""Greedy output of the default model equals transformers', token for token.

The reference is transformers' own model read from the same GGUF (float32),
decoded greedily with its KV cache. Our engine must match it one prompt at a
time, batched, without the radix cache, with small prefill chunks, and with
a KV pool small enough to force retraction.
"""

from __future__ import annotations

import os

import pytest
import torch

from radixlm import Engine
from radixlm.default_model import default_model_path

PROMPTS = [
    "The capital of France is",
    "Here is a short poem about the sea:\n",
    "def fibonacci(n):",
    "Three facts about elephants: 1.",
    "Q: What is 12 times 7?\nA:",
]
NUM_TOKENS = 48
GREEDY = {"temperature": 0.0, "max_new_tokens": NUM_TOKENS, "ignore_eos": True}


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = default_model_path()
    folder, name = os.path.dirname(path), os.path.basename(path)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    model.eval()
    outputs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([tokenizer.encode(prompt)])
            out = model(ids, use_cache=True)
            generated: list[int] = []
            for _ in range(NUM_TOKENS):
                next_id = int(out.logits[0, -1].argmax())
                generated.append(next_id)
                out = model(torch.tensor([[next_id]]), past_key_values=out.past_key_values,
                            use_cache=True)
            outputs.append(generated)
    return outputs


def _check_clean(engine: Engine) -> dict:
    info = engine.get_server_info()
    assert info["kv_integrity"] == "ok"
    assert info["num_used_tokens"] == 0, "KV slots leaked after all requests finished"
    return info


def test_one_at_a_time_and_batched(reference: list[list[int]]) -> None:
    with Engine(max_total_tokens=4096) as engine:
        for prompt, expected in zip(PROMPTS, reference):
            out = engine.generate(prompt, GREEDY)
            assert out["output_ids"] == expected, prompt
        batched = engine.generate(PROMPTS, GREEDY)
        assert [o["output_ids"] for o in batched] == reference
        # Second round hits the prefix cache for every prompt.
        assert all(o["meta_info"]["cached_tokens"] > 0 for o in batched)
        _check_clean(engine)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"disable_radix_cache": True},
        {"chunked_prefill_size": 16},
        {"max_total_tokens": 200, "schedule_conservativeness": 0.0},
    ],
    ids=["no-radix", "chunk16", "retraction"],
)
def test_batched_variants(reference: list[list[int]], kwargs: dict) -> None:
    kwargs = {"max_total_tokens": 4096, **kwargs}
    with Engine(**kwargs) as engine:
        batched = engine.generate(PROMPTS, GREEDY)
        assert [o["output_ids"] for o in batched] == reference
        info = _check_clean(engine)
        if kwargs["max_total_tokens"] == 200:
            assert info["num_retractions"] > 0


def _reduced_precisions() -> list[pytest.param]:
    from _kernels import requires_bf16w

    from radixlm.layers.cpu_gemm import cpu_has_native_bf16

    return [
        pytest.param({"quantization": "bf16_weights"}, id="bf16_weights",
                     marks=requires_bf16w()),
        pytest.param({"dtype": "bfloat16"}, id="bfloat16",
                     marks=pytest.mark.skipif(not cpu_has_native_bf16(),
                                              reason="no native bfloat16 on this CPU")),
    ]


@pytest.mark.parametrize("kwargs", _reduced_precisions())
def test_reduced_precision_serves_chunked_batches(reference: list[list[int]],
                                                  kwargs: dict) -> None:
    """The precisions `--dtype auto` picks outside the tests, through the whole engine:
    prompts in chunks of 4 (steps whose chunks need no logits: the LM head gets no
    rows), batched, then again from the radix cache. Greedy output follows float32's
    (the accuracy gate bounds the difference; 48 tokens may drift apart late)."""
    with Engine(max_total_tokens=4096, chunked_prefill_size=4, **kwargs) as engine:
        for _ in range(2):
            batched = engine.generate(PROMPTS, GREEDY)
            outs = [o["output_ids"] for o in batched]
            assert all(len(o) == NUM_TOKENS for o in outs)
            agree = [next((i for i, (a, b) in enumerate(zip(o, r)) if a != b), NUM_TOKENS)
                     for o, r in zip(outs, reference)]
            assert min(agree) >= 4 and sum(agree) >= 3 * NUM_TOKENS, agree
        _check_clean(engine)
