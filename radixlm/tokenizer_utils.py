"""Tokenizer loading.

The TokenizerManager needs the full Hugging Face tokenizer (chat templates,
encoding). The scheduler and the detokenizer only decode, so they get a
`DecodeTokenizer` over the `tokenizers` library alone: importing
transformers' AutoTokenizer and building the tokenizer costs ~5 s of CPU per
process, which on 2 cores is most of a server's start-up time. It decodes
exactly as transformers' fast tokenizer does (the Rust decoder, plus
transformers' clean-up step when the tokenizer asks for it, which falls back
to the full tokenizer).
"""

from __future__ import annotations

import json
import os
from typing import Any, Protocol


def load_tokenizer(path: str) -> Any:
    """The full Hugging Face tokenizer of a local folder."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class TokenDecoder(Protocol):
    """What the scheduler and the detokenizer use of a tokenizer: a `DecodeTokenizer` or
    a full Hugging Face tokenizer."""

    eos_token_id: int | None

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...

    def batch_decode(self, sequences: list[list[int]], skip_special_tokens: bool = ...,
                     **kwargs: Any) -> list[str]: ...


class DecodeTokenizer:
    """The decode side of a fast tokenizer: decode, batch_decode, eos_token_id, len(), and
    encode without special tokens (jump-forward retokenizes output text)."""

    def __init__(self, tokenizer: Any, eos_token_id: int | None) -> None:
        self._tokenizer = tokenizer  # tokenizers.Tokenizer
        self.eos_token_id = eos_token_id

    def __len__(self) -> int:
        return int(self._tokenizer.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int], skip_special_tokens: bool = False, **_: Any) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

    def batch_decode(
        self, sequences: list[list[int]], skip_special_tokens: bool = False, **_: Any
    ) -> list[str]:
        return list(self._tokenizer.decode_batch(sequences, skip_special_tokens=skip_special_tokens))

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str | None]:
        return [self._tokenizer.id_to_token(i) for i in ids]


def load_decode_tokenizer(path: str) -> TokenDecoder:
    """A `DecodeTokenizer` when the folder allows one, else the full tokenizer."""
    tokenizer_file = os.path.join(path, "tokenizer.json")
    config_file = os.path.join(path, "tokenizer_config.json")
    full: TokenDecoder
    if not os.path.isfile(tokenizer_file):
        full = load_tokenizer(path)
        return full
    config: dict[str, Any] = {}
    if os.path.isfile(config_file):
        with open(config_file) as f:
            config = json.load(f)
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(tokenizer_file)
    if config.get("clean_up_tokenization_spaces") and type(tokenizer.model).__name__ != "BPE":
        full = load_tokenizer(path)  # transformers' clean-up step changes the text
        return full
    eos = config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    eos_id = tokenizer.token_to_id(eos) if isinstance(eos, str) else None
    return DecodeTokenizer(tokenizer, eos_id)
