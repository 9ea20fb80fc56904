"""`openai-agents` against the session's real server (default model), through its chat
completions model: structured output (`output_type`), a tool loop with a tool result
(the SDK's defaults: parallel calls allowed), and a streamed run.

The tool loop's agent must call the tool first (`tool_choice: required`); once the tool
has answered, a hook turns tool calls off, so that the run ends with the model's text.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from _clients import CITY_PROMPT, MAX_TOKENS, MODEL, QUESTION, WEATHER_RESULT, CityInfo
from _clients import get_weather as weather
from _server_process import API_KEY
from agents import (
    Agent,
    AgentHooks,
    ModelSettings,
    OpenAIChatCompletionsModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ToolCallOutputItem

SETTINGS = ModelSettings(temperature=0, max_tokens=MAX_TOKENS)


@pytest.fixture
def model(server: Any) -> Iterator[OpenAIChatCompletionsModel]:
    """Per test: an async client is bound to the event loop of its first use."""
    set_tracing_disabled(True)  # nothing is sent anywhere but to the test server
    client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=API_KEY, max_retries=0,
                                timeout=120)
    yield OpenAIChatCompletionsModel(model=MODEL, openai_client=client)


class _ToolsOffAfterUse(AgentHooks[Any]):
    async def on_tool_end(self, context: Any, agent: Agent[Any], tool: Any,
                          result: str) -> None:
        agent.model_settings = dataclasses.replace(agent.model_settings, tool_choice="none")


def test_structured_output(model: OpenAIChatCompletionsModel) -> None:
    agent = Agent(name="cities", instructions="Answer in JSON.", model=model,
                  output_type=CityInfo, model_settings=SETTINGS)
    result = Runner.run_sync(agent, CITY_PROMPT, max_turns=2)
    assert isinstance(result.final_output, CityInfo)


def test_tool_loop(model: OpenAIChatCompletionsModel) -> None:
    agent = Agent(name="weather", instructions="Answer questions about the weather.",
                  model=model, tools=[function_tool(weather)], hooks=_ToolsOffAfterUse(),
                  model_settings=dataclasses.replace(SETTINGS, tool_choice="required"),
                  reset_tool_choice=False)
    result = Runner.run_sync(agent, QUESTION, max_turns=3)
    outputs = [item.output for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert outputs and all(o == WEATHER_RESULT for o in outputs)
    assert isinstance(result.final_output, str) and result.final_output


def test_streaming(model: OpenAIChatCompletionsModel) -> None:
    agent = Agent(name="hello", instructions="Be brief.", model=model,
                  model_settings=dataclasses.replace(SETTINGS, max_tokens=12))

    async def run() -> tuple[list[str], Any]:
        streamed = Runner.run_streamed(agent, "Say hello.")
        deltas = [e.data.delta async for e in streamed.stream_events()
                  if e.type == "raw_response_event" and e.data.type == "response.output_text.delta"]
        return deltas, streamed.final_output

    deltas, final = asyncio.run(run())
    assert deltas and "".join(deltas) == final
