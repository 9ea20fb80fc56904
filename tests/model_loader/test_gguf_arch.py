"""llama.cpp's architectures onto radixlm's models: a GGUF file written from a tiny random
transformers model (as llama.cpp's converter writes one: _gguf_writer.py) loads through
gguf_arch's plan into logits equal to that model's, in F32, F16 and Q8_0 (the reference
model's weights rounded through the same format), over a whole prompt and a mixed batch
with sliding windows that slide.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
import _scenarios as sc  # noqa: E402
from _forward_harness import build_hf_model, perturb_weights  # noqa: E402
from _gguf_writer import roundtrip, write_gguf  # noqa: E402

from radixlm.model_loader.gguf_arch import llama3_rope_scaling, plan_gguf  # noqa: E402
from radixlm.model_loader.gguf_convert import gguf_config, iterate_gguf_weights  # noqa: E402
from radixlm.model_loader.gguf_file import read_gguf  # noqa: E402
from radixlm.models.decoder import head_dim  # noqa: E402
from radixlm.models.registry import get_model_class  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 32}
# name → (transformers model_type, config overrides, context length served or None)
CASES: dict[str, tuple[str, dict[str, Any], int | None]] = {
    "llama3": ("llama", dict(rope_scaling=LLAMA3, tie_word_embeddings=True), None),
    "qwen3": ("qwen3", dict(head_dim=16), None),
    "qwen3moe": ("qwen3_moe", dict(head_dim=16, num_experts=8, num_experts_per_tok=2,
                                   moe_intermediate_size=32, norm_topk_prob=True), None),
    # llama.cpp: every 6th layer global, local base 10k, scale 1/sqrt(head_dim) below 27B
    "gemma3": ("gemma3_text", dict(head_dim=16, num_hidden_layers=6, sliding_window=8,
                                   query_pre_attn_scalar=16, final_logit_softcapping=30.0,
                                   rope_parameters={
                                       "full_attention": {"rope_type": "linear", "factor": 2.0,
                                                          "rope_theta": 1e6},
                                       "sliding_attention": {"rope_type": "default",
                                                             "rope_theta": 1e4}}), None),
    "phi3": ("phi3", dict(pad_token_id=0, partial_rotary_factor=0.5, sliding_window=8,
                          original_max_position_embeddings=32,
                          rope_scaling={"rope_type": "longrope",
                                        "short_factor": [1.0, 1.3, 1.7, 2.2],
                                        "long_factor": [1.0, 2.0, 4.0, 8.0],
                                        "original_max_position_embeddings": 32}), 32),
    "smollm3": ("smollm3", dict(pad_token_id=0, num_hidden_layers=4), None),
}


def _load(path: Path) -> tuple[torch.nn.Module, Any]:
    """radixlm's model from the GGUF file through gguf_arch's plan."""
    from transformers import AutoConfig

    gguf = read_gguf(str(path))
    plan = plan_gguf(gguf.metadata, gguf.tensors)
    config = AutoConfig.for_model(plan.model_type, **gguf_config(gguf, plan))
    model = get_model_class(config)(config, torch.float32)
    model.load_weights(iterate_gguf_weights(gguf, plan))
    return model.eval(), config


@pytest.fixture(scope="module", params=[(c, q) for c in sorted(CASES)
                                        for q in ("F32", "F16", "Q8_0")],
                ids=lambda p: f"{p[0]}-{p[1]}")
def loaded(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    name, qtype = request.param
    model_type, overrides, context_len = CASES[name]
    hf = perturb_weights(build_hf_model(model_type, **overrides), extra=("mlp.gate.weight",))
    path = write_gguf(hf, tmp_path_factory.mktemp(name) / f"{name}-{qtype}.gguf", qtype,
                      eot_token_id=7)
    ours, config = _load(path)
    if context_len is not None:
        ours.set_context_length(context_len)
    return roundtrip(hf, qtype), ours, config, path


def test_prefill_logits(loaded) -> None:
    hf, ours, config, _ = loaded
    sc.full_prefill(hf, ours, config)


def test_mixed_batch_logits(loaded) -> None:
    hf, ours, config, _ = loaded
    sc.mixed_batch(hf, ours, config)


def test_config_mapped(loaded) -> None:
    """What the metadata and the config tensors say lands where transformers reads it."""
    hf, _, config, path = loaded
    ref = hf.config
    assert head_dim(config) == head_dim(ref)
    for key in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "tie_word_embeddings", "sliding_window", "layer_types",
                "query_pre_attn_scalar", "num_experts", "num_experts_per_tok",
                "moe_intermediate_size", "norm_topk_prob", "no_rope_layers",
                "partial_rotary_factor", "final_logit_softcapping"):
        assert getattr(config, key, None) == getattr(ref, key, None), key
    assert _rope_close(config.rope_parameters, ref.rope_parameters), (
        config.rope_parameters, ref.rope_parameters)
    gguf = read_gguf(str(path))
    assert plan_gguf(gguf.metadata, gguf.tensors).generation_config["eos_token_id"] == [2, 7]


def _rope_close(a: dict[str, Any], b: dict[str, Any]) -> bool:
    keys = set(a) | set(b)
    for k in keys:
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            if not _rope_close(va, vb):
                return False
        elif isinstance(va, float | int) and isinstance(vb, float | int):
            if abs(va - vb) > 1e-6 * max(1.0, abs(vb)):
                return False
        elif isinstance(va, list) and isinstance(vb, list):
            if len(va) != len(vb) or any(abs(x - y) > 1e-6 for x, y in zip(va, vb)):
                return False
        elif va != vb:
            return False
    return True


def test_llama3_rope_freqs_of_real_models() -> None:
    """Llama 3.1 / 3.2's rope factors (head_dim 128 and 64, base 500k) come back as the
    exact llama3 scaling; factors of no llama3 scaling are refused."""
    import numpy as np
    from _gguf_writer import _rope_freqs

    for factor, dim in ((8.0, 128), (32.0, 64)):
        params = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192,
                  "rope_theta": 500000.0}
        config = type("C", (), {"rope_parameters": params})()
        freqs = _rope_freqs(config, dim)
        got = llama3_rope_scaling(freqs, 500000.0, dim)
        assert got is not None
        assert got["factor"] == factor
        assert got["original_max_position_embeddings"] == pytest.approx(8192, rel=1e-3)
        assert got["high_freq_factor"] == pytest.approx(4.0, rel=1e-3)
    assert llama3_rope_scaling(np.ones(32), 500000.0, 64) is None
    with pytest.raises(ValueError, match="not Llama 3"):
        llama3_rope_scaling(np.linspace(1.0, 3.0, 32)[::-1], 500000.0, 64)


def test_unknown_architecture_is_refused() -> None:
    with pytest.raises(ValueError, match="GGUF architecture 'mamba' is not supported"):
        plan_gguf({"general.architecture": "mamba"}, [])
