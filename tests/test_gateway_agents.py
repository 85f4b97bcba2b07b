"""The OpenAI Agents SDK against ``terrarium gateway`` (the fake model server upstream):
``Runner.run`` with ``previous_response_id``, with ``conversation_id``, and with
``OpenAIConversationsSession``, a function tool round-tripped in each."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

agents = pytest.importorskip("agents")

from agents import Agent, OpenAIResponsesModel, RunConfig, Runner, function_tool  # noqa: E402
from agents.memory import OpenAIConversationsSession  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402

from fakeserver import FakeReply, FakeServer, FakeToolCall  # noqa: E402
from helpers.gateway import GatewayProcess  # noqa: E402
from terrarium.model import ContextId  # noqa: E402
from terrarium.sessions import restore  # noqa: E402
from terrarium.stores.url import open_store  # noqa: E402

T = TypeVar("T")
NO_TRACING = RunConfig(tracing_disabled=True)


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


def weather_model(messages: list[dict[str, Any]]) -> FakeReply:
    last = messages[-1]
    if last["role"] == "tool":
        return FakeReply(content=f"Forecast: {last['content']}.")
    return FakeReply(
        tool_calls=[FakeToolCall("get_weather", '{"city": "Paris"}', id=f"call_{len(messages)}")]
    )


@function_tool
def get_weather(city: str) -> str:
    """Tell the weather in a city."""
    return f"sunny in {city}"


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with FakeServer(reply=weather_model) as server:
        yield server


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway-agents") / "sessions"


@pytest.fixture(scope="module")
def gateway(fake: FakeServer, storage: Path) -> Iterator[GatewayProcess]:
    with GatewayProcess(storage, fake.base_url) as process:
        yield process


def client_for(gateway: GatewayProcess) -> AsyncOpenAI:
    http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
    return AsyncOpenAI(base_url=gateway.url, api_key="x", max_retries=0, http_client=http)


def agent_for(client: AsyncOpenAI, fake: FakeServer) -> Agent[Any]:
    model = OpenAIResponsesModel(model=fake.model, openai_client=client)
    return Agent(name="weather", instructions="Be brief.", model=model, tools=[get_weather])


def test_runner_chains_runs_by_previous_response_id(
    gateway: GatewayProcess, fake: FakeServer
) -> None:
    async def two_runs() -> tuple[Any, Any]:
        client = client_for(gateway)
        agent = agent_for(client, fake)
        first = await Runner.run(agent, "Weather in Paris?", run_config=NO_TRACING)
        second = await Runner.run(
            agent,
            "And tomorrow?",
            previous_response_id=first.last_response_id,
            run_config=NO_TRACING,
        )
        await client.close()
        return first, second

    first, second = run(two_runs())
    assert first.final_output == second.final_output == "Forecast: sunny in Paris."
    sent = fake.requests[-1]["messages"]
    assert [m["content"] for m in sent if m["role"] == "user"] == [
        "Weather in Paris?",
        "And tomorrow?",
    ]
    assert sum(m["role"] == "tool" for m in sent) == 2  # both runs' calls went up


def test_runner_keeps_a_conversation_by_id(
    gateway: GatewayProcess, fake: FakeServer, storage: Path
) -> None:
    async def in_conversation() -> tuple[str, list[Any]]:
        client = client_for(gateway)
        conversation = await client.conversations.create()
        agent = agent_for(client, fake)
        for question in ("Weather in Paris?", "And tomorrow?"):
            await Runner.run(
                agent, question, conversation_id=conversation.id, run_config=NO_TRACING
            )
        items = [i async for i in client.conversations.items.list(conversation.id, order="asc")]
        await client.close()
        return conversation.id, items

    conversation_id, items = run(in_conversation())
    kinds = [item.type for item in items]
    turn = ["message", "function_call", "function_call_output", "message"]
    assert kinds == turn + turn
    with open_store(str(storage), create=False) as store:
        state = restore(store, ContextId("conv", conversation_id))
    assert len(state.history) == 8 and not state.failed


def test_openai_conversations_session(gateway: GatewayProcess, fake: FakeServer) -> None:
    async def with_session() -> tuple[list[Any], Any]:
        client = client_for(gateway)
        session = OpenAIConversationsSession(openai_client=client)
        agent = agent_for(client, fake)
        await Runner.run(agent, "Weather in Paris?", session=session, run_config=NO_TRACING)
        await Runner.run(agent, "And tomorrow?", session=session, run_config=NO_TRACING)
        items = await session.get_items()
        popped = await session.pop_item()
        after = await session.get_items()
        await session.clear_session()
        await client.close()
        return items, (popped, after)

    items, (popped, after) = run(with_session())
    assert len(items) == 8
    assert items[0]["content"][0]["text"] == "Weather in Paris?"
    assert popped is not None and popped["id"] == items[-1]["id"]
    assert [i["id"] for i in after] == [i["id"] for i in items[:-1]]


def test_runner_run_streamed_through_the_gateway(gateway: GatewayProcess, fake: FakeServer) -> None:
    """The SDK's streamed run reads the gateway's events: the tool call and the answer."""

    async def streamed() -> tuple[Any, list[str]]:
        client = client_for(gateway)
        agent = agent_for(client, fake)
        result = Runner.run_streamed(agent, "Weather in Paris?", run_config=NO_TRACING)
        kinds = [event.type async for event in result.stream_events()]
        again = await Runner.run(
            agent,
            "And tomorrow?",
            previous_response_id=result.last_response_id,
            run_config=NO_TRACING,
        )
        await client.close()
        return (result.final_output, again.final_output), kinds

    (first, second), kinds = run(streamed())
    assert first == second == "Forecast: sunny in Paris."
    assert "raw_response_event" in kinds and "run_item_stream_event" in kinds
