"""Jump-forward retokenization (`plan_jump`) on the default model's tokenizer."""

from __future__ import annotations

from typing import Any

import pytest

from radixlm.scheduler.jump_forward import MAX_RETOKENIZE_TOKENS, plan_jump


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from radixlm.model_loader.model_path import resolve_model_dir
    from radixlm.tokenizer_utils import load_decode_tokenizer

    try:
        return load_decode_tokenizer(resolve_model_dir(None))
    except Exception as e:  # noqa: BLE001 - the default model is optional for unit tests
        pytest.skip(f"default model unavailable: {e}")


def _apply(output_ids: list[int], plan: Any) -> list[int]:
    return output_ids[: plan.num_keep] + plan.new_ids


@pytest.mark.parametrize("generated,forced", [
    ('{"', 'name": "'),
    ('{"name": "Harry", "', 'house": "'),
    ("Voil", "à: café ☕ crème"),
    ("日本", "語 — naïve façade"),
    ("", "Grüße aus Köln"),
    ("#", "fff"),
])
def test_text_after_jump_is_exact(tokenizer: Any, generated: str, forced: str) -> None:
    output_ids = tokenizer.encode(generated)
    plan = plan_jump(output_ids, 0, forced, tokenizer)
    assert plan is not None
    new_output = _apply(output_ids, plan)
    assert tokenizer.decode(new_output) == generated + forced
    assert plan.num_keep >= max(len(output_ids) - MAX_RETOKENIZE_TOKENS, 0)
    assert output_ids[: plan.num_keep] == new_output[: plan.num_keep]


def test_tail_is_retokenized_with_the_forced_text(tokenizer: Any) -> None:
    # '"' alone, then 'name' forced: the tokenizer writes '"name' differently.
    output_ids = tokenizer.encode('{"')
    plan = plan_jump(output_ids, 0, 'name": "', tokenizer)
    assert plan is not None
    assert _apply(output_ids, plan) == tokenizer.encode('{"name": "')


def test_first_replaceable_token_is_kept(tokenizer: Any) -> None:
    output_ids = tokenizer.encode('{"')
    plan = plan_jump(output_ids, len(output_ids), 'name": "', tokenizer)
    assert plan is not None
    assert plan.num_keep == len(output_ids)
    assert tokenizer.decode(_apply(output_ids, plan)) == '{"name": "'


def test_partial_character_at_the_end_abandons_the_jump(tokenizer: Any) -> None:
    ids = tokenizer.encode("☕")
    assert len(ids) > 1, "needs a character split over several byte tokens"
    partial = ids[:-1]
    assert tokenizer.decode(partial).endswith("\ufffd")
    assert plan_jump(partial, 0, "abc", tokenizer) is None
