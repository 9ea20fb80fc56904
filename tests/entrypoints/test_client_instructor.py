"""`instructor` against the session's real server (default model): structured output in
its TOOLS and JSON_SCHEMA modes (both grammar-forced), a nested model (whose tool
schema holds `$defs`), and streamed partial objects."""

from __future__ import annotations

from typing import Any

import instructor
import pytest
from _clients import CITY_PROMPT, MAX_TOKENS, MODEL, CityInfo
from pydantic import BaseModel, Field

MESSAGES = [{"role": "user", "content": CITY_PROMPT}]


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_structured_output(oai: Any, mode: instructor.Mode) -> None:
    client = instructor.from_openai(oai, mode=mode)
    city = client.chat.completions.create(model=MODEL, response_model=CityInfo,
                                          messages=MESSAGES, max_tokens=MAX_TOKENS,
                                          temperature=0, max_retries=0)
    assert isinstance(city, CityInfo)


class Trip(BaseModel):
    destination: CityInfo  # a nested model: the tool's schema holds $defs
    days: int = Field(ge=1, le=30)


def test_nested_model(oai: Any) -> None:
    client = instructor.from_openai(oai, mode=instructor.Mode.TOOLS)
    trip = client.chat.completions.create(
        model=MODEL, response_model=Trip, max_retries=0, temperature=0,
        messages=[{"role": "user", "content": "Plan a trip to Paris as JSON."}],
        max_tokens=2 * MAX_TOKENS)
    assert isinstance(trip, Trip) and isinstance(trip.destination, CityInfo)


def test_streamed_partial_objects(oai: Any) -> None:
    client = instructor.from_openai(oai, mode=instructor.Mode.TOOLS)
    partials = list(client.chat.completions.create_partial(
        model=MODEL, response_model=CityInfo, messages=MESSAGES, max_tokens=MAX_TOKENS,
        temperature=0, max_retries=0))
    # NOTE: the server sends a call once it is complete (so that a call cut by
    # max_tokens is never half sent): the last partial is the whole object.
    assert partials
    final = CityInfo.model_validate(partials[-1].model_dump())
    assert final.name == partials[-1].name
