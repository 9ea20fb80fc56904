"""The `priority` field in the TokenizerManager: what the scheduler gets, with and
without priority scheduling (SGLang ignores the field without it, unless
--abort-on-priority-when-disabled), and the batch form of the native request."""

from __future__ import annotations

import pytest

from radixlm.server_args import ServerArgs
from radixlm.tokenizer.request_input import GenerateReqInput
from radixlm.tokenizer.tokenizer_manager import TokenizerManager
from radixlm.tokenizer.validation import check_priority


def manager(**kwargs: object) -> TokenizerManager:
    tm = TokenizerManager.__new__(TokenizerManager)  # only the args matter here
    tm.args = ServerArgs(**kwargs)  # type: ignore[arg-type]
    return tm


def test_priority_with_and_without_scheduling() -> None:
    off = manager()
    check_priority(5, off.args)
    assert off._priority(5) == 0 and off._priority(None) == 0
    on = manager(enable_priority_scheduling=True, default_priority_value=3)
    assert on._priority(-7) == -7 and on._priority(None) == 3
    assert manager(schedule_policy="priority")._priority(9) == 9
    strict = manager(abort_on_priority_when_disabled=True)
    check_priority(None, strict.args)
    with pytest.raises(ValueError, match="--enable-priority-scheduling"):
        check_priority(1, strict.args)
    with pytest.raises(ValueError, match="64-bit"):
        check_priority(1 << 70, on.args)


def test_priority_per_prompt_in_a_batch() -> None:
    singles = GenerateReqInput(text=["a", "b"], priority=[1, 2]).normalize()
    assert [s.priority for s in singles] == [1, 2]
    assert [s.priority for s in GenerateReqInput(text=["a", "b"], priority=4).normalize()] == [4, 4]
    with pytest.raises(ValueError, match="'priority'"):
        GenerateReqInput(text=["a", "b"], priority=[1]).normalize()
    with pytest.raises(ValueError, match="'priority'"):
        GenerateReqInput(text="a", priority=True).normalize()  # type: ignore[arg-type]
