"""The native encode / classify request (a pooling model's input), and its normalization.

`text` is one string or a list; `input_ids` one token list or a list of them;
`text_pairs` a list of (first, second) texts, tokenized as a pair the way the
tokenizer pairs them (a cross-encoder's query and document: BERT's
`[CLS] q [SEP] d [SEP]` with segment ids, a decoder's plain concatenation).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any


@dataclass
class SinglePooling:
    rid: str
    text: str | None = None
    input_ids: list[int] | None = None
    pair: tuple[str, str] | None = None


@dataclass
class EmbeddingReqInput:
    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    text_pairs: list[tuple[str, str]] | None = None
    rid: str | list[str] | None = None
    dimensions: int | None = None

    @property
    def is_batch(self) -> bool:
        if self.text_pairs is not None:
            return True
        if self.text is not None:
            return isinstance(self.text, list)
        ids = self.input_ids
        return isinstance(ids, list) and bool(ids) and isinstance(ids[0], list)

    def normalize(self) -> list[SinglePooling]:
        """One entry per input; raise ValueError on a malformed request."""
        given = [x for x in (self.text, self.input_ids, self.text_pairs) if x is not None]
        if len(given) != 1:
            raise ValueError("Give exactly one of 'text' or 'input_ids'")
        items: list[dict[str, Any]]
        if self.text_pairs is not None:
            items = [{"pair": (str(a), str(b))} for a, b in self.text_pairs]
        elif self.text is not None:
            texts = [self.text] if isinstance(self.text, str) else self.text
            if not all(isinstance(t, str) for t in texts):
                raise ValueError("'text' must be a string or a list of strings")
            items = [{"text": t} for t in texts]
        else:
            ids = self.input_ids
            batch = ids if ids and all(isinstance(x, list) for x in ids) else [ids]
            for seq in batch:
                if not isinstance(seq, list) or not all(
                        isinstance(t, int) and not isinstance(t, bool) for t in seq):
                    raise ValueError("'input_ids' must be a list of token ids or a list of "
                                     "such lists")
            items = [{"input_ids": list(seq)} for seq in batch]  # type: ignore[arg-type]
        if not items:
            raise ValueError("The input is empty")
        if isinstance(self.rid, list):
            if len(self.rid) != len(items):
                raise ValueError(f"'rid' has {len(self.rid)} entries for {len(items)} inputs")
            rids = self.rid
        elif self.rid is not None:
            rids = [self.rid] if len(items) == 1 else [f"{self.rid}-{i}" for i in range(len(items))]
        else:
            rids = [uuid.uuid4().hex for _ in items]
        return [SinglePooling(rid=r, **item) for r, item in zip(rids, items)]


def tokenize_pooling(tokenizer: Any, model_info: dict[str, Any], single: SinglePooling,
                     index: int) -> tuple[list[int], list[int] | None]:
    """(input ids, segment ids of a pair or None), checked against the model."""
    types: list[int] | None = None
    if single.pair is not None:
        enc = tokenizer(*single.pair)
        ids = list(enc["input_ids"])
        if "token_type_ids" in enc and any(enc["token_type_ids"]):
            types = list(enc["token_type_ids"])
    elif single.text is not None:
        ids = tokenizer.encode(single.text)
    else:
        assert single.input_ids is not None
        ids = single.input_ids
    where = f"Input {index}" if index or single.pair else "The input"
    if not ids:
        raise ValueError(f"{where} is empty")
    vocab_size = int(model_info.get("vocab_size") or len(tokenizer))
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"{where}: token id {bad} is outside the vocabulary "
                         f"(size {vocab_size})")
    context_len = int(model_info.get("context_length") or 1 << 30)
    if len(ids) > context_len:
        raise ValueError(f"{where} has {len(ids)} tokens, more than the model's context "
                         f"length ({context_len})")
    return ids, types


def check_dimensions(dimensions: int | None, model_info: dict[str, Any]) -> None:
    """Raise ValueError unless the model may be truncated to `dimensions`."""
    if dimensions is None:
        return
    info = model_info
    if info.get("num_labels") or not info.get("is_matryoshka"):
        raise ValueError("This model does not support 'dimensions' (it is not a "
                         "Matryoshka embedding model)")
    allowed = info.get("matryoshka_dimensions")
    full = int(info.get("embedding_dim") or 0)
    if allowed and dimensions not in allowed:
        raise ValueError(f"'dimensions' must be one of {allowed}")
    if not 1 <= dimensions <= full:
        raise ValueError(f"'dimensions' must be between 1 and {full}")
