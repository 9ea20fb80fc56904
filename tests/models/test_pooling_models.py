"""Pooling models equal transformers: decoder embeddings (last token, mean), decoder
classifiers, and BERT encoders (embedding and cross-encoder with segment ids) through
transformers' modules; pooling configs from sentence-transformers files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from _forward_harness import TINY, perturb_weights

from radixlm.layers.attention import create_attention_backend
from radixlm.mem_cache.memory_pool import ReqToTokenPool, TokenToKVPool
from radixlm.model_executor.forward_batch import ForwardBatch
from radixlm.model_loader.loader import load_model
from radixlm.models.pooler import PoolingConfig, read_pooling_config

ATOL = 1e-4
PROMPTS = [list(range(3, 20)), [7, 1, 9, 200, 4, 4, 60], [42]]


def _save(model: Any, path: Path) -> str:
    model.save_pretrained(path)
    return str(path)


@torch.no_grad()
def _pool(ours: Any, config: Any, prompts: list[list[int]],
          token_types: list[list[int] | None] | None = None) -> torch.Tensor:
    """One step over whole prompts through real pools, as the model runner runs it."""
    head_dim = config.hidden_size // config.num_attention_heads
    kv = TokenToKVPool(256, config.num_hidden_layers,
                       getattr(config, "num_key_value_heads", config.num_attention_heads),
                       head_dim, torch.float32, "cpu")
    rows = ReqToTokenPool(8, 128, "cpu")
    locs = []
    for i, ids in enumerate(prompts):
        slots = kv.alloc(len(ids))
        assert slots is not None
        rows.req_to_token[i, : len(ids)] = slots
        locs.append(slots)
    flat = [t for ids in prompts for t in ids]
    batch = ForwardBatch(
        input_ids=torch.tensor(flat), positions=torch.cat([torch.arange(len(p)) for p in prompts]),
        out_cache_loc=torch.cat(locs), req_pool_indices=torch.arange(len(prompts)),
        req_to_token=rows.req_to_token, token_to_kv_pool=kv, prefix_lens=[0] * len(prompts),
        extend_lens=[len(p) for p in prompts],
        attn_backend=create_attention_backend("torch_native", ours))
    batch.token_type_ids = token_types
    batch.attn_backend.init_forward_metadata(batch)  # type: ignore[union-attr]
    return ours.pool_forward(batch.input_ids, batch.positions, batch)  # [B, D]


def test_decoder_mean_pooling_from_sentence_transformers_files(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    hf = perturb_weights(AutoModel.from_config(AutoConfig.for_model("llama", **TINY),
                                               attn_implementation="eager"))
    path = _save(hf, tmp_path)
    (tmp_path / "pool").mkdir()
    (tmp_path / "pool" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"path": "", "type": "sentence_transformers.models.Transformer"},
        {"path": "pool", "type": "sentence_transformers.models.Pooling"}]))
    ours, config = load_model(path, torch.float32, "cpu")
    assert type(ours).__name__ == "LlamaEmbeddingModel"
    assert ours.pooling == PoolingConfig("mean", normalize=False) and ours.needs_whole_prompt
    got = _pool(ours, config, PROMPTS)
    for row, ids in zip(got, PROMPTS):
        expected = hf(input_ids=torch.tensor([ids])).last_hidden_state[0].mean(0)
        torch.testing.assert_close(row, expected, atol=ATOL, rtol=ATOL)


def test_causal_lm_served_for_embeddings(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(1)
    hf = perturb_weights(AutoModelForCausalLM.from_config(
        AutoConfig.for_model("mistral", **TINY), attn_implementation="eager"))
    ours, config = load_model(_save(hf, tmp_path), torch.float32, "cpu", is_embedding=True)
    assert type(ours).__name__ == "MistralEmbeddingModel" and not ours.is_generation
    got = _pool(ours, config, PROMPTS)
    for row, ids in zip(got, PROMPTS):
        out = hf(input_ids=torch.tensor([ids]), output_hidden_states=True)
        torch.testing.assert_close(row, out.hidden_states[-1][0, -1], atol=ATOL, rtol=ATOL)


def test_llama_classifier_equals_transformers(tmp_path: Path) -> None:
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(2)
    cfg = AutoConfig.for_model("llama", num_labels=3, pad_token_id=0, **TINY)
    hf = perturb_weights(AutoModelForSequenceClassification.from_config(
        cfg, attn_implementation="eager"))
    ours, config = load_model(_save(hf, tmp_path), torch.float32, "cpu")
    assert ours.num_labels == 3
    got = _pool(ours, config, PROMPTS)
    for row, ids in zip(got, PROMPTS):
        expected = hf(input_ids=torch.tensor([ids])).logits[0]
        torch.testing.assert_close(row, expected, atol=ATOL, rtol=ATOL)


BERT = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=128, max_position_embeddings=128, type_vocab_size=2)


@pytest.mark.parametrize("prefixed", [False, True])
def test_bert_embedding_cls_equals_transformers(tmp_path: Path, prefixed: bool) -> None:
    from transformers import BertConfig, BertForMaskedLM, BertModel

    torch.manual_seed(3)
    if prefixed:  # BertForMaskedLM with --is-embedding ("bert." names, a head to skip)
        mlm = perturb_weights(BertForMaskedLM(BertConfig(**BERT)))
        path = _save(mlm, tmp_path)
        hf = mlm.bert
    else:
        hf = perturb_weights(BertModel(BertConfig(**BERT), add_pooling_layer=False))
        path = _save(hf, tmp_path)
    ours, config = load_model(path, torch.float32, "cpu", is_embedding=prefixed)
    assert type(ours).__name__ == "HFEncoderEmbeddingModel" and not ours.is_causal
    assert ours.pooling == PoolingConfig("cls", normalize=True)
    got = _pool(ours, config, PROMPTS)
    for row, ids in zip(got, PROMPTS):
        expected = hf(input_ids=torch.tensor([ids])).last_hidden_state[0, 0]
        torch.testing.assert_close(row, expected, atol=ATOL, rtol=ATOL)


def test_bert_cross_encoder_with_segments(tmp_path: Path) -> None:
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(4)
    hf = perturb_weights(BertForSequenceClassification(BertConfig(num_labels=1, **BERT)))
    ours, config = load_model(_save(hf, tmp_path), torch.float32, "cpu")
    types = [[0] * 8 + [1] * (len(PROMPTS[0]) - 8), None, [0]]
    got = _pool(ours, config, PROMPTS, types)
    for row, ids, tt in zip(got, PROMPTS, types):
        expected = hf(input_ids=torch.tensor([ids]),
                      token_type_ids=torch.tensor([tt]) if tt else None).logits[0]
        torch.testing.assert_close(row, expected, atol=ATOL, rtol=ATOL)


def test_pooling_config_errors(tmp_path: Path) -> None:
    default = PoolingConfig("last", True)
    assert read_pooling_config(str(tmp_path), default) == default
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    (tmp_path / "modules.json").write_text(json.dumps([
        {"path": "p", "type": "sentence_transformers.models.Pooling"}]))
    with pytest.raises(ValueError, match="not supported"):
        read_pooling_config(str(tmp_path), default)
