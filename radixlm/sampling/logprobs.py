"""Log-probabilities of chosen tokens and of each row's top-k, from raw logits."""

from __future__ import annotations

from typing import NamedTuple

import torch

# (logprob, token_id), as in io_struct.LogprobEntry
LogprobEntry = tuple[float, int]


class LogprobResult(NamedTuple):
    token_logprobs: list[LogprobEntry]  # [M] (logprob of token_ids[i], token_ids[i])
    top_logprobs: list[list[LogprobEntry]]  # [M][top_k_nums[i]] most probable first


def compute_logprobs(
    logits: torch.Tensor, token_ids: torch.Tensor, top_k_nums: list[int]
) -> LogprobResult:
    """Log-softmax of RAW model logits (before temperature, penalties or bias).

    logits: [M, V]; token_ids: [M] int64; top_k_nums: [M], 0 for no top list.
    Four device-to-host copies in all, whatever M is.
    """
    num_rows = logits.shape[0]
    if token_ids.shape != (num_rows,) or len(top_k_nums) != num_rows:
        raise ValueError("token_ids and top_k_nums need one entry per row of logits")
    logits = logits.float()
    # NOTE: x - logsumexp(x) instead of log_softmax: no second [M, V] tensor.
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)  # [M, 1]
    chosen = (logits.gather(1, token_ids.view(-1, 1)) - lse).squeeze(1)  # [M]
    token_logprobs = list(zip(chosen.tolist(), token_ids.tolist()))
    max_k = min(max(top_k_nums, default=0), logits.shape[1])
    if max_k == 0:
        return LogprobResult(token_logprobs, [[] for _ in range(num_rows)])
    top_values, top_ids = logits.topk(max_k, dim=-1)  # [M, K] descending
    values_list = (top_values - lse).tolist()
    ids_list = top_ids.tolist()
    top_logprobs = [
        list(zip(values_list[i][:k], ids_list[i][:k])) for i, k in enumerate(top_k_nums)
    ]
    return LogprobResult(token_logprobs, top_logprobs)
