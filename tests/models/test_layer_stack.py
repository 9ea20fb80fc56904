"""The decoder layers in one C++ call (models/layer_stack.py) against the Python loop.

The stack calls the same kernels and operators in the same order, so its logits
and the K/V it writes must equal the Python loop's bit for bit, over prefill
chunks (with and without a cached prefix) and decode steps of several requests at
once: in bf16 (the pairs kernel where the CPU has bf16 dot products, else oneDNN)
in the exact float32 mode (oneDNN-packed weights, torch's elementwise ops) and in
float32 over bf16 weights (--quantization bf16_weights: csrc/bf16w_gemm.cpp). Every
family's layer program takes the same test: Llama and Qwen2 at every ISA level the
CPU has, the others (q/k norms, MoE, Gemma's norms, GELU and two rotary tables,
partial rotary, NoPE layers, sliding windows) at the CPU's own, and quantized KV
pools (--kv-cache-dtype) through both loops.
"""

from __future__ import annotations

import pytest
import torch
from _forward_harness import PoolRunner, build_hf_model, perturb_weights
from _kernels import KERNELS_MISSING, bf16w_skip_reason

from radixlm.layers.cpu_gemm import can_pack, pairs_capable
from radixlm.layers.cpu_kernels import load_cpu_kernels
from radixlm.layers.prepared_weight import PairsWeight, prepare_model
from radixlm.model_loader.loader import load_model
from radixlm.models import layer_stack

# head_dim 64: the attention kernel's blocked path takes every prefill chunk too.
STACK = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4,
             num_key_value_heads=2, num_hidden_layers=3)
# The other families (transformers model_type, config overrides), each switching on what
# its layer program adds; windows (16) shorter than the sequences, so that they slide.
FAMILIES = {
    "qwen3": ("qwen3", dict(head_dim=64)),
    # 16 experts (the router packs in pairs), 4 per token; layer 1 dense
    "qwen3_moe": ("qwen3_moe", dict(head_dim=64, num_experts=16, num_experts_per_tok=4,
                                    moe_intermediate_size=128, mlp_only_layers=[1],
                                    norm_topk_prob=True)),
    "gemma3": ("gemma3_text", dict(
        head_dim=64, query_pre_attn_scalar=48, sliding_window=16, final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                            "rope_theta": 1e6},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}})),
    "phi3": ("phi3", dict(partial_rotary_factor=0.5, pad_token_id=0)),
    "smollm3": ("smollm3", dict(num_hidden_layers=4, pad_token_id=0)),
    "mistral": ("mistral", dict(head_dim=64, sliding_window=16)),
}


def _needs_packed_weights(dtype: torch.dtype) -> None:
    w = torch.zeros(16, 16, dtype=dtype)
    if load_cpu_kernels() is None:
        pytest.skip(KERNELS_MISSING)
    if not (pairs_capable(w) or can_pack(w)):
        pytest.skip(f"no packed {dtype} weights on this CPU (needs oneDNN)")


def _skip_without_stack_kernels(dtype: torch.dtype, quantization: str, isa_level: str) -> None:
    _needs_packed_weights(dtype)
    if quantization == "bf16_weights" and (reason := bf16w_skip_reason()) is not None:
        pytest.skip(reason)
    if dtype == torch.bfloat16 and not pairs_capable(torch.zeros(16, 16, dtype=dtype)):
        # native bf16 (oneDNN) without the pairs kernel: the level is capped below the
        # CPU's (no CPU has AMX/AVX512_BF16 without AVX512_BF16 kernels); such layers keep
        # plain copies for 1-2 rows, which the stack leaves to the Python loop
        pytest.skip(f"bf16 oneDNN weights with plain copies at ISA level {isa_level}")


def _load(tmp_path, model_type: str, dtype: torch.dtype = torch.bfloat16,  # type: ignore[no-untyped-def]
          quantization: str = "none", **overrides):
    hf = build_hf_model(model_type, **{**STACK, **overrides})
    # Routers away from their zero init: ties between experts would make top-k arbitrary.
    perturb_weights(hf, extra=("mlp.gate.weight",))
    hf.save_pretrained(tmp_path)
    model, config = load_model(str(tmp_path), dtype, "cpu")
    prepare_model(model, quantization)
    return model, config


def _run(model, config, use_stack: bool, dtype: torch.dtype = torch.bfloat16,  # type: ignore[no-untyped-def]
         kv_cache_dtype: str = "auto") -> tuple[list[torch.Tensor], PoolRunner]:
    """Three requests: two prefills (one of 40 tokens, one chunked 30 + 20 after a shared
    prefix), then decode steps of all three together. Returns every step's logits."""
    model.model.use_layer_stack = use_stack
    runner = PoolRunner(model, config, num_slots=512, max_requests=4, max_context=128,
                        dtype=dtype, backend="cpu_paged", kv_cache_dtype=kv_cache_dtype)
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


@pytest.mark.parametrize(("dtype", "quantization"),
                         [(torch.bfloat16, "none"), (torch.float32, "none"),
                          (torch.float32, "bf16_weights")],
                         ids=["bf16", "fp32", "fp32-bf16-weights"])
