"""`instructor` against the session's real server (default model): structured output in
its TOOLS and JSON_SCHEMA modes (both grammar-forced), a list of objects (`Iterable`,
whose tool schema holds `$defs`), and streamed partial objects."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import instructor
import pytest
from _clients import CITY_PROMPT, MAX_TOKENS, MODEL, CityInfo

MESSAGES = [{"role": "user", "content": CITY_PROMPT}]


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_structured_output(oai: Any, mode: instructor.Mode) -> None:
    client = instructor.from_openai(oai, mode=mode)
    city = client.chat.completions.create(model=MODEL, response_model=CityInfo,
                                          messages=MESSAGES, max_tokens=MAX_TOKENS,
                                          temperature=0, max_retries=0)
    assert isinstance(city, CityInfo)


def test_iterable(oai: Any) -> None:
    client = instructor.from_openai(oai, mode=instructor.Mode.TOOLS)
    cities = client.chat.completions.create(
        model=MODEL, response_model=Iterable[CityInfo], max_retries=0, temperature=0,
        messages=[{"role": "user", "content": "Describe Paris and Rome as JSON."}],
        max_tokens=2 * MAX_TOKENS)
    cities = list(cities)
    assert cities and all(isinstance(c, CityInfo) for c in cities)


def test_streamed_partial_objects(oai: Any) -> None:
    client = instructor.from_openai(oai, mode=instructor.Mode.TOOLS)
    partials = list(client.chat.completions.create_partial(
        model=MODEL, response_model=CityInfo, messages=MESSAGES, max_tokens=MAX_TOKENS,
        temperature=0, max_retries=0))
    assert len(partials) > 1
    final = CityInfo.model_validate(partials[-1].model_dump())
    assert final.name == partials[-1].name
