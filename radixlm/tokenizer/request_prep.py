"""One generate request made ready to send: its token ids, its media, its sampling params.

The prompt is tokenized in the tokenizer workers (unless it came as ids), its
images and videos are loaded and expanded into their tokens by the
multimodal processor, and the whole is validated (validation.py): every
problem is a ValueError (a 400) before anything reaches the scheduler. With
a reasoning parser, a grammar (or a thinking budget) learns whether the
output starts inside the think block or may open one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from radixlm.messages.mm_inputs import MultimodalInputs
from radixlm.messages.sampling_params import SamplingParams
from radixlm.server_args import ServerArgs
from radixlm.tokenizer.async_tokenizer import AsyncTokenizer
from radixlm.tokenizer.request_input import SingleReq
from radixlm.tokenizer.validation import (
    check_priority,
    check_token_only,
    prompt_too_long,
    validate_request,
)

if TYPE_CHECKING:
    from radixlm.multimodal.processor import BaseMultimodalProcessor


class PreparedReq(NamedTuple):
    input_ids: list[int]  # with each image's and video's run of pad values
    params: SamplingParams
    mm_inputs: MultimodalInputs | None


class RequestPreparer:
    def __init__(self, args: ServerArgs, tokenizer: Any, tokenizer_workers: AsyncTokenizer,
                 mm_processor: BaseMultimodalProcessor) -> None:
        """tokenizer: None with --skip-tokenizer-init (token ids only)."""
        self.args = args
        self.tokenizer = tokenizer
        self.tokenizer_workers = tokenizer_workers
        self.mm_processor = mm_processor

    async def prepare(self, single: SingleReq, model_info: dict[str, Any]) -> PreparedReq:
        """`single` ready to send, or ValueError; `model_info`: the scheduler's facts
        (vocab_size, context_length)."""
        if single.return_hidden_states and not self.args.enable_return_hidden_states:
            raise ValueError("return_hidden_states needs a server started with "
                             "--enable-return-hidden-states")
        check_priority(single.priority, self.args)
        vocab_size = model_info.get("vocab_size") or len(self.tokenizer)
        context_len = model_info.get("context_length", 1 << 30)
        if self.tokenizer is None:
            check_token_only(single)
        if single.input_ids is not None:
            input_ids = single.input_ids
            if len(input_ids) >= context_len:  # media only add tokens: refuse it now
                raise ValueError(prompt_too_long(len(input_ids), context_len))
        else:
            assert single.text is not None
            input_ids = await self.tokenizer_workers.encode(single.text, max_tokens=context_len)
        input_ids, mm_inputs = await self.mm_processor.process(
            input_ids, single.image_data or [], single.video_data or [], vocab_size, context_len)
        params = await self.tokenizer_workers.run(
            validate_request, single, input_ids, vocab_size, context_len,
            self.args.grammar_backend, mm_inputs, model_info.get("max_total_num_tokens"))
        self._check_budget(params)
        gated = params.grammar is not None or params.thinking_token_budget is not None
        if self.args.reasoning_parser and gated and params.reasoning_phase is None:
            params.reasoning_phase = await self.tokenizer_workers.run(
                self._reasoning_phase, input_ids)
        return PreparedReq(input_ids, params, mm_inputs)

    def _check_budget(self, params: SamplingParams) -> None:
        """thinking_token_budget: the server's --reasoning-budget by default; only with a
        reasoning parser (it knows the think block's tags)."""
        if params.thinking_token_budget is None:
            params.thinking_token_budget = self.args.reasoning_budget
        elif not self.args.reasoning_parser:
            raise ValueError("thinking_token_budget needs a server started with "
                             "--reasoning-parser (it knows where the think block ends)")

    def _reasoning_phase(self, input_ids: list[int]) -> str | None:
        """Where a grammar starts for this prompt (radixlm.reasoning.gate): after the think
        block the output starts in, or may open."""
        from radixlm.reasoning.gate import grammar_phase, reasoning_for_prompt

        assert self.args.reasoning_parser is not None
        tail = str(self.tokenizer.decode(input_ids[-16:], skip_special_tokens=False))
        return grammar_phase(reasoning_for_prompt(self.args.reasoning_parser, tail), tail)
