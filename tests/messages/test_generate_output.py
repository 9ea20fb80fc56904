"""GenerateOutput deltas as SGLang's dicts (cumulative or incremental), and the n > 1
sample-id convention."""

from __future__ import annotations

from radixlm.messages.generate_output import GenerateOutput, SampleDicts, final_dict
from radixlm.messages.io_struct import FinishReason, is_sample_of, sample_rid


def _out(text: str, ids: list[int], n: int, finish: FinishReason | None = None) -> GenerateOutput:
    return GenerateOutput(
        index=0, rid="r", text=text, token_ids=ids, prompt_tokens=3, completion_tokens=n,
        cached_tokens=1, forward_steps=n, jump_forward_tokens=0, finish_reason=finish,
        created=0.0, first_token_time=0.1, e2e_latency=0.2,
        output_token_logprobs=[[-0.5, i, None] for i in ids],
        output_top_logprobs=[[[-0.5, i, None]] for i in ids],
        input_token_logprobs=[None, [-1.0, 7, None]] if n == 1 else None,
        input_top_logprobs=[None, [[-1.0, 7, None]]] if n == 1 else None)


STREAM = [_out("Hel", [1], 1), _out("lo", [2, 3], 3), _out("!", [4], 4, FinishReason("length"))]


def test_cumulative_dicts_hold_everything_so_far_and_never_change_later() -> None:
    sample = SampleDicts()
    dicts = [sample.add(o) for o in STREAM]
    assert [d["text"] for d in dicts] == ["Hel", "Hello", "Hello!"]
    assert [d["delta"] for d in dicts] == ["Hel", "lo", "!"]
    assert [d["output_ids"] for d in dicts] == [[1], [1, 2, 3], [1, 2, 3, 4]]
    lps = [[e[1] for e in d["meta_info"]["output_token_logprobs"]] for d in dicts]
    assert lps == [[1], [1, 2, 3], [1, 2, 3, 4]]
    assert all(d["meta_info"]["input_token_logprobs"] == [None, [-1.0, 7, None]] for d in dicts)
    assert dicts[-1]["meta_info"]["finish_reason"] == {"type": "length", "matched": None}
    assert dicts[0]["meta_info"]["completion_tokens"] == 1


def test_incremental_dicts_hold_only_what_is_new() -> None:
    sample = SampleDicts(incremental=True)
    dicts = [sample.add(o) for o in STREAM]
    assert [d["text"] for d in dicts] == ["Hel", "lo", "!"] == [d["delta"] for d in dicts]
    assert [d["output_ids"] for d in dicts] == [[1], [2, 3], [4]]
    assert [len(d["meta_info"]["output_top_logprobs"]) for d in dicts] == [1, 2, 1]
    assert "input_token_logprobs" in dicts[0]["meta_info"]
    assert "input_token_logprobs" not in dicts[1]["meta_info"]


def test_final_dict_and_abort_status() -> None:
    out = _out("Hi", [5, 6], 2, FinishReason("abort", message="bad grammar", status_code=400))
    d = final_dict(out)
    assert d["text"] == "Hi" and d["output_ids"] == [5, 6] and d["index"] == 0
    assert d["meta_info"]["status_code"] == 400 == out.status_code
    assert d["meta_info"]["finish_reason"] == {"type": "abort", "matched": None,
                                               "message": "bad grammar"}


def test_sample_ids() -> None:
    assert sample_rid("abc", 0, 1) == "abc"
    assert [sample_rid("abc", i, 3) for i in range(3)] == ["abc#0", "abc#1", "abc#2"]
    assert is_sample_of("abc", "abc") and is_sample_of("abc#2", "abc")
    assert not is_sample_of("abcd", "abc") and not is_sample_of("abc", "abc#1")
