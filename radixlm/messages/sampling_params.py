"""Per-request sampling parameters and their validation.

Validation happens in the TokenizerManager, before a request reaches the
scheduler: every problem raises `ValueError` with a message naming the field,
which the service turns into an HTTP 400.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field, fields
from typing import Any

from radixlm.messages.stop_regex import check_stop_regexes

# Constraint kinds, in the order the "only one" error names them.
GRAMMAR_PARAMS = ("regex", "json_schema", "ebnf", "structural_tag")
# What each --grammar-backend can compile; kept here so that validation needs no grammar
# library (importing xgrammar takes seconds).
GRAMMAR_BACKEND_KINDS: dict[str, tuple[str, ...]] = {
    "xgrammar": GRAMMAR_PARAMS,
    "outlines": ("regex", "json_schema"),
    "llguidance": GRAMMAR_PARAMS,
    "none": (),
}
TOO_MANY_GRAMMARS = "Only one of regex, json_schema, ebnf or structural_tag can be set"

# Ranges that keep float32 sampling finite: logits / temperature and logits / penalty stay
# far below float32's ~3.4e38 for any logit a model produces. Seeds are int64, as in the
# OpenAI API and vLLM; sample i of an `n` request uses seed + i (wrapped to 64 bits).
MAX_TEMPERATURE = 100.0
MIN_REPETITION_PENALTY = 0.01
MAX_REPETITION_PENALTY = 2.0
MAX_LOGIT_BIAS = 100.0
MAX_N = 128
SEED_MIN = -(2**63)
SEED_MAX = 2**63 - 1
_INT_FIELDS = ("max_new_tokens", "min_new_tokens", "top_k", "n")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty",
                 "repetition_penalty")
_BOOL_FIELDS = ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens",
                "no_stop_trim")


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: the whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    stop: list[str] = field(default_factory=list)
    stop_regex: list[str] = field(default_factory=list)  # SGLang's: stop where one matches
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    # Constrained decoding: at most one of these (see `grammar`).
    regex: str | None = None
    json_schema: str | None = None  # a JSON schema as a JSON string
    ebnf: str | None = None
    structural_tag: str | None = None  # SGLang's {"structures", "triggers"} as a JSON string
    # Where the grammar starts with --reasoning-parser (radixlm.reasoning.gate): "none",
    # "start" (the output may open a think block), "inside" (it starts in one); None: the
    # server decides from the prompt.
    reasoning_phase: str | None = None
    # vLLM's: the most tokens inside the think block (with --reasoning-parser); once spent,
    # the block's end tag is forced and the answer starts. None: the server's
    # --reasoning-budget (no limit by default).
    thinking_token_budget: int | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Build from a request's `sampling_params` dict; unknown keys are an error."""
        d = dict(d or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"Unknown sampling parameter(s): {', '.join(unknown)}")
        for name in ("stop", "stop_regex"):
            if isinstance(d.get(name), str):
                d[name] = [d[name]]
            if d.get(name) is None:
                d.pop(name, None)
        if d.get("stop_token_ids") is None:
            d.pop("stop_token_ids", None)
        if d.get("logit_bias") is not None:
            d["logit_bias"] = _parse_logit_bias(d["logit_bias"])
        for name in ("json_schema", "structural_tag"):
            if isinstance(d.get(name), dict):  # accept the object itself, not only its text
                d[name] = json.dumps(d[name])
        params = cls(**d)
        params._check_types()
        return params

    @property
    def is_greedy(self) -> bool:
        # NOTE: tiny temperatures overflow the softmax; treat them as greedy like SGLang.
        return self.temperature < 1e-6 or self.top_k == 1

    @property
    def grammar(self) -> tuple[str, str] | None:
        """(kind, text) of the request's constraint, or None when unconstrained."""
        for kind in GRAMMAR_PARAMS:
            text = getattr(self, kind)
            if text is not None:
                return kind, text
        return None

    @property
    def gates_reasoning(self) -> bool:
        """Whether the think block is gated: a grammar or a thinking budget applies, and
        the output starts in a think block or may open one."""
        return (self.grammar is not None or self.thinking_token_budget is not None) and \
            self.reasoning_phase in ("start", "inside")

    @property
    def has_penalties(self) -> bool:
        return (
            self.frequency_penalty != 0.0
            or self.presence_penalty != 0.0
            or self.repetition_penalty != 1.0
        )

    def verify_grammar(self, backend: str) -> None:
        """Check that the server's grammar backend can serve this request's constraint."""
        grammar = self.grammar
        if grammar is None:
            return
        if backend == "none":
            raise ValueError(
                "Grammar-constrained decoding is disabled on this server (--grammar-backend none)"
            )
        if grammar[0] not in GRAMMAR_BACKEND_KINDS[backend]:
            raise ValueError(f"The {backend} grammar backend does not support {grammar[0]} grammars")

    def _check_types(self) -> None:
        """JSON types, not coerced: a bool is not an integer, a string not a number."""
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not _is_int(value):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        for name in _FLOAT_FIELDS:
            value = getattr(self, name)
            if not _is_number(value):
                raise ValueError(f"{name} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
            setattr(self, name, float(value))
        for name in _BOOL_FIELDS:
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError("stop must be a string or a list of strings")
        if not isinstance(self.stop_regex, list) or not all(
            isinstance(s, str) for s in self.stop_regex
        ):
            raise ValueError("stop_regex must be a string or a list of strings")
        if not isinstance(self.stop_token_ids, list) or not all(
            _is_int(t) for t in self.stop_token_ids
        ):
            raise ValueError("stop_token_ids must be a list of integers")
        for name in GRAMMAR_PARAMS:
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ValueError(f"{name} must be a string, got {type(value).__name__}")
        if self.thinking_token_budget is not None and not _is_int(self.thinking_token_budget):
            raise ValueError("thinking_token_budget must be an integer, got "
                             f"{self.thinking_token_budget!r}")
        if self.reasoning_phase not in (None, "none", "start", "inside"):
            raise ValueError("reasoning_phase must be 'none', 'start' or 'inside', got "
                             f"{self.reasoning_phase!r}")

    def verify(self, vocab_size: int) -> None:
        """Check ranges; raise ValueError naming the first bad field."""
        if not 0.0 <= self.temperature <= MAX_TEMPERATURE:
            raise ValueError(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got "
                             f"{self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1 or self.top_k == 0:
            raise ValueError(f"top_k must be -1 (disabled) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if not -2.0 <= self.frequency_penalty <= 2.0:
            raise ValueError(f"frequency_penalty must be in [-2, 2], got {self.frequency_penalty}")
        if not -2.0 <= self.presence_penalty <= 2.0:
            raise ValueError(f"presence_penalty must be in [-2, 2], got {self.presence_penalty}")
        if not MIN_REPETITION_PENALTY <= self.repetition_penalty <= MAX_REPETITION_PENALTY:
            raise ValueError(
                f"repetition_penalty must be in [{MIN_REPETITION_PENALTY:g}, "
                f"{MAX_REPETITION_PENALTY:g}], got {self.repetition_penalty}"
            )
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be >= 0, got {self.min_new_tokens}")
        if self.thinking_token_budget is not None and self.thinking_token_budget < 0:
            raise ValueError(f"thinking_token_budget must be >= 0, got "
                             f"{self.thinking_token_budget}")
        if self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_new_tokens ({self.min_new_tokens}) must be <= max_new_tokens "
                f"({self.max_new_tokens})"
            )
        if not 1 <= self.n <= MAX_N:
            raise ValueError(f"n must be in [1, {MAX_N}], got {self.n}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise ValueError(f"seed must be a 64-bit signed integer (in [-2**63, 2**63 - 1]), "
                             f"got {self.seed}")
        for tid in self.stop_token_ids:
            if not 0 <= tid < vocab_size:
                raise ValueError(f"stop_token_ids contains {tid}, outside the vocabulary")
        for tid, bias in (self.logit_bias or {}).items():
            if not 0 <= tid < vocab_size:
                raise ValueError(f"logit_bias has token id {tid}, outside the vocabulary")
            if not -MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS:
                raise ValueError(f"logit_bias values must be in [-{MAX_LOGIT_BIAS:g}, "
                                 f"{MAX_LOGIT_BIAS:g}], got {bias}")
        if any(s == "" for s in self.stop):
            raise ValueError("stop strings must not be empty")
        check_stop_regexes(self.stop_regex)
        if sum(getattr(self, name) is not None for name in GRAMMAR_PARAMS) > 1:
            raise ValueError(TOO_MANY_GRAMMARS)


def sample_seed(seed: int | None, index: int) -> int | None:
    """The seed of sample `index` of a request: seed + index as an unsigned 64-bit value
    (what torch.Generator.manual_seed takes), so any int64 seed and any n fit."""
    return None if seed is None else (seed + index) & 0xFFFF_FFFF_FFFF_FFFF


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _parse_logit_bias(raw: Any) -> dict[int, float]:
    """{token id: bias} from a JSON object whose keys are token ids (as strings or ints)."""
    if not isinstance(raw, dict):
        raise ValueError(f"logit_bias must be an object mapping token ids to numbers, got "
                         f"{type(raw).__name__}")
    out: dict[int, float] = {}
    for key, value in raw.items():
        token = key if _is_int(key) else None
        if isinstance(key, str) and re.fullmatch(r"-?[0-9]+", key):
            token = int(key)
        if token is None:
            raise ValueError(f"logit_bias keys must be token ids, got {key!r}")
        if not _is_number(value) or not math.isfinite(value):
            raise ValueError(f"logit_bias values must be finite numbers, got {value!r}")
        out[token] = float(value)
    return out
