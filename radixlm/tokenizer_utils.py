"""Tokenizer loading (transformers' AutoTokenizer over a local folder)."""

from __future__ import annotations

from typing import Any


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)
