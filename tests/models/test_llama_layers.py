"""Layer-level checks: RoPE variants against transformers, tensor-parallel weight loaders,
the model registry and load_weights' errors."""

from __future__ import annotations

import pytest
import torch
from _forward_harness import TINY

from radixlm.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from radixlm.layers.rotary import RotaryEmbedding
from radixlm.layers.vocab_embedding import ParallelLMHead, VocabParallelEmbedding
from radixlm.models.registry import get_model_class

ROPE_VARIANTS = [
    None,
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
]


def _llama_config(rope_scaling):  # type: ignore[no-untyped-def]
    from transformers import LlamaConfig

    return LlamaConfig(**{**TINY, "max_position_embeddings": 128}, rope_scaling=rope_scaling)


def _hf_cos_sin(config, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[no-untyped-def]
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    rope = LlamaRotaryEmbedding(config)
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = rope(x, positions[None, :])  # each [1, P, D]
    half = cos.shape[-1] // 2
    return cos[0, :, :half], sin[0, :, :half]


@pytest.mark.parametrize(
    "rope_scaling", ROPE_VARIANTS, ids=lambda r: (r or {}).get("rope_type", "default")
)
def test_rope_matches_transformers(rope_scaling) -> None:  # type: ignore[no-untyped-def]
    config = _llama_config(rope_scaling)
    ours = RotaryEmbedding(config, head_dim=16)
    positions = torch.arange(128)
    cos, sin = ours(positions)  # [P, 1, D / 2]
    ref_cos, ref_sin = _hf_cos_sin(config, positions)
    torch.testing.assert_close(cos[:, 0], ref_cos, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sin[:, 0], ref_sin, atol=1e-5, rtol=1e-5)


def test_dynamic_rope_beyond_context() -> None:
    """Past max_position_embeddings, position p rotates as in a sequence of length p + 1."""
    config = _llama_config({"rope_type": "dynamic", "factor": 2.0})
    ours = RotaryEmbedding(config, head_dim=16)
    for p in (128, 200, 300):  # 300 also grows the table
        cos, sin = ours(torch.tensor([p]))
        ref_cos, ref_sin = _hf_cos_sin(
            _llama_config({"rope_type": "dynamic", "factor": 2.0}), torch.arange(p + 1)
        )
        torch.testing.assert_close(cos[0, 0], ref_cos[-1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(sin[0, 0], ref_sin[-1], atol=1e-4, rtol=1e-4)


def _loaded(layer: torch.nn.Module, *loads) -> torch.nn.Module:  # type: ignore[no-untyped-def]
    for tensor, *shard in loads:
        layer.weight.weight_loader(layer.weight, tensor, *shard)  # type: ignore[union-attr,operator]
    return layer


def test_tensor_parallel_shards_reassemble() -> None:
    """Each rank's loaded part, computed separately, combines into the unsplit result."""
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    w = torch.randn(12, 8)
    col = [_loaded(ColumnParallelLinear(8, 12, tp_rank=r, tp_size=2), (w,)) for r in range(2)]
    torch.testing.assert_close(torch.cat([c(x) for c in col], dim=-1), x @ w.T)

    row_w = torch.randn(5, 8)
    rows = [_loaded(RowParallelLinear(8, 5, tp_rank=r, tp_size=2), (row_w,)) for r in range(2)]
    partial = [
        torch.nn.functional.linear(x[:, 4 * r : 4 * r + 4], rows[r].weight) for r in range(2)
    ]
    torch.testing.assert_close(partial[0] + partial[1], x @ row_w.T)

    gate, up = torch.randn(6, 8), torch.randn(6, 8)
    merged = [
        _loaded(MergedColumnParallelLinear(8, [6, 6], tp_rank=r, tp_size=2), (gate, 0), (up, 1))
        for r in range(2)
    ]
    for r, m in enumerate(merged):
        torch.testing.assert_close(
            m.weight, torch.cat([gate[3 * r : 3 * r + 3], up[3 * r : 3 * r + 3]])
        )


def test_qkv_replicates_kv_heads_when_ranks_outnumber_them() -> None:
    d, heads, kv_heads, tp = 2, 4, 1, 2
    q, k, v = torch.randn(heads * d, 8), torch.randn(kv_heads * d, 8), torch.randn(kv_heads * d, 8)
    for r in range(tp):
        layer = _loaded(
            QKVParallelLinear(8, d, heads, kv_heads, tp_rank=r, tp_size=tp),
            (q, "q"),
            (k, "k"),
            (v, "v"),
        )
        torch.testing.assert_close(layer.weight, torch.cat([q[4 * r : 4 * r + 4], k, v]))


def test_vocab_partition_and_tied_head() -> None:
    emb = torch.randn(10, 4)
    last = VocabParallelEmbedding(10, 4, tp_rank=2, tp_size=3)  # rows 8..9, padded to 4
    last.weight_loader(last.weight, emb)
    torch.testing.assert_close(last.weight[:2], emb[8:])
    full = VocabParallelEmbedding(10, 4)
    full.weight_loader(full.weight, emb)
    head = ParallelLMHead(10, 4)
    head.tie_to(full)
    hidden = torch.randn(3, 4)
    torch.testing.assert_close(head.compute_logits(hidden), hidden @ emb.T)
    full.weight_loader(full.weight, 2 * emb)  # the cached transposed copy follows reloads
    torch.testing.assert_close(head.compute_logits(hidden), 2 * hidden @ emb.T)
    with torch.no_grad():
        full.weight.mul_(2.0)  # ... and in-place updates
    torch.testing.assert_close(head.compute_logits(hidden), 4 * hidden @ emb.T)


def test_registry() -> None:
    from transformers import LlamaConfig

    cfg = LlamaConfig(architectures=["SomethingElse", "LlamaForCausalLM"])
    assert get_model_class(cfg).__name__ == "LlamaForCausalLM"
    with pytest.raises(ValueError, match="unsupported model architecture.*GPT2LMHeadModel"):
        get_model_class(LlamaConfig(architectures=["GPT2LMHeadModel"]))


def test_load_weights_reports_unknown_and_missing() -> None:
    from transformers import LlamaConfig

    config = LlamaConfig(**TINY)
    model = get_model_class(LlamaConfig(architectures=["LlamaForCausalLM"]))(config, torch.float32)
    with pytest.raises(ValueError, match="matches no parameter"):
        model.load_weights([("model.bogus.weight", torch.zeros(1))])  # type: ignore[operator]
    with pytest.raises(ValueError, match="checkpoint lacks"):
        model.load_weights([("model.norm.weight", torch.ones(64))])  # type: ignore[operator]
