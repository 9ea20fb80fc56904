"""Engine.encode on a tiny BERT: each prompt is computed whole, in one step, even when
it is longer than the chunk size and the step budget (admitted alone), and equals
transformers' CLS vector, normalized."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "entrypoints"))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "models"))
from _forward_harness import perturb_weights  # noqa: E402
from _tiny_checkpoints import byte_tokenizer  # noqa: E402

from radixlm import Engine  # noqa: E402


def test_bert_prompts_are_computed_whole(tmp_path: Path) -> None:
    from transformers import BertConfig, BertModel

    tok = byte_tokenizer()
    config = BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128, max_position_embeddings=128)
    torch.manual_seed(0)
    hf = perturb_weights(BertModel(config, add_pooling_layer=False))
    hf.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    texts = ["a sentence longer than both limits", "short", "another long enough sentence"]
    with Engine(model_path=str(tmp_path), max_total_tokens=512, chunked_prefill_size=8,
                max_prefill_tokens=16) as engine:
        outs = engine.encode(texts)
        info = engine.get_server_info()
        assert engine.model_info["is_causal"] is False
    assert info["kv_integrity"] == "ok" and info["num_running_reqs"] == 0
    for out, text in zip(outs, texts):
        ids = tok.encode(text)
        with torch.no_grad():
            cls = hf(input_ids=torch.tensor([ids])).last_hidden_state[0, 0]
        expected = torch.nn.functional.normalize(cls, dim=-1)
        torch.testing.assert_close(torch.tensor(out["embedding"]), expected, atol=1e-4, rtol=1e-4)
        assert out["meta_info"] == {"prompt_tokens": len(ids), "cached_tokens": 0}
