from __future__ import annotations

import math

import pytest
import torch

from radixlm.messages.sampling_params import SamplingParams
from radixlm.sampling.filters import TOP_P_WINDOW
from radixlm.sampling.logprobs import compute_logprobs
from radixlm.sampling.sampler import SamplingBatchInfo, process_logits, sample

EOS = 0


def make_info(
    params: list[SamplingParams],
    vocab_size: int,
    output_ids: list[list[int]] | None = None,
    generators: list[torch.Generator | None] | None = None,
) -> SamplingBatchInfo:
    return SamplingBatchInfo.from_params(
        params,
        output_ids if output_ids is not None else [[] for _ in params],
        generators if generators is not None else [None] * len(params),
        vocab_size,
        {EOS},
    )


def run(logits: torch.Tensor, params: list[SamplingParams], **kwargs: object) -> torch.Tensor:
    return sample(logits.clone(), make_info(params, logits.shape[1], **kwargs))  # type: ignore[arg-type]


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def allowed_by_rank(probs: list[float], top_k: int, top_p: float, min_p: float) -> set[int]:
    """Reference filter on distinct probabilities: sort, cut, renormalize (HF order)."""
    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    if top_k > 0:
        order = order[:top_k]
    mass = sum(probs[i] for i in order)
    kept, acc = [], 0.0
    for i in order:
        kept.append(i)
        acc += probs[i] / mass
        if acc >= top_p:
            break
    return {i for i in kept if probs[i] >= min_p * max(probs)}


def test_temperature_zero_is_argmax_with_lowest_id_on_ties() -> None:
    logits = torch.randn(6, 50, generator=seeded(0))
    logits[2, 7] = logits[2, 30] = logits[2].max() + 1.0  # tie: 7 wins
    ids = run(logits, [SamplingParams(temperature=0.0)] * 6)
    assert torch.equal(ids, torch.argmax(logits, dim=-1))
    assert ids[2].item() == 7


def test_top_k_one_is_greedy_at_temperature_one() -> None:
    logits = torch.randn(16, 40, generator=seeded(1))
    ids = run(logits, [SamplingParams(temperature=1.0, top_k=1)] * 16)
    assert torch.equal(ids, torch.argmax(logits, dim=-1))


def test_mixed_batch_keeps_greedy_rows_greedy() -> None:
    logits = torch.randn(8, 30, generator=seeded(2))
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.9, top_p=0.8) for i in range(8)]
    ids = run(logits, params)
    assert ids.shape == (8,) and ids.dtype == torch.int64
    assert torch.equal(ids[1::2], torch.argmax(logits[1::2], dim=-1))
    assert bool(((ids >= 0) & (ids < 30)).all())


def test_sampling_follows_the_distribution() -> None:
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    num_draws = 20000
    logits = probs.log().expand(num_draws, -1).contiguous()
    ids = run(logits, [SamplingParams()] * num_draws)
    freq = torch.bincount(ids, minlength=5).float() / num_draws
    assert freq[4].item() == 0.0
    assert torch.allclose(freq, probs, atol=0.015)


@pytest.mark.parametrize(
    "top_k,top_p,min_p",
    [(3, 1.0, 0.0), (-1, 0.6, 0.0), (-1, 1.0, 0.5), (4, 0.7, 0.0), (6, 0.9, 0.3), (-1, 0.05, 0.0)],
)
def test_filters_never_sample_outside_allowed_set(top_k: int, top_p: float, min_p: float) -> None:
    raw = [0.22, 0.02, 0.17, 0.12, 0.1, 0.08, 0.07, 0.06, 0.05, 0.04, 0.03, 0.025, 0.015]
    probs = [p / sum(raw) for p in raw]
    allowed = allowed_by_rank(probs, top_k, top_p, min_p)
    num_draws = 3000
    logits = torch.tensor(probs).log().expand(num_draws, -1).contiguous()
    params = SamplingParams(temperature=1.0, top_k=top_k, top_p=top_p, min_p=min_p)
    seen = set(run(logits, [params] * num_draws).tolist())
    assert seen == allowed  # never outside, and every allowed token shows up


def test_top_p_cut_beyond_the_window_uses_the_full_sort() -> None:
    vocab_size = 4 * TOP_P_WINDOW
    logits = torch.linspace(0.0, 1.0, vocab_size)  # nearly flat, all distinct
    probs = torch.softmax(logits, dim=-1).tolist()
    allowed = allowed_by_rank(probs, -1, 0.5, 0.0)
    assert len(allowed) > TOP_P_WINDOW
    num_draws = 2000
    ids = run(logits.expand(num_draws, -1).contiguous(), [SamplingParams(top_p=0.5)] * num_draws)
    seen = set(ids.tolist())
    assert seen <= allowed and len(seen) > TOP_P_WINDOW


def test_seeded_generators_repeat() -> None:
    logits = torch.randn(1, 100, generator=seeded(3))
    params = [SamplingParams(temperature=1.3)]
    first = [run(logits, params, generators=[g]).item() for g in [seeded(7)] for _ in range(20)]
    g = seeded(7)
    second = [run(logits, params, generators=[g]).item() for _ in range(20)]
    assert first == second and len(set(first)) > 1


