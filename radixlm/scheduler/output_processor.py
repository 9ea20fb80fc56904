"""Who finished, and the outputs that go to the detokenizer.

A request finishes with "stop" (a stop token id, EOS unless ignore_eos, or a
stop string or stop regex found in its decoded tail), "length" (max_new_tokens or the
context length), or "abort". Outputs go to the detokenizer as deltas: every
`stream_interval` steps for streaming requests, and always once at the end.
A pooling request's answer (its vector) is kept in `embedding_outs` instead.
"""

from __future__ import annotations

from typing import Any

from radixlm.detokenizer.stop_strings import find_stop_string
from radixlm.messages.io_struct import EmbeddingOut, FinishReason, SpecCounts, TokenOut
from radixlm.messages.stop_regex import MATCH_TIMEOUT, find_first_regex, tail_tokens_needed
from radixlm.scheduler.pooling import embedding_out
from radixlm.scheduler.request import Req
from radixlm.server_args import ServerArgs
from radixlm.tokenizer_utils import TokenDecoder


class OutputProcessor:
    """Finish checks after a token is appended, and the outputs due to the detokenizer."""

    def __init__(
        self, args: ServerArgs, tokenizer: TokenDecoder | None, eos_token_ids: set[int],
        context_len: int,
    ) -> None:
        """tokenizer: decodes output tails for stop strings (None: requests have none)."""
        self.stream_interval = args.stream_interval
        self.reports_spec = args.speculative_algorithm is not None
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids
        self.context_len = context_len
        self.pending_finished: list[Req] = []  # finished since the last collect()
        self.embedding_outs: list[EmbeddingOut] = []  # pooling answers, for the TokenizerManager
        self.num_prompt_tokens_total = 0
        self.num_cached_tokens_total = 0
        self.num_cached_tokens_disk_total = 0  # the part of it read from the disk tier
        self.num_generation_tokens_total = 0
        self.num_finished_total = 0

    # ------------------------------------------------------------------ finishing

    def check_finished(self, req: Req, token_id: int) -> FinishReason | None:
        """Why `req` ends after appending `token_id`, or None."""
        params = req.sampling_params
        if req.num_output_tokens >= params.min_new_tokens:
            if token_id in params.stop_token_ids:
                return FinishReason("stop", matched=token_id)
            if not params.ignore_eos and token_id in self.eos_token_ids:
                return FinishReason("stop", matched=token_id)
        return self.check_length_and_stop_strings(req)

    def check_length_and_stop_strings(self, req: Req, num_new_tokens: int = 1) -> FinishReason | None:
        """The finish checks that do not look at the last token id (also run after a jump
        that appended `num_new_tokens`)."""
        params = req.sampling_params
        num_output = req.num_output_tokens
        if num_output >= params.max_new_tokens:
            return FinishReason("length")
        if req.num_tokens >= self.context_len:
            return FinishReason("length")
        if params.stop and num_output >= params.min_new_tokens and self.tokenizer is not None:
            window = max(len(s) for s in params.stop) + 3 + num_new_tokens
            tail = self.tokenizer.decode(
                req.output_tail(max(num_output - window, 0)),
                skip_special_tokens=params.skip_special_tokens,
            )
            matched = find_stop_string(tail, params.stop)
            if matched is not None:
                return FinishReason("stop", matched=matched)
        if (params.stop_regex and num_output >= params.min_new_tokens
                and self.tokenizer is not None):
            return self._check_stop_regex(req, num_new_tokens)
        return None

    def _check_stop_regex(self, req: Req, num_new_tokens: int) -> FinishReason | None:
        params = req.sampling_params
        assert self.tokenizer is not None, "validation refuses stop_regex without a tokenizer"
        window = tail_tokens_needed(params.stop_regex) + num_new_tokens
        tail = self.tokenizer.decode(
            req.output_tail(max(req.num_output_tokens - window, 0)),
            skip_special_tokens=params.skip_special_tokens,
        )
        try:
            match = find_first_regex(tail, params.stop_regex)
        except TimeoutError:
            return FinishReason("abort", status_code=400, message=(
                f"stop_regex took over {MATCH_TIMEOUT:g} s to search the output"))
        if match is None:
            return None
        return FinishReason("stop", matched=match.pattern, matched_regex=True)

    # ------------------------------------------------------------------ outputs

    def collect(self, running: list[Req]) -> list[TokenOut]:
        """Outputs due now: every finished request, and streams at their interval."""
        outs = []
        for req in self.pending_finished:
            if req.pooling is not None:
                self.embedding_outs.append(embedding_out(req))
            else:
                outs.append(self._token_out(req))
            self.num_finished_total += 1
            self.num_prompt_tokens_total += req.num_prompt_tokens
            self.num_cached_tokens_total += req.num_cached_tokens or 0
            self.num_cached_tokens_disk_total += req.num_cached_tokens_disk or 0
        self.pending_finished = []
        for req in running:
            if req.stream and req.num_steps_since_send >= self.stream_interval:
                outs.append(self._token_out(req))
        return outs

    def _token_out(self, req: Req) -> TokenOut:
        params = req.sampling_params
        start = req.num_sent_tokens
        out = TokenOut(
            rid=req.rid,
            new_token_ids=req.output_tail(start),
            finished_reason=req.finished_reason,
            prompt_tokens=req.num_prompt_tokens,
            completion_tokens=req.num_output_tokens,
            cached_tokens=req.num_cached_tokens or 0,
            cached_tokens_disk=req.num_cached_tokens_disk or 0,
            forward_steps=req.num_forward_steps,
            jump_forward_tokens=req.num_jump_forward_tokens,
            spec=SpecCounts(req.num_spec_verify_steps, req.num_spec_draft_tokens,
                            req.num_spec_accepted_tokens) if self.reports_spec else None,
            skip_special_tokens=params.skip_special_tokens,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
            stop=params.stop,
            stop_regex=params.stop_regex,
            no_stop_trim=params.no_stop_trim,
        )
        if req.return_logprob:
            out.output_token_logprobs = req.output_token_logprobs[start:]
            out.output_top_logprobs = req.output_top_logprobs[start:]
            if req.input_logprobs_done and not req.input_logprobs_sent:
                out.input_token_logprobs = req.input_token_logprobs
                out.input_top_logprobs = req.input_top_logprobs
                req.input_logprobs_sent = True
        if req.return_hidden_states:
            out.hidden_states = req.hidden_states[req.num_sent_hidden_states :]
            req.num_sent_hidden_states = len(req.hidden_states)
        req.num_sent_tokens = req.num_output_tokens
        req.num_steps_since_send = 0
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "num_finished_reqs": self.num_finished_total,
            "num_prompt_tokens_total": self.num_prompt_tokens_total,
            "num_cached_prompt_tokens_total": self.num_cached_tokens_total,
            "num_cached_prompt_tokens_disk_total": self.num_cached_tokens_disk_total,
            "num_generation_tokens_total": self.num_generation_tokens_total,
        }
