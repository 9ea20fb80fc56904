"""What the real-client tests (test_client_*.py) share: one question, one tool, one
structured answer, all small enough for the default model to answer in a few seconds.

The default model is tiny: the tests check the shapes the grammar forces (a call of the
named tool with a string `city`, an object that validates), never what it says. Strings
and numbers carry bounds so that every answer ends well inside its token budget.
"""

# NOTE: no `from __future__ import annotations`: the clients read get_weather's
# annotations at run time to build its schema.
from typing import Annotated, Any

from pydantic import BaseModel, Field

MODEL = "SmolLM2-135M-Instruct"
QUESTION = "What is the weather in Paris?"
CITY_PROMPT = "Describe the city of Paris as JSON."
WEATHER_RESULT = "Sunny, 21 degrees."
MAX_TOKENS = 64

City = Annotated[str, Field(max_length=30, description="a city name")]


class CityInfo(BaseModel):
    name: str = Field(max_length=30)
    country: str = Field(max_length=30)
    population: int = Field(ge=0, le=100_000_000)


def get_weather(city: City) -> str:
    """Get the current weather of a city.

    Args:
        city: the city's name
    """
    return WEATHER_RESULT


WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30, "description": "a city name"}},
    "required": ["city"],
}
OPENAI_TOOLS: list[dict[str, Any]] = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather of a city.",
    "parameters": WEATHER_SCHEMA}}]
