"""The scheduler → runner step contract: a plain object that pickles cheaply (what tensor
parallelism broadcasts), and a runner that imports nothing from the scheduler."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import torch

from radixlm.messages.forward_step import (
    ForwardStep,
    PromptLogprobSpec,
    SamplingSpec,
    StepItem,
    VocabMask,
)
from radixlm.messages.io_struct import TokenizedGenerateReq
from radixlm.messages.mm_inputs import MultimodalInputs, MultimodalItem
from radixlm.messages.sampling_params import SamplingParams
from radixlm.scheduler.request import Req
from radixlm.scheduler.step_plan import ScheduledReq


def _decode_step(num_items: int) -> ForwardStep:
    """Each request with its own SamplingParams, as in a real step."""
    items = [StepItem(rid=f"r{i}", req_pool_idx=i, prefix_len=100 + i, input_ids=[i + 7],
                      num_sample_rows=1,
                      sampling=SamplingSpec(SamplingParams(max_new_tokens=64, temperature=0.7,
                                                           top_p=0.9, stop=["\n\n"]),
                                            num_output_tokens=3))
             for i in range(num_items)]
    return ForwardStep(items, torch.arange(1, num_items + 1, dtype=torch.int64))


def test_step_round_trips_through_pickle() -> None:
    image = MultimodalItem("image", 123, 10_000, 2, 4, torch.rand(3, 4, 4))
    mask = torch.full((2, 2), -1, dtype=torch.int32)
    mask[1, 0] = 5
    step = ForwardStep(
        items=[
            StepItem("a", 0, 0, [1, 2, 10_000, 10_000, 10_000, 10_000, 3], num_sample_rows=1,
                     sampling=SamplingSpec(SamplingParams(regex="(a|b)"), 0, seed=7,
                                           return_logprob=True, top_logprobs_num=2),
                     prompt_logprobs=PromptLogprobSpec(0, [2, 10_000, 10_000, 10_000], 2),
                     mm_inputs=MultimodalInputs([image])),
            StepItem("b", 1, 5, [4, 5, 6], num_sample_rows=0),
            StepItem("c", 2, 9, [8], num_sample_rows=1,
                     sampling=SamplingSpec(SamplingParams(frequency_penalty=0.5), 2,
                                           output_ids=[8, 8])),
        ],
        out_cache_loc=torch.arange(1, 12, dtype=torch.int64),
        vocab_mask=VocabMask(mask, rows=[1]),
        released_rids=["old"],
    )
    copy = pickle.loads(pickle.dumps(step))
    assert type(copy) is ForwardStep
    assert [(i.rid, i.req_pool_idx, i.prefix_len, i.input_ids, i.num_sample_rows)
            for i in copy.items] == [(i.rid, i.req_pool_idx, i.prefix_len, i.input_ids,
                                      i.num_sample_rows) for i in step.items]
    assert [i.sampling for i in copy.items] == [i.sampling for i in step.items]
    assert copy.items[0].prompt_logprobs == step.items[0].prompt_logprobs
    assert copy.items[2].sampling is not None and copy.items[2].sampling.output_ids == [8, 8]
    copied_image = copy.items[0].mm_inputs.items[0]  # type: ignore[union-attr]
    assert torch.equal(copied_image.pixel_values, image.pixel_values)
    assert torch.equal(copy.out_cache_loc, step.out_cache_loc)
    assert copy.vocab_mask is not None and torch.equal(copy.vocab_mask.bitmask, mask)
    assert copy.vocab_mask.rows == [1] and copy.released_rids == ["old"]
    assert copy.num_tokens == 11 and copy.num_sample_rows == 2
    assert list(copy.items[1].positions) == [5, 6, 7]


def test_a_decode_step_pickles_small() -> None:
    """64 decoding requests: a few hundred bytes each (what TP broadcasts per step).

    NOTE: bytes, not seconds: a timed assertion fails on a loaded machine; the time
    is printed by scripts/profile_step.py-style benchmarks, not asserted here.
    """
    step = _decode_step(64)
    data = pickle.dumps(step, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(data) < 64 * 400, len(data)
    assert len(pickle.dumps(pickle.loads(data), protocol=pickle.HIGHEST_PROTOCOL)) == len(data)


def test_scheduler_sends_media_only_with_the_tokens_they_cover() -> None:
    image = MultimodalItem("image", 1, 10_000, 2, 3, torch.zeros(3, 2, 2))
    msg = TokenizedGenerateReq(rid="r", input_ids=[1, 2, 10_000, 10_000, 10_000, 3, 4],
                               sampling_params=SamplingParams(max_new_tokens=2),
                               mm_inputs=MultimodalInputs([image]))
    req = Req(msg, 0)
    req.req_pool_idx = 0
    assert ScheduledReq.plan(req, 3).to_step_item().mm_inputs is req.mm_inputs  # covers 2
    req.kv_len = 5
    item = ScheduledReq.plan(req, 2).to_step_item()
    assert item.mm_inputs is None and item.input_ids == [3, 4] and item.num_sample_rows == 1


def test_model_executor_imports_nothing_from_the_scheduler() -> None:
    """Import every model_executor module in a fresh interpreter and list what came in."""
    code = (
        "import json, sys, pkgutil, importlib, radixlm.model_executor as me\n"
        "for m in pkgutil.iter_modules(me.__path__):\n"
        "    importlib.import_module('radixlm.model_executor.' + m.name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('radixlm.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300)
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "radixlm.model_executor.model_runner" in loaded
    assert "radixlm.messages.forward_step" in loaded
    assert [m for m in loaded if m.startswith(("radixlm.scheduler", "radixlm.tokenizer.",
                                               "radixlm.detokenizer"))] == []
