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

    return AutoTokenizer.from_pretrained(path, **_tokenizer_only_config(path))


def _tokenizer_only_config(path: str) -> dict[str, Any]:
    """`config=` for AutoTokenizer where the folder names its tokenizer class: the
    model's config.json read into the base config class, with its model_type.

    Without it AutoTokenizer loads the model's own config class, whose module imports
    transformers' model-loading stack (torch.distributed, sympy, accelerate, boto3:
    ~900 modules, ~85 MB of the HTTP process's memory) only to read model_type and
    tokenizer_class, which the base class reads as well. Where tokenizer_config.json
    names no class (AutoTokenizer then goes by the config's own type) or maps to remote
    code, AutoTokenizer does as it always does.
    """
    try:
        with open(os.path.join(path, "tokenizer_config.json")) as f:
            tokenizer_config = json.load(f)
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if (not isinstance(tokenizer_config, dict) or not tokenizer_config.get("tokenizer_class")
            or "auto_map" in tokenizer_config or not isinstance(model_type, str) or not model_type):
        return {}
    from transformers import PretrainedConfig

    config_class: type[PretrainedConfig] = type("TokenizerOnlyConfig", (PretrainedConfig,),
                                                {"model_type": model_type})
    try:
        return {"config": config_class.from_dict(config)}
    except Exception:  # noqa: BLE001 - a config the base class refuses: AutoTokenizer's own way
        return {}


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
