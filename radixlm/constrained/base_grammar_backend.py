"""Grammar backends for constrained decoding: the contract every backend keeps.

A backend compiles a request's constraint (regex, JSON schema, EBNF or
structural tag) once into a grammar object; the scheduler then, per step,
asks each constrained request's object to fill its row of one batch-wide
vocabulary bitmask, applies the mask to the logits in one operation, and
feeds the sampled token back with `accept_token`.

The mask representation is shared by all backends: a packed int32 bitmask of
shape [B, ceil(V/32)], bit j of word i set when token 32*i+j is allowed (the
xgrammar / llguidance layout). Rows of unconstrained requests stay all ones.
"""

from __future__ import annotations

import abc
import logging
import re
from collections.abc import Sequence
from typing import Any

import torch
import xgrammar as xgr

from radixlm.messages.sampling_params import GRAMMAR_PARAMS

GRAMMAR_KINDS = GRAMMAR_PARAMS

logger = logging.getLogger(__name__)


class GrammarError(ValueError):
    """A grammar that cannot be compiled or used; its message is shown to the user (HTTP 400)."""


# xgrammar's C++ errors start with its log prefix ("[10:20:10] /project/cpp/x.cc:94: "),
# sometimes followed by the failed assertion ("Check failed: (error.empty()) is false: ").
_NATIVE_PREFIX = re.compile(r"^\[\d{2}:\d{2}:\d{2}\] \S+:\d+: (Check failed: \(.*?\) is false: )?")


def compile_error(kind: str, reason: object) -> GrammarError:
    """The user-facing error: the library's reason, without C++ source locations (the
    full text goes to the server log)."""
    text = _NATIVE_PREFIX.sub("", str(reason)).strip()
    if text != str(reason).strip():
        logger.info("The %s grammar failed to compile: %s", kind, reason)
    return GrammarError(f"Failed to compile {kind} grammar: {text}")


def unsupported_kind_error(backend: str, kind: str) -> GrammarError:
    return GrammarError(f"The {backend} grammar backend does not support {kind} grammars")


def allocate_vocab_mask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """A CPU bitmask [batch_size, ceil(vocab_size/32)] int32 with every token allowed."""
    return xgr.allocate_token_bitmask(batch_size, vocab_size)


def reset_vocab_mask(mask: torch.Tensor) -> None:
    """Set every row back to "all tokens allowed" (in place)."""
    mask.fill_(-1)


def apply_vocab_mask(
    logits: torch.Tensor, mask: torch.Tensor, rows: list[int] | None = None
) -> None:
    """Set disallowed logits to -inf, in place, in one operation for the batch.

    logits: [B, V] float on any device; mask: [B, ceil(V/32)] int32 (moved to
    the logits' device here). rows: only these rows are masked (the
    constrained ones); None masks every row. Tokens past 32 * mask.shape[1]
    are disallowed.
    """
    xgr.apply_token_bitmask_inplace(
        logits, mask.to(logits.device, non_blocking=True), indices=rows
    )


def mask_to_bool(mask_row: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Unpack one bitmask row [ceil(V/32)] into a bool tensor [V] (for tests and debugging)."""
    bits = torch.arange(32, dtype=torch.int32)
    unpacked = (mask_row.unsqueeze(-1) >> bits) & 1  # [ceil(V/32), 32]
    return unpacked.flatten()[:vocab_size].bool()


class BaseGrammarObject(abc.ABC):
    """The matcher state of one request's grammar.

    Invariants: the tokens accepted so far are a valid prefix of the grammar's
    language; EOS (any of the backend's eos_token_ids) is allowed by the mask
    only where the grammar may end, and accepting it terminates the grammar.
    Not thread-safe: one request (one sequence of n>1) owns each object.
    """

    @abc.abstractmethod
    def accept_token(self, token_id: int) -> None:
        """Advance by one sampled token; raises GrammarError if the grammar rejects it
        (the state is then unchanged)."""

    @abc.abstractmethod
    def fill_vocab_mask(self, mask: torch.Tensor, row: int) -> None:
        """Write the allowed next tokens into mask[row] (CPU int32 bitmask, see module doc)."""

    @abc.abstractmethod
    def is_terminated(self) -> bool:
        """True once the grammar accepted an EOS token (the request then stops).

        Where nothing more can follow, the mask allows only EOS, so it comes next."""

    @abc.abstractmethod
    def rollback(self, num_tokens: int) -> None:
        """Undo the last num_tokens accepted tokens (EOS included)."""

    @abc.abstractmethod
    def try_jump_forward(self) -> str | None:
        """The text every valid continuation starts with, or None when there is none.

        Does not change the state: the caller retokenizes the text and feeds
        the resulting tokens through `accept_token`.
        """

    @abc.abstractmethod
    def copy(self) -> BaseGrammarObject:
        """A fresh matcher (initial state) over the same compiled grammar, for n > 1."""


class BaseGrammarBackend(abc.ABC):
    """Compiles constraints into grammar objects for one tokenizer.

    The per-backend tokenizer information is built once in __init__ (it takes
    about a second); `compile` is thread-safe and may be called from a pool.
    """

    name: str = "base"
    supported_kinds: tuple[str, ...] = GRAMMAR_KINDS

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        *,
        json_whitespace_pattern: str | None = None,
        json_disable_any_whitespace: bool = False,
        json_bounded_numbers: bool = True,
    ) -> None:
        """tokenizer: a transformers fast tokenizer; vocab_size: the model's logits width
        (may exceed the tokenizer's size); json_whitespace_pattern: a regex for whitespace
        between JSON tokens (outlines and llguidance; xgrammar ignores it);
        json_disable_any_whitespace: compact JSON with no whitespace at all;
        json_bounded_numbers: JSON numbers with bounded digits (json_bounds.py)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = list(eos_token_ids)
        self.json_whitespace_pattern = json_whitespace_pattern
        self.json_disable_any_whitespace = json_disable_any_whitespace
        self.json_bounded_numbers = json_bounded_numbers

    def compile(self, kind: str, text: str) -> BaseGrammarObject:
        """Compile `text` as a `kind` grammar; raises GrammarError on bad input or a kind
        this backend does not support."""
        if kind not in GRAMMAR_KINDS:
            raise GrammarError(f"Unknown grammar kind {kind!r}; expected one of {GRAMMAR_KINDS}")
        if kind not in self.supported_kinds:
            raise unsupported_kind_error(self.name, kind)
        try:
            return self._compile(kind, text)
        except GrammarError:
            raise
        except Exception as e:  # the libraries raise RuntimeError, ValueError, ...
            raise compile_error(kind, e) from e

    @abc.abstractmethod
    def _compile(self, kind: str, text: str) -> BaseGrammarObject:
        """Compile a supported kind; any exception becomes a GrammarError."""
