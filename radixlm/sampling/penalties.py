"""Logit edits applied before temperature: penalties, logit_bias, banned tokens.

Order inside `process_logits()` (sampler.py): penalties, then logit_bias, then
banned tokens, so a +100 bias beats any penalty and a ban beats any bias.

Penalties look at the request's OUTPUT tokens only, not its prompt (as SGLang
and the OpenAI API do; vLLM's repetition penalty also counts the prompt):
- repetition (HF / CTRL style): for every token that occurs in the output, a
  positive logit is divided by the penalty and a negative one multiplied;
- frequency: `logit -= frequency_penalty * count(token)`;
- presence: `logit -= presence_penalty * (count(token) > 0)`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain

import torch

from radixlm.messages.sampling_params import SamplingParams


@dataclass(frozen=True)
class Penalties:
    """One cell per distinct (row, token) of the penalized rows' outputs.

    Sparse on purpose: dense [B, V] count tensors cost several full passes
    over the logits per step (~10 ms each at [64, 49152] on the CPU), while
    the cells number at most the output tokens.
    """

    rows: torch.Tensor  # [N] int64 batch row of each cell
    cols: torch.Tensor  # [N] int64 token of each cell
    subtract: torch.Tensor  # [N] float32 frequency * count + presence
    repetition: torch.Tensor | None  # [N] float32; None when every penalty is 1

    @classmethod
    def build(
        cls,
        params: list[SamplingParams],
        output_ids: Sequence[Sequence[int] | None],
        vocab_size: int,
        device: torch.device,
    ) -> Penalties | None:
        """Count each row's output tokens on the CPU; None when no row needs a penalty."""
        outputs = [(i, ids) for i, (p, ids) in enumerate(zip(params, output_ids))
                   if p.has_penalties and ids]
        if not outputs:
            return None
        rows = [i for i, _ in outputs]
        lens = torch.tensor([len(ids) for _, ids in outputs])  # [R]
        ids = torch.tensor(list(chain.from_iterable(ids for _, ids in outputs)))  # [T]
        batch_rows = torch.repeat_interleave(torch.tensor(rows), lens)  # [T]
        cells, counts = torch.unique(batch_rows * vocab_size + ids, return_counts=True)  # [N]
        cell_rows = cells // vocab_size  # [N]

        def per_cell(name: str) -> torch.Tensor:  # [N] float32, the row's value of `name`
            values = torch.tensor([float(getattr(p, name)) for p in params])  # [B]
            return values[cell_rows]

        subtract = per_cell("frequency_penalty") * counts + per_cell("presence_penalty")
        has_repetition = any(params[i].repetition_penalty != 1.0 for i in rows)
        repetition = per_cell("repetition_penalty").to(device) if has_repetition else None
        return cls(
            rows=cell_rows.to(device),
            cols=(cells % vocab_size).to(device),
            subtract=subtract.to(device),
            repetition=repetition,
        )

    def apply(self, logits: torch.Tensor) -> None:
        """Penalize `logits` [B, V] float32 in place."""
        values = logits[self.rows, self.cols]  # [N]
        if self.repetition is not None:
            values = torch.where(values > 0, values / self.repetition, values * self.repetition)
        logits[self.rows, self.cols] = values - self.subtract


@dataclass(frozen=True)
class SparseLogits:
    """A sparse set of (row, token) cells of the batch's logits, with a value for each."""

    rows: torch.Tensor  # [N] int64
    cols: torch.Tensor  # [N] int64
    values: torch.Tensor  # [N] float32

    @classmethod
    def build(
        cls, cells: list[tuple[int, int, float]], device: torch.device
    ) -> SparseLogits | None:
        """From (row, token, value) triples; None when there are none."""
        if not cells:
            return None
        rows, cols, values = zip(*cells)
        return cls(
            rows=torch.tensor(rows, dtype=torch.int64, device=device),
            cols=torch.tensor(cols, dtype=torch.int64, device=device),
            values=torch.tensor(values, dtype=torch.float32, device=device),
        )

    def add_to(self, logits: torch.Tensor) -> None:
        """`logits[row, col] += value` for every cell, in place."""
        logits.index_put_((self.rows, self.cols), self.values, accumulate=True)

    def write_to(self, logits: torch.Tensor) -> None:
        """`logits[row, col] = value` for every cell, in place."""
        logits.index_put_((self.rows, self.cols), self.values)


def build_logit_bias(params: list[SamplingParams], device: torch.device) -> SparseLogits | None:
    """The batch's logit_bias entries as sparse cells to add."""
    cells = [
        (row, token, bias)
        for row, p in enumerate(params)
        for token, bias in (p.logit_bias or {}).items()
    ]
    return SparseLogits.build(cells, device)


def build_banned(
    params: list[SamplingParams],
    num_output_tokens: Sequence[int],
    eos_token_ids: set[int],
    device: torch.device,
) -> SparseLogits | None:
    """-inf cells for EOS and stop_token_ids of rows still short of min_new_tokens
    (`num_output_tokens[row]`: how many tokens the row generated so far)."""
    cells = [
        (row, token, float("-inf"))
        for row, p in enumerate(params)
        if num_output_tokens[row] < p.min_new_tokens
        for token in sorted(eos_token_ids.union(p.stop_token_ids))
    ]
    return SparseLogits.build(cells, device)
