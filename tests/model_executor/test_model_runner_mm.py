"""The model runner's multimodal plumbing, without a model: ForwardBatch.mm_inputs and
prompt logprobs at an image's pad ids (which are >= the vocabulary size)."""

from __future__ import annotations

import torch

from radixlm.messages.forward_step import ForwardStep, PromptLogprobSpec, StepItem
from radixlm.messages.mm_inputs import MultimodalInputs, MultimodalItem, pad_value_for
from radixlm.model_executor.model_runner import ModelRunner, _mm_inputs

VOCAB = 10


def _item(ids: list[int], mm: MultimodalInputs | None, num_sample_rows: int = 1,
          prompt_logprobs: PromptLogprobSpec | None = None) -> StepItem:
    return StepItem(rid="r", req_pool_idx=0, prefix_len=0, input_ids=ids,
                    num_sample_rows=num_sample_rows, prompt_logprobs=prompt_logprobs,
                    mm_inputs=mm)


def test_prompt_logprobs_are_none_at_pad_ids() -> None:
    pad = pad_value_for(123, VOCAB)
    mm = MultimodalInputs([MultimodalItem("image", 123, pad, 2, 2, torch.zeros(3, 2, 2))])
    ids = [1, 2, pad, pad, 3, 4]
    # Positions 0..4 score the prompt tokens 1..5.
    item = _item(ids, mm, num_sample_rows=0, prompt_logprobs=PromptLogprobSpec(0, ids[1:6], 2))
    step = ForwardStep([item], torch.zeros(6, dtype=torch.int64))
    runner = ModelRunner.__new__(ModelRunner)
    runner.vocab_size = VOCAB
    logits = torch.randn(5, VOCAB)
    input_lps = runner._prompt_logprobs(step, logits, [(0, 5)])[0]
    assert input_lps is not None
    tokens, tops = input_lps
    assert [e is None for e in tokens] == [False, True, True, False, False]
    assert [e[1] for e in tokens if e is not None] == [2, 3, 4]
    assert all(len(t) == 2 and t[0][1] < VOCAB for t in tops)  # top lists stay
    expected = torch.log_softmax(logits[3], -1)[3].item()
    assert abs(tokens[3][0] - expected) < 1e-5  # type: ignore[index]


def test_mm_inputs_reach_the_forward_batch_only_when_present() -> None:
    mm = MultimodalInputs([])
    with_image = _item([1, 2], mm)
    text = _item([3, 4], None)
    assert _mm_inputs([text.mm_inputs, with_image.mm_inputs]) == [None, mm]
    assert _mm_inputs([text.mm_inputs]) is None
