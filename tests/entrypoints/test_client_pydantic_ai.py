"""`pydantic-ai` agents against the session's real server (default model), through its
OpenAI chat model and its Anthropic model (/v1/messages): structured output (an output
tool), a tool loop with a tool result, and streaming.

The tool loop forces its steps with a per-step `tool_choice` (pydantic-ai's callable
model settings): one call of the weather tool first, then an answer, so that the tiny
model's choices cannot make the run loop.
"""

from __future__ import annotations

from typing import Any

import pytest
from _clients import (
    CITY_PROMPT,
    MAX_TOKENS,
    MODEL,
    QUESTION,
    WEATHER_RESULT,
    CityInfo,
    get_weather,
)
from _server_process import API_KEY
from pydantic_ai import Agent, RunContext
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.anthropic import AnthropicModel
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.anthropic import AnthropicProvider
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import UsageLimits

SETTINGS: ModelSettings = {"temperature": 0, "max_tokens": MAX_TOKENS}
LIMITS = UsageLimits(request_limit=4)


def _model(server: Any, api: str) -> Model:
    if api == "openai":
        return OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=server.url + "/v1",
                                                              api_key=API_KEY))
    return AnthropicModel("claude-radixlm", provider=AnthropicProvider(base_url=server.url,
                                                                       api_key=API_KEY))


def _tool_returned(ctx: RunContext[Any]) -> bool:
    return any(isinstance(p, ToolReturnPart) for m in ctx.messages for p in m.parts)


def _weather_then_answer(ctx: RunContext[Any]) -> ModelSettings:
    return {**SETTINGS, "parallel_tool_calls": False,
            "tool_choice": "none" if _tool_returned(ctx) else ["get_weather"]}


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_structured_output(server: Any, api: str) -> None:
    agent = Agent(_model(server, api), output_type=CityInfo, model_settings=SETTINGS)
    result = agent.run_sync(CITY_PROMPT, usage_limits=LIMITS)
    assert isinstance(result.output, CityInfo)


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_tool_loop(server: Any, api: str) -> None:
    agent = Agent(_model(server, api), tools=[get_weather], model_settings=_weather_then_answer)
    result = agent.run_sync(QUESTION, usage_limits=LIMITS)
    returns = [p for m in result.all_messages() for p in m.parts
               if isinstance(p, ToolReturnPart)]
    assert [(r.tool_name, r.content) for r in returns] == [("get_weather", WEATHER_RESULT)], (
        result.all_messages())
    assert isinstance(result.output, str) and result.output


def test_streaming(server: Any) -> None:
    agent = Agent(_model(server, "openai"), model_settings={**SETTINGS, "max_tokens": 12})
    result = agent.run_stream_sync("Say hello.")
    deltas = list(result.stream_text(delta=True, debounce_by=None))
    assert deltas and "".join(deltas) == result.get_output()
