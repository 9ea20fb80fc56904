"""Request validation before anything reaches the scheduler.

Every check raises `ValueError` with a message that names the problem; the
HTTP layer turns it into a 400, the Engine raises it to the caller.
"""

from __future__ import annotations

from collections.abc import Container
from typing import TYPE_CHECKING

from radixlm.messages.io_struct import sample_rid
from radixlm.messages.mm_inputs import MultimodalInputs
from radixlm.messages.sampling_params import GRAMMAR_PARAMS, SamplingParams
from radixlm.tokenizer.request_input import SingleReq

if TYPE_CHECKING:
    from radixlm.server_args import ServerArgs

MAX_TOP_LOGPROBS = 100


def prompt_too_long(num_tokens: int, context_len: int, at_least: bool = False) -> str:
    """The error for a prompt past the context, in SGLang's words (clients match on them)."""
    size = f"at least {num_tokens}" if at_least else str(num_tokens)
    return (f"The input ({size} tokens) is longer than the model's context length "
            f"({context_len} tokens).")


def validate_request(
    single: SingleReq,
    input_ids: list[int],
    vocab_size: int,
    context_len: int,
    grammar_backend: str = "xgrammar",
    mm_inputs: MultimodalInputs | None = None,
    kv_pool_size: int | None = None,
) -> SamplingParams:
    """Return the request's checked SamplingParams, or raise ValueError.

    Ids >= vocab_size are allowed only inside an image's or video's run of pad
    values (`mm_inputs`). `max_new_tokens: None` means up to the end of the
    context (chat requests without max_tokens), or of the KV pool where that is
    smaller (`kv_pool_size`): such a request is admitted and runs until either is
    full (it is retracted under pressure as any other), as in SGLang, rather than
    refused for a length it never asked for. A grammar is only checked for
    kind here; whether it compiles is known in the scheduler, which ends a
    request with a bad grammar with an HTTP 400.
    """
    if not input_ids:
        raise ValueError("The prompt is empty")
    bad = _first_out_of_vocab(input_ids, vocab_size, mm_inputs)
    if bad is not None:
        raise ValueError(f"Token id {bad} is outside the vocabulary (size {vocab_size})")
    raw = single.sampling_params
    if "max_new_tokens" in raw and raw["max_new_tokens"] is None:
        limit = min(context_len, kv_pool_size or context_len)
        raw = {**raw, "max_new_tokens": max(limit - len(input_ids), 1)}
    params = SamplingParams.from_dict(raw)
    params.verify(vocab_size)
    params.verify_grammar(grammar_backend)
    if len(input_ids) >= context_len:
        raise ValueError(prompt_too_long(len(input_ids), context_len))
    if len(input_ids) + params.max_new_tokens > context_len:
        # SGLang's opening words (clients match on them), then the numbers.
        raise ValueError(
            f"max_completion_tokens is too large: {params.max_new_tokens}. This model "
            f"supports at most {context_len - len(input_ids)} completion tokens for this "
            f"prompt (the model's context length is {context_len} tokens, and the prompt "
            f"has {len(input_ids)})."
        )
    if single.logprob_start_len < -1:
        raise ValueError("logprob_start_len must be >= 0 (or -1 for none)")
    if not 0 <= single.top_logprobs_num <= MAX_TOP_LOGPROBS:
        raise ValueError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}]")
    if single.return_logprob and single.logprob_start_len >= len(input_ids):
        raise ValueError(
            f"logprob_start_len ({single.logprob_start_len}) must be less than the "
            f"prompt length ({len(input_ids)})"
        )
    return params


def check_rids(singles: list[SingleReq], ns: list[int], in_flight: Container[str]) -> None:
    """Refuse a request id already in flight or used twice by one request (`ns`: each
    request's number of samples, each with its own id)."""
    seen: set[str] = set()
    for single, n in zip(singles, ns):
        for rid in (sample_rid(single.rid, i, n) for i in range(n)):
            if rid in seen or rid in in_flight:
                raise ValueError(f"Duplicate request id {rid!r}")
            seen.add(rid)


def check_token_only(single: SingleReq) -> None:
    """--skip-tokenizer-init: refuse (ValueError, a 400) what needs the tokenizer."""
    why = " needs the tokenizer, and this server runs with --skip-tokenizer-init"
    if single.input_ids is None:
        raise ValueError("A text prompt" + why + ": send 'input_ids' instead of 'text'")
    params = single.sampling_params
    if params.get("stop"):
        raise ValueError("'stop' (stop strings)" + why + ": use 'stop_token_ids'")
    if params.get("stop_regex"):
        raise ValueError("'stop_regex'" + why + ": use 'stop_token_ids'")
    for name in GRAMMAR_PARAMS:
        if params.get(name) is not None:
            raise ValueError(f"'{name}' (a grammar){why}")
    if single.image_data or single.video_data:
        raise ValueError("Images and videos" + why)


def check_priority(priority: int | None, args: ServerArgs) -> None:
    """Refuse a priority outside 64 bits, or any priority when the server does not
    schedule by priority and was told to refuse it (--abort-on-priority-when-disabled)."""
    if priority is None:
        return
    if not -(1 << 63) <= priority < 1 << 63:
        raise ValueError("'priority' must be a 64-bit signed integer")
    if not args.priority_scheduling and args.abort_on_priority_when_disabled:
        raise ValueError("'priority' is set but priority scheduling is disabled on this "
                         "server (start it with --enable-priority-scheduling)")


def _first_out_of_vocab(input_ids: list[int], vocab_size: int,
                        mm_inputs: MultimodalInputs | None) -> int | None:
    """The first id outside [0, vocab_size) that is not its item's pad value."""
    items = mm_inputs.items if mm_inputs is not None else []
    for pos, t in enumerate(input_ids):
        if 0 <= t < vocab_size:
            continue
        if not any(it.offset <= pos < it.end and t == it.pad_value for it in items):
            return t
    return None
