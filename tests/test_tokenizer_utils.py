"""DecodeTokenizer (tokenizers only) decodes exactly like transformers' tokenizer."""

from __future__ import annotations

import random

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
