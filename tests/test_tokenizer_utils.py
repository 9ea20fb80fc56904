"""DecodeTokenizer (tokenizers only) decodes exactly like transformers' tokenizer."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from radixlm.model_loader.model_path import resolve_model_dir
from radixlm.tokenizer_utils import DecodeTokenizer, load_decode_tokenizer, load_tokenizer


def test_decode_tokenizer_matches_transformers() -> None:
    folder = resolve_model_dir(None)
    fast, full = load_decode_tokenizer(folder), load_tokenizer(folder)
    assert isinstance(fast, DecodeTokenizer)
    assert fast.eos_token_id == full.eos_token_id
    assert len(fast) == len(full)
    rng = random.Random(0)
    seqs = [[rng.randrange(len(full)) for _ in range(rng.randrange(1, 40))] for _ in range(100)]
    seqs.append(full.encode("Héllo wörld 你好 🎉 <|im_end|> done"))
    for skip in (True, False):
        assert fast.batch_decode(seqs, skip_special_tokens=skip) == [
            full.decode(s, skip_special_tokens=skip) for s in seqs
        ]


# (model_type, the tokenizer class its Hub folders name): the families radixlm serves
FAMILIES = [("llama", "PreTrainedTokenizerFast"), ("llama", "LlamaTokenizer"),
            ("qwen3", "Qwen2Tokenizer"), ("qwen3_moe", "Qwen2TokenizerFast"),
            ("gemma3_text", "GemmaTokenizer"), ("mistral", "LlamaTokenizerFast"),
            ("phi3", "LlamaTokenizer"), ("granite", "GPT2Tokenizer")]


@pytest.mark.parametrize(("model_type", "tokenizer_class"), FAMILIES)
def test_load_tokenizer_picks_autotokenizers_class(tmp_path: Path, model_type: str,
                                                    tokenizer_class: str) -> None:
    """load_tokenizer reads the model's config into the base config class (not the
    model's own, whose import pulls transformers' model-loading stack): the tokenizer
    AutoTokenizer picks with the model's own config class, the same encodings and chat
    template, for each family's model_type and Hub tokenizer class."""
    from transformers import AutoTokenizer

    source = resolve_model_dir(None)
    for name in os.listdir(source):  # the tokenizer's files and the chat template
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(os.path.join(source, name), tmp_path / name)
    with open(os.path.join(source, "tokenizer_config.json")) as f:
        tokenizer_config = json.load(f)
    tokenizer_config["tokenizer_class"] = tokenizer_class
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    ours, theirs = load_tokenizer(str(tmp_path)), AutoTokenizer.from_pretrained(str(tmp_path))
    assert type(ours) is type(theirs)
    text = "Héllo wörld 你好 🎉 <|im_end|> done"
    assert ours.encode(text) == theirs.encode(text)
    messages = [{"role": "user", "content": "hi"}]
    assert (ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            == theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))


def test_load_tokenizer_leaves_the_model_loading_stack_out() -> None:
    """The HTTP process loads the tokenizer: accelerate, sympy and torch's DTensor
    (~85 MB) stay out of it."""
    code = ("import sys\nfrom radixlm.model_loader.model_path import resolve_model_dir\n"
            "from radixlm.tokenizer_utils import load_tokenizer\n"
            "load_tokenizer(resolve_model_dir(None))\n"
            "print(sorted(m for m in ('accelerate', 'sympy', 'torch.distributed.tensor', 'boto3')"
            " if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
