"""Tiny random-weight Qwen2 checkpoint folders that `radixlm serve` loads as is.

Each folder holds config.json, float32 safetensors (transformers' own model,
with non-trivial norms and biases), a byte-level tokenizer with a small chat
template, and, for embedding models, sentence-transformers' `modules.json`
with a last-token Pooling module and Normalize (as gte-Qwen2 ships).
`reference_*` run transformers on the same folder.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
from _forward_harness import perturb_weights  # noqa: E402

CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=512, initializer_range=0.1,
            rope_theta=10000.0, tie_word_embeddings=False)


def byte_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    vocab["<|endoftext|>"] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>",
                                 unk_token="<|endoftext|>", pad_token="<|endoftext|>")
    hf.chat_template = CHAT_TEMPLATE
    return hf


def build_qwen2(path: Path, kind: str = "causal", seed: int = 0, **overrides: Any) -> Path:
    """Save a tiny Qwen2 checkpoint: kind "causal" (Qwen2ForCausalLM), "embedding"
    (Qwen2Model plus sentence-transformers' last-token pooling) or "classifier"
    (Qwen2ForSequenceClassification)."""
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
    )

    tok = byte_tokenizer()
    eos = int(tok.eos_token_id)
    config = AutoConfig.for_model("qwen2", **{**TINY, "vocab_size": len(tok), "bos_token_id": eos,
                                              "eos_token_id": eos, "pad_token_id": eos,
                                              **overrides})
    builder = {"causal": AutoModelForCausalLM, "embedding": AutoModel,
               "classifier": AutoModelForSequenceClassification}[kind]
    torch.manual_seed(seed)
    model = perturb_weights(builder.from_config(config, attn_implementation="eager"))
    model.save_pretrained(path)
    tok.save_pretrained(path)
    if kind == "embedding":
        (path / "1_Pooling").mkdir(exist_ok=True)
        (path / "1_Pooling" / "config.json").write_text(json.dumps(
            {"word_embedding_dimension": TINY["hidden_size"], "pooling_mode_lasttoken": True}))
        (path / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling",
             "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize",
             "type": "sentence_transformers.models.Normalize"}]))
    return path


def load_reference(path: Path, kind: str) -> Any:
    from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSequenceClassification

    builder = {"causal": AutoModelForCausalLM, "embedding": AutoModel,
               "classifier": AutoModelForSequenceClassification}[kind]
    return builder.from_pretrained(path, attn_implementation="eager").eval()


@torch.no_grad()
def reference_embedding(model: Any, ids: list[int]) -> torch.Tensor:
    """gte-Qwen2's pooling: the last token's final hidden state, L2-normalized."""
    hidden = model(input_ids=torch.tensor([ids])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=-1)


@torch.no_grad()
def reference_logits(model: Any, ids: list[int]) -> torch.Tensor:
    return model(input_ids=torch.tensor([ids])).logits[0].float()


@torch.no_grad()
def reference_greedy(model: Any, ids: list[int], num_new: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=num_new, do_sample=False,
                         min_new_tokens=num_new, pad_token_id=model.config.eos_token_id)
    return [int(t) for t in out[0, len(ids):]]
