"""The model runner's multimodal plumbing, without a model: ForwardBatch.mm_inputs and
prompt logprobs at an image's pad ids (which are >= the vocabulary size)."""

from __future__ import annotations

import torch

from radixlm.io_struct import TokenizedGenerateReq
from radixlm.model_executor.model_runner import ModelRunner, _mm_inputs
from radixlm.multimodal.mm_inputs import MultimodalInputs, MultimodalItem, pad_value_for
from radixlm.sampling.sampling_params import SamplingParams
from radixlm.scheduler.request import Req, ScheduledReq, StepPlan

VOCAB = 10


def _req(ids: list[int], mm: MultimodalInputs | None) -> Req:
    sp = SamplingParams(max_new_tokens=1)
    msg = TokenizedGenerateReq(rid="r", input_ids=ids, sampling_params=sp, return_logprob=True,
                               logprob_start_len=0, top_logprobs_num=2, mm_inputs=mm)
    return Req(msg, 0)


def test_prompt_logprobs_are_none_at_pad_ids() -> None:
    pad = pad_value_for(123, VOCAB)
    mm = MultimodalInputs([MultimodalItem("image", 123, pad, 2, 2, torch.zeros(3, 2, 2))])
    req = _req([1, 2, pad, pad, 3, 4], mm)
    item = ScheduledReq(req, prefix_len=0, extend_len=6, samples=False, logprob_positions=(0, 5))
    plan = StepPlan([item], torch.zeros(6, dtype=torch.int64))
    runner = ModelRunner.__new__(ModelRunner)
    runner.vocab_size = VOCAB
    logits = torch.randn(5, VOCAB)
    result = runner._sample(plan, logits, [-1], [(0, 5)])
    input_lps = result.input_logprobs[0]
    assert input_lps is not None
    tokens, tops = input_lps
    assert [e is None for e in tokens] == [False, True, True, False, False]
    assert [e[1] for e in tokens if e is not None] == [2, 3, 4]
    assert all(len(t) == 2 and t[0][1] < VOCAB for t in tops)  # top lists stay
    expected = torch.log_softmax(logits[3], -1)[3].item()
    assert abs(tokens[3][0] - expected) < 1e-5  # type: ignore[index]


def test_mm_inputs_reach_the_forward_batch_only_when_present() -> None:
    mm = MultimodalInputs([])
    with_image = ScheduledReq(_req([1, 2], mm), 0, 2, True)
    text = ScheduledReq(_req([3, 4], None), 0, 2, True)
    loc = torch.zeros(4, dtype=torch.int64)
    assert _mm_inputs(StepPlan([text, with_image], loc)) == [None, mm]
    assert _mm_inputs(StepPlan([text], loc[:2])) is None
