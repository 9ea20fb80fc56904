"""Top-k, top-p and min-p, each as one probability threshold per row.

Every filter keeps the tokens whose probability is >= a per-row threshold, so
a row's allowed set depends only on its own probabilities (never on a sort's
tie order or on the other rows of the batch), and sampling afterwards runs over
the vocabulary in its natural order:
- top-k: the k-th largest probability. Tokens tied with it are kept too, as
  in HF's TopKLogitsWarper and vLLM.
- top-p: applied to the top-k set renormalized (HF / vLLM order): the smallest
  run of most probable tokens whose mass reaches top_p; the threshold is the
  probability of its last token (ties with it kept).
- min-p: min_p times the row's largest probability.
The row's threshold is the largest of the three.

NOTE: on this project's CPU, sorting [64, 49152] float32 costs ~30 ms with
numpy (~400 ms with torch.sort) and topk(256) ~15 ms, so top-p looks for its
cut among the TOP_P_WINDOW most probable tokens and sorts only the rows whose
cut lies beyond them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from radixlm.messages.sampling_params import SamplingParams

TOP_P_WINDOW = 256


@dataclass(frozen=True)
class RankFilter:
    """Top-k / top-p of the F sampled rows that use either."""

    rows: torch.Tensor | None  # [F] int64 positions among the S sampled rows; None: all
    top_ks: torch.Tensor  # [F] int64, 0 where top-k is off
    top_ps: torch.Tensor  # [F] float32, 1.0 where top-p is off
    max_top_k: int  # largest enabled top-k, 0 if none
    use_top_p: bool


@dataclass(frozen=True)
class SamplingFilters:
    """Filters of the S sampled rows of a batch (greedy rows never get here)."""

    rank: RankFilter | None  # None: no row uses top-k or top-p
    min_ps: torch.Tensor | None  # [S] float32; None: no row uses min-p

    @classmethod
    def build(
        cls, params: list[SamplingParams], vocab_size: int, device: torch.device
    ) -> SamplingFilters | None:
        """`params` of the sampled rows, in order; None when no row filters anything."""
        top_ks = [p.top_k if 0 < p.top_k < vocab_size else 0 for p in params]
        top_ps = [p.top_p for p in params]
        rank_rows = [j for j in range(len(params)) if top_ks[j] > 0 or top_ps[j] < 1.0]
        use_min_p = any(p.min_p > 0.0 for p in params)
        if not rank_rows and not use_min_p:
            return None
        rank = None
        if rank_rows:
            all_rows = len(rank_rows) == len(params)
            rank = RankFilter(
                rows=None if all_rows else torch.tensor(rank_rows, device=device),
                top_ks=torch.tensor([top_ks[j] for j in rank_rows], device=device),
                top_ps=torch.tensor(
                    [top_ps[j] for j in rank_rows], dtype=torch.float32, device=device
                ),
                max_top_k=max(top_ks[j] for j in rank_rows),
                use_top_p=any(top_ps[j] < 1.0 for j in rank_rows),
            )
        min_ps = None
        if use_min_p:
            min_ps = torch.tensor([p.min_p for p in params], dtype=torch.float32, device=device)
        return cls(rank=rank, min_ps=min_ps)


def apply_filters(probs: torch.Tensor, filters: SamplingFilters) -> None:
    """Zero, in place, the probabilities outside each row's allowed set.

    probs: [S, V] float32 softmax rows, each summing to 1 (not renormalized
    afterwards: sampling does not need it). A row's most probable token is
    always kept.
    """
    num_rows = probs.shape[0]
    thresholds = torch.zeros(num_rows, dtype=probs.dtype, device=probs.device)  # [S]
    if filters.rank is not None:
        rank = filters.rank
        if rank.rows is None:
            thresholds = _rank_thresholds(probs, rank)
        else:
            thresholds[rank.rows] = _rank_thresholds(probs.index_select(0, rank.rows), rank)
    if filters.min_ps is not None:
        thresholds = torch.maximum(thresholds, filters.min_ps * probs.amax(dim=-1))
    probs.masked_fill_(probs < thresholds.unsqueeze(1), 0.0)


def _rank_thresholds(probs: torch.Tensor, rank: RankFilter) -> torch.Tensor:
    """Top-k and top-p thresholds [F] of probs [F, V]."""
    vocab_size = probs.shape[1]
    window = min(vocab_size, max(rank.max_top_k, TOP_P_WINDOW if rank.use_top_p else 1))
    top = probs.topk(window, dim=-1).values  # [F, W] descending
    thresholds = torch.zeros(probs.shape[0], dtype=probs.dtype, device=probs.device)  # [F]
    if rank.max_top_k > 0:
        kth = top.gather(1, (rank.top_ks.clamp(min=1) - 1).unsqueeze(1)).squeeze(1)  # [F]
        thresholds = torch.where(rank.top_ks > 0, kth, thresholds)
    if rank.use_top_p:
        top_p_thresholds = _top_p_thresholds(probs, top, thresholds, rank.top_ps)
        thresholds = torch.maximum(thresholds, top_p_thresholds)
    return thresholds


def _top_p_thresholds(
    probs: torch.Tensor, top: torch.Tensor, top_k_thresholds: torch.Tensor, top_ps: torch.Tensor
) -> torch.Tensor:
    """Top-p thresholds [F] over the top-k sets; 0 where top-p is off.

    probs: [F, V]; top: [F, W] the W largest of each row, descending;
    top_k_thresholds: [F] (0 where top-k is off); top_ps: [F].
    """
    floor = top_k_thresholds.unsqueeze(1)  # [F, 1]
    kept = top.masked_fill(top < floor, 0.0)  # [F, W]
    # Mass of the top-k set: the window holds it whole (W >= k), but for tokens
    # tied with the k-th beyond the window; 1 where top-k is off (softmax rows).
    total = torch.where(top_k_thresholds > 0, kept.sum(dim=-1), 1.0)  # [F]
    targets = (top_ps * total).unsqueeze(1)  # [F, 1]
    cut = torch.searchsorted(kept.cumsum(dim=-1), targets)  # [F, 1] first rank reaching target
    window = top.shape[1]
    cut_values = kept.gather(1, cut.clamp(max=window - 1)).squeeze(1)  # [F]
    if window < probs.shape[1]:
        # NOTE: a device-to-host sync; only rows whose top-p mass is spread
        # beyond the window pay for a full sort.
        beyond = ((cut.squeeze(1) >= window) & (top_ps < 1.0)).nonzero().squeeze(1)  # [X]
        if beyond.numel() > 0:
            ranked = _sort_descending(probs.index_select(0, beyond))  # [X, V]
            ranked.masked_fill_(ranked < floor[beyond], 0.0)
            full_cut = torch.searchsorted(ranked.cumsum(dim=-1), targets[beyond])  # [X, 1]
            full_cut.clamp_(max=probs.shape[1] - 1)
            cut_values[beyond] = ranked.gather(1, full_cut).squeeze(1)
    return torch.where(top_ps < 1.0, cut_values, 0.0)


def _sort_descending(values: torch.Tensor) -> torch.Tensor:
    """values [X, V] sorted along V, largest first."""
    if values.device.type == "cpu":
        # NOTE: numpy's SIMD sort is ~10x faster than torch.sort on the CPU.
        return torch.from_numpy(np.sort(values.detach().numpy(), axis=-1)[:, ::-1].copy())
    return values.sort(dim=-1, descending=True).values