@pytest.mark.parametrize(
    "target",
    [
        SamplingParams(temperature=1.0),
        SamplingParams(temperature=0.7, top_p=0.8),
        SamplingParams(temperature=1.5, top_k=20, top_p=0.9),
        SamplingParams(temperature=1.0, min_p=0.05, top_p=0.3),
        # cuts at ranks ~245..260: alone some lie beyond the 256-token window
        # (full sort), batched they lie inside the wider top-k window
        SamplingParams(temperature=2.5, top_p=0.55),
    ],
)
def test_seeded_request_is_independent_of_its_batch(target: SamplingParams) -> None:
    vocab_size = 1000
    steps = [torch.randn(5, vocab_size, generator=seeded(s)) * 2 for s in range(12)]
    others = [
        SamplingParams(temperature=0.0),
        SamplingParams(top_k=TOP_P_WINDOW + 50),  # widens the batch's top-k window
        SamplingParams(top_p=0.95, frequency_penalty=0.5),
        SamplingParams(min_p=0.2),
    ]

    alone, g_alone = [], seeded(11)
    for logits in steps:
        alone.append(run(logits[2:3], [target], generators=[g_alone]).item())

    batched, g_batched = [], seeded(11)
    for logits in steps:
        params = others[:2] + [target] + others[2:]
        gens = [None, seeded(5), g_batched, None, seeded(9)]
        outputs = [[1, 2, 3]] * 5
        batched.append(run(logits, params, generators=gens, output_ids=outputs)[2].item())
    assert alone == batched


def test_penalties_change_logits_as_specified() -> None:
    vocab_size = 10
    logits = torch.tensor([[1.0, -1.0, 2.0, -2.0, 0.5, 0.0, 3.0, 1.0, 1.0, 1.0]] * 2)
    params = [
        SamplingParams(frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=2.0),
        SamplingParams(),
    ]
    outputs = [[2, 3, 3, 9, 9, 9], [2, 3]]
    processed = logits.clone()
    process_logits(processed, make_info(params, vocab_size, output_ids=outputs))

    expected = logits[0].clone()
    for token, count in {2: 1, 3: 2, 9: 3}.items():
        value = expected[token].item()
        value = value / 2.0 if value > 0 else value * 2.0
        expected[token] = value - 0.5 * count - 0.3
    assert torch.allclose(processed[0], expected)
    assert torch.equal(processed[1], logits[1])  # no penalties on that row


def test_logit_bias_forces_a_token() -> None:
    logits = torch.randn(64, 50, generator=seeded(4))
    params = [
        SamplingParams(temperature=0.0 if i % 4 == 0 else 1.0, logit_bias={17: 100.0})
        for i in range(64)
    ]
    assert set(run(logits, params).tolist()) == {17}


def test_min_new_tokens_blocks_eos_and_stop_tokens() -> None:
    logits = torch.zeros(200, 20)
    logits[:, EOS] = 50.0
    logits[:, 5] = 49.0
    params = [SamplingParams(min_new_tokens=3, stop_token_ids=[5], top_p=0.5)] * 200
    short = run(logits, params, output_ids=[[7, 7]] * 200)
    assert not bool(((short == EOS) | (short == 5)).any())
    done = run(logits, params, output_ids=[[7, 7, 7]] * 200)
    assert set(done.tolist()) == {EOS}


def test_compute_logprobs_matches_log_softmax() -> None:
    logits = torch.randn(5, 30, generator=seeded(6)) * 3
    token_ids = torch.tensor([0, 4, 29, 7, 7])
    top_k_nums = [0, 1, 5, 30, 3]
    result = compute_logprobs(logits, token_ids, top_k_nums)
    reference = torch.log_softmax(logits, dim=-1)
    for i, (logprob, token) in enumerate(result.token_logprobs):
        assert token == token_ids[i].item()
        assert math.isclose(logprob, reference[i, token].item(), abs_tol=1e-5)
    for i, tops in enumerate(result.top_logprobs):
        assert len(tops) == top_k_nums[i]
        values = [v for v, _ in tops]
        assert values == sorted(values, reverse=True)
        expected = torch.topk(reference[i], top_k_nums[i]).values.tolist() if tops else []
        assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(values, expected))
        assert all(math.isclose(v, reference[i, t].item(), abs_tol=1e-5) for v, t in tops)


def test_empty_batch() -> None:
    ids = sample(torch.zeros(0, 10), make_info([], 10))
    assert ids.shape == (0,)


@pytest.mark.parametrize("temperatures", [[0.0] * 5, [0.8] * 5, [0.0, 0.8, 0.0, 0.8, 1.0]])
def test_rows_without_a_distribution_are_invalid(temperatures: list[float]) -> None:
    from radixlm.sampling.sampler import sample_checked

    inf = float("inf")
    logits = torch.randn(5, 16)
    logits[1, 3] = float("nan")  # one NaN spoils the row
    logits[2] = -inf  # every token masked
    logits[3, 5] = inf if temperatures[3] > 0 else float("nan")
    params = [SamplingParams(temperature=t) for t in temperatures]
    out = sample_checked(logits.clone(), make_info(params, 16))
    assert out.valid.tolist() == [True, False, False, False, True]
    assert all(0 <= t < 16 for t in out.next_ids.tolist())
    # The batch's good rows sample as they would alone.
    for row in (0, 4):
        alone = sample_checked(logits[row : row + 1].clone(), make_info([params[row]], 16))
        if temperatures[row] == 0:
            assert alone.next_ids.item() == out.next_ids[row].item()


def test_a_penalty_that_makes_nan_is_caught() -> None:
    from radixlm.sampling.sampler import sample_checked

    logits = torch.full((1, 8), float("-inf"))
    logits[0, 2] = 1.0  # a grammar allows only token 2, which was already generated
    params = [SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=2.0)]
    info = make_info(params, 8, output_ids=[[2, 2]])
    out = sample_checked(logits.clone(), info)
    assert out.valid.tolist() == [True] and out.next_ids.tolist() == [2]
    logits[0, 2] = float("nan")
    assert sample_checked(logits.clone(), info).valid.tolist() == [False]