@pytest.mark.parametrize("model_type", ["llama", "qwen2"])  # qwen2: q/k/v biases
def test_layer_stack_equals_the_python_loop(tmp_path, model_type: str, dtype: torch.dtype,
                                            quantization: str, monkeypatch,  # type: ignore[no-untyped-def]
                                            isa_level: str) -> None:
    _skip_without_stack_kernels(dtype, quantization, isa_level)
    model, config = _load(tmp_path, model_type, dtype, quantization)
    if quantization == "bf16_weights":  # every projection takes the bf16w kernel, and
        # the float32 norms, rotary and SiLU the fused kernels, in both loops
        assert all(isinstance(layer.mlp.down_proj.prepared, PairsWeight)
                   and layer.self_attn.fuse_float32
                   and layer.mlp.act_fn.fuse_float32 and layer.input_layernorm.fuse_float32
                   for layer in model.model.layers)
        stack = layer_stack.stack_for(model.model)
        assert stack is not None and stack.fused
    else:
        assert not model.model.layers[0].input_layernorm.fuse_float32
    _assert_stack_equals_loop(model, config, dtype, monkeypatch)


def _assert_stack_equals_loop(model, config, dtype: torch.dtype, monkeypatch,  # type: ignore[no-untyped-def]
                              kv_cache_dtype: str = "auto") -> None:
    calls = {"stack": 0}
    run = layer_stack.LayerStack.run

    def counted(self, *args):  # type: ignore[no-untyped-def]
        out = run(self, *args)
        calls["stack"] += out is not None
        return out

    monkeypatch.setattr(layer_stack.LayerStack, "run", counted)
    python_logits, python_runner = _run(model, config, False, dtype, kv_cache_dtype)
    assert calls["stack"] == 0
    stack_logits, stack_runner = _run(model, config, True, dtype, kv_cache_dtype)
    assert calls["stack"] == 7  # every step
    assert len(stack_logits) == len(python_logits)
    for ours, ref in zip(stack_logits, python_logits):
        assert torch.equal(ours, ref)
    for ours, ref in zip(stack_runner.kv.k_buffers + stack_runner.kv.v_buffers,
                         python_runner.kv.k_buffers + python_runner.kv.v_buffers):
        assert torch.equal(ours, ref)


@pytest.mark.parametrize(("dtype", "quantization"),
                         [(torch.bfloat16, "none"), (torch.float32, "none"),
                          (torch.float32, "bf16_weights")],
                         ids=["bf16", "fp32", "fp32-bf16-weights"])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_every_family_takes_the_stack_bit_for_bit(tmp_path, family: str, dtype: torch.dtype,
                                                  quantization: str, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """One generic C++ loop runs every family's layer program, equal to the Python loop."""
    _skip_without_stack_kernels(dtype, quantization, "the CPU's")
    model_type, overrides = FAMILIES[family]
    model, config = _load(tmp_path, model_type, dtype, quantization, **overrides)
    assert layer_stack.refusal(model.model) is None, layer_stack.refusal(model.model)
    _assert_stack_equals_loop(model, config, dtype, monkeypatch)


@pytest.mark.parametrize(("family", "kv_cache_dtype"),
                         [("llama", "int8"), ("llama", "fp8_e4m3"), ("llama", "fp8_e5m2"),
                          ("gemma3", "int8")])
def test_a_quantized_pool_takes_the_stack_bit_for_bit(tmp_path, family: str,  # type: ignore[no-untyped-def]
                                                       kv_cache_dtype: str, monkeypatch) -> None:
    """--kv-cache-dtype int8/fp8: the C++ loop stores K/V through the pool's quantizer
    (kv_store, as TokenToKVPool.set_kv_buffer does) and the paged kernel reads them as
    stored (Gemma 3: under its windows), so logits and the quantized pool equal the
    Python loop's bit for bit."""
    bf16 = torch.zeros(16, 16, dtype=torch.bfloat16)
    dtype = torch.bfloat16 if pairs_capable(bf16) else torch.float32
    _needs_packed_weights(dtype)
    model_type, overrides = FAMILIES.get(family, ("llama", {}))
    model, config = _load(tmp_path, model_type, dtype, **overrides)
    _assert_stack_equals_loop(model, config, dtype, monkeypatch, kv_cache_dtype)


def test_a_forward_hook_or_int8_keeps_the_python_loop(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bf16 = torch.zeros(16, 16, dtype=torch.bfloat16)
    dtype = torch.bfloat16 if pairs_capable(bf16) or can_pack(bf16) else torch.float32
    _needs_packed_weights(dtype)
    model, config = _load(tmp_path, "llama", dtype)
    seen = []
    # (hooks fire on the modules a layer program calls: norms, linears, activations)
    handle = model.model.layers[1].mlp.down_proj.register_forward_hook(lambda *a: seen.append(1))
    _run(model, config, use_stack=True, dtype=dtype)
    assert len(seen) == 7  # the hook ran every step: the Python loop did
    handle.remove()
    assert layer_stack.stack_for(model.model) is not None
    int8, _ = load_model(str(tmp_path), torch.float32, "cpu")
    assert layer_stack.stack_for(int8.model) is None  # not packed yet: dense weights
    prepare_model(int8, "w8a8_int8")
    assert layer_stack.stack_for(int8.model) is None
