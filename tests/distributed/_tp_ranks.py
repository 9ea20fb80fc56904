"""One rank of a tensor-parallel run over scripted steps, as a script (see test_tp_logits.py).

    python tests/distributed/_tp_ranks.py RANK SIZE ADDR OUT MODEL_DIR...

Rank 0 runs `scripted_steps()` on each model and saves each step's logits to
OUT (a torch file: {model_dir: [logits per step]}); the other ranks follow with
the real worker loop (distributed/worker.py). `scripted_logits` with no TP
config gives the TP=1 reference in the caller's process.
"""

from __future__ import annotations

import os
import sys

import torch

from radixlm.distributed.parallel_state import TPConfig
from radixlm.messages.forward_step import ForwardStep, StepItem
from radixlm.model_executor.model_runner import ModelRunner
from radixlm.server_args import ServerArgs

ARGS = ServerArgs(dtype="float32", quantization="none", max_total_tokens=256,
                  max_running_requests=4, context_length=128)


def scripted_steps(vocab_size: int) -> list[tuple[ForwardStep, dict[int, list[int]]]]:
    """Steps with what the KVManager would write into req_to_token first ({row: slots}):
    A's prompt in two chunks (chunked prefill), B sharing A's first 16 tokens (a prefix
    hit: its row starts with A's slots), then one decode step of both."""
    g = torch.Generator().manual_seed(1)
    a = torch.randint(0, vocab_size, (20,), generator=g).tolist()
    b = a[:16] + torch.randint(0, vocab_size, (8,), generator=g).tolist()
    a_slots = list(range(1, 21))
    b_slots = a_slots[:16] + list(range(21, 29))

    def item(rid: str, row: int, prefix: int, ids: list[int]) -> StepItem:
        return StepItem(rid, row, prefix, ids, num_sample_rows=len(ids))  # logits of every row

    def step(items: list[StepItem], slots: list[int]) -> ForwardStep:
        return ForwardStep(items, torch.tensor(slots, dtype=torch.int64))

    return [
        (step([item("a", 0, 0, a[:12])], a_slots[:12]), {0: a_slots[:12]}),
        (step([item("a", 0, 12, a[12:])], a_slots[12:]), {0: a_slots}),
        (step([item("b", 1, 16, b[16:])], b_slots[16:]), {1: b_slots}),
        (step([item("a", 0, 20, [5]), item("b", 1, 24, [7])], [29, 30]),
         {0: a_slots + [29], 1: b_slots + [30]}),
    ]


def scripted_logits(model_dir: str, tp: TPConfig | None = None) -> list[torch.Tensor]:
    runner = ModelRunner(ARGS, model_dir, tp)
    table = runner.req_to_token_pool.req_to_token
    out = []
    for step, rows in scripted_steps(runner.vocab_size):
        for row, slots in rows.items():
            table[row, : len(slots)] = torch.tensor(slots)
        if runner.step_broadcaster is not None:
            runner.step_broadcaster.send_step(step)  # as runner.forward() does
        _, logits, _ = runner._forward_logits(step)  # [M, V]
        out.append(logits.clone())
    runner.stop_workers()
    return out


def main() -> None:
    from radixlm.distributed.worker import follow_steps

    rank, size, addr, out_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    tp = TPConfig(rank, size, addr, "gloo", timeout=60.0, num_local_ranks=size)
    results = {}
    for model_dir in sys.argv[5:]:
        if rank == 0:
            results[model_dir] = scripted_logits(model_dir, tp)
        else:
            follow_steps(ModelRunner(ARGS, model_dir, tp))
    if rank == 0:
        torch.save(results, out_path)
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
