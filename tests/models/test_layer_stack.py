"""The decoder layers in one C++ call (models/layer_stack.py) against the Python loop.

The stack calls the same kernels in the same order, so its logits and the K/V it
writes must equal the Python loop's bit for bit, over prefill chunks (with and
without a cached prefix) and decode steps of several requests at once.
"""

from __future__ import annotations

import pytest
import torch
from _forward_harness import PoolRunner, build_hf_model

from radixlm.layers.cpu_gemm import pairs_capable, prepare_model
from radixlm.model_loader.loader import load_model
from radixlm.models import layer_stack

# head_dim 64: the attention kernel's blocked path takes every prefill chunk too.
STACK = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=3)


def _needs_pairs_kernel() -> None:
    if not pairs_capable(torch.zeros(16, 16, dtype=torch.bfloat16)):
        pytest.skip("the bf16 pairs kernel needs a CPU with AVX512_BF16")


def _load(tmp_path, model_type: str):  # type: ignore[no-untyped-def]
    hf = build_hf_model(model_type, **STACK)
    hf.save_pretrained(tmp_path)
    model, config = load_model(str(tmp_path), torch.bfloat16, "cpu")
    prepare_model(model, "none")
    return model, config


def _run(model, config, use_stack: bool) -> tuple[list[torch.Tensor], PoolRunner]:  # type: ignore[no-untyped-def]
    """Three requests: two prefills (one of 40 tokens, one chunked 30 + 20 after a shared
    prefix), then decode steps of all three together. Returns every step's logits."""
    model.model.use_layer_stack = use_stack
    runner = PoolRunner(model, config, num_slots=512, max_requests=4, max_context=128,
                        dtype=torch.bfloat16, backend="cpu_paged")
    gen = torch.Generator().manual_seed(1)

    def ids(n: int) -> list[int]:
        return torch.randint(0, 256, (n,), generator=gen).tolist()

    a = runner.new_request()
    out = runner.step([(a, ids(40))])
    b = runner.new_request(share_prefix_of=a, prefix_len=24)  # a cached prefix
    c = runner.new_request()
    out += runner.step([(b, ids(30)), (c, ids(3))])
    out += runner.step([(b, ids(20)), (c, ids(1)), (a, ids(1))])
    for _ in range(4):
        out += runner.step([(r, ids(1)) for r in (a, b, c)])
    return out, runner


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])  # qwen2: q/k/v biases
def test_layer_stack_equals_the_python_loop(tmp_path, model_type: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    _needs_pairs_kernel()
    model, config = _load(tmp_path, model_type)
    calls = {"stack": 0}
    run = layer_stack.LayerStack.run

    def counted(self, *args):  # type: ignore[no-untyped-def]
        out = run(self, *args)
        calls["stack"] += out is not None
        return out

    monkeypatch.setattr(layer_stack.LayerStack, "run", counted)
    python_logits, python_runner = _run(model, config, use_stack=False)
    assert calls["stack"] == 0
    stack_logits, stack_runner = _run(model, config, use_stack=True)
    assert calls["stack"] == 7  # every step
    assert len(stack_logits) == len(python_logits)
    for ours, ref in zip(stack_logits, python_logits):
        assert torch.equal(ours, ref)
    for ours, ref in zip(stack_runner.kv.k_buffers + stack_runner.kv.v_buffers,
                         python_runner.kv.k_buffers + python_runner.kv.v_buffers):
        assert torch.equal(ours, ref)


def test_a_forward_hook_or_another_precision_keeps_the_python_loop(tmp_path) -> None:  # type: ignore[no-untyped-def]
    _needs_pairs_kernel()
    model, config = _load(tmp_path, "llama")
    seen = []
    handle = model.model.layers[1].mlp.register_forward_hook(lambda *a: seen.append(1))
    _run(model, config, use_stack=True)
    assert len(seen) == 7  # the hook ran every step: the Python loop did
    handle.remove()
    assert layer_stack.stack_for(model.model) is not None
    fp32, fp32_config = load_model(str(tmp_path), torch.float32, "cpu")
    prepare_model(fp32, "none")
    assert layer_stack.stack_for(fp32.model) is None  # oneDNN-packed fp32: no pairs weights
