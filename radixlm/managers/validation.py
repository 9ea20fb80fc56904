"""Request validation before anything reaches the scheduler.

Every check raises `ValueError` with a message that names the problem; the
HTTP layer turns it into a 400, the Engine raises it to the caller.
"""

from __future__ import annotations

from radixlm.managers.request_input import SingleReq
from radixlm.sampling.sampling_params import SamplingParams

MAX_TOP_LOGPROBS = 100


def validate_request(
    single: SingleReq,
    input_ids: list[int],
    vocab_size: int,
    context_len: int,
    grammar_backend: str = "xgrammar",
) -> SamplingParams:
    """Return the request's checked SamplingParams, or raise ValueError.

    A grammar is only checked for kind here; whether it compiles is known in the
    scheduler, which ends a request with a bad grammar with an HTTP 400.
    """
    if not input_ids:
        raise ValueError("The prompt is empty")
    bad = next((t for t in input_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"Token id {bad} is outside the vocabulary (size {vocab_size})")
    params = SamplingParams.from_dict(single.sampling_params)
    params.verify(vocab_size)
    params.verify_grammar(grammar_backend)
    if len(input_ids) >= context_len:
        raise ValueError(
            f"The prompt has {len(input_ids)} tokens, more than the model's context length "
            f"({context_len}) allows"
        )
    if len(input_ids) + params.max_new_tokens > context_len:
        raise ValueError(
            f"The prompt ({len(input_ids)} tokens) plus max_new_tokens "
            f"({params.max_new_tokens}) exceeds the context length ({context_len})"
        )
    if single.return_logprob:
        if single.logprob_start_len >= len(input_ids):
            raise ValueError(
                f"logprob_start_len ({single.logprob_start_len}) must be less than the "
                f"prompt length ({len(input_ids)})"
            )
        if single.logprob_start_len < -1:
            raise ValueError("logprob_start_len must be >= 0 (or -1 for none)")
        if not 0 <= single.top_logprobs_num <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}]")
    return params
