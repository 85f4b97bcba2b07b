"""TerrariumSaver: a LangGraph checkpointer over every terrarium store.

LangGraph's own conformance suite (the ``langgraph-checkpoint-conformance`` package, a dev
dependency) checks the base capabilities on each backend; our tests check what is ours: the
thread's context, messages logged as items, real graphs run sync and async.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import BASE_CAPABILITIES
from langgraph.graph import START, MessagesState, StateGraph

from contract.conftest import BACKEND_MARKS, BACKENDS
from terrarium import ContextId, FsStore, Store, restore
from terrarium.cli import cli
from terrarium.errors import InvalidContextId
from terrarium.integrations.langgraph import TerrariumSaver
from terrarium.search import search


@pytest.mark.parametrize(
    "backend", [pytest.param(name, marks=BACKEND_MARKS.get(name, [])) for name in BACKENDS]
)
def test_conformance_base_capabilities(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """LangGraph's conformance suite passes every base capability (put, put_writes,
    get_tuple, list, delete_thread) on this backend, each suite on a fresh store."""
    counter = itertools.count()
    stores: list[Store] = []

    @checkpointer_test(name=f"TerrariumSaver[{backend}]")
    async def factory() -> AsyncIterator[BaseCheckpointSaver[Any]]:
        folder = tmp_path / f"suite{next(counter)}"
        folder.mkdir()
        store = BACKENDS[backend](folder, request)
        stores.append(store)
        yield TerrariumSaver(store)
        store.close()

    report = asyncio.run(validate(factory, capabilities={c.value for c in BASE_CAPABILITIES}))
    base = {c.value for c in BASE_CAPABILITIES}
    failures = {
        name: result.failures
        for name, result in report.results.items()
        if name in base and not result.passed
    }
    assert failures == {}
    assert report.passed_all_base()
    assert {name for name, r in report.results.items() if r.tests_passed} == base
    assert len(stores) == len(BASE_CAPABILITIES)


def chat_graph() -> StateGraph[Any]:
    """A graph whose one node answers each user message with its echo."""

    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"echo: {state['messages'][-1].content}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder


def test_a_graph_resumes_its_thread_and_logs_messages_as_items(store: Store) -> None:
    """Two invocations on one thread continue the conversation; its messages are history
    items of ``langgraph:{thread_id}``, each once, in order, with its message id."""
    graph = chat_graph().compile(checkpointer=TerrariumSaver(store))
    config: Any = {"configurable": {"thread_id": "t1"}}
    graph.invoke({"messages": [HumanMessage("hello narwhal")]}, config)
    result = graph.invoke({"messages": [HumanMessage("again")]}, config)
    assert [m.content for m in result["messages"]] == [
        "hello narwhal",
        "echo: hello narwhal",
        "again",
        "echo: again",
    ]
    history = restore(store, "langgraph:t1").history
    assert [(item["role"], item["content"]) for item in history] == [
        ("user", "hello narwhal"),
        ("assistant", "echo: hello narwhal"),
        ("user", "again"),
        ("assistant", "echo: again"),
    ]
    assert [item["id"] for item in history] == [m.id for m in result["messages"]]
    state = graph.get_state(config)
    assert len(state.values["messages"]) == 4
    assert len(list(graph.get_state_history(config))) >= 4


def test_tool_calls_and_results_are_logged_as_chat_messages(store: Store) -> None:
    """An AI message's tool calls and the tool's answer become an assistant message with
    ``tool_calls`` and a ``tool`` message, which search finds under the tool role."""

    def act(state: MessagesState) -> dict[str, Any]:
        call = {"name": "get_weather", "args": {"city": "Paris"}, "id": "call_7"}
        return {
            "messages": [
                AIMessage("", tool_calls=[call]),
                ToolMessage("sunny with quokkas", tool_call_id="call_7"),
                AIMessage("It is sunny."),
            ]
        }

    builder = StateGraph(MessagesState)
    builder.add_node("act", act)
    builder.add_edge(START, "act")
    graph = builder.compile(checkpointer=TerrariumSaver(store))
    graph.invoke({"messages": [HumanMessage("weather?")]}, {"configurable": {"thread_id": "w"}})
    history = restore(store, "langgraph:w").history
    assert [item["role"] for item in history] == ["user", "assistant", "tool", "assistant"]
    assert history[1]["tool_calls"] == [
        {
            "id": "call_7",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    assert history[2]["tool_call_id"] == "call_7"
    assert history[2]["content"] == "sunny with quokkas"
    hits = search(store, "quokkas")
    assert [(hit.context, hit.role) for hit in hits] == [("langgraph:w", "tool")]


def test_async_graph_and_isolated_threads(store: Store) -> None:
    """ainvoke checkpoints through the async methods; threads never see each other."""
    graph = chat_graph().compile(checkpointer=TerrariumSaver(store))

    async def both() -> tuple[Any, Any]:
        one = await graph.ainvoke(
            {"messages": [HumanMessage("one")]}, {"configurable": {"thread_id": "a"}}
        )
        two = await graph.ainvoke(
            {"messages": [HumanMessage("two")]}, {"configurable": {"thread_id": "b"}}
        )
        return one, two

    one, two = asyncio.run(both())
    assert [m.content for m in one["messages"]] == ["one", "echo: one"]
    assert [m.content for m in two["messages"]] == ["two", "echo: two"]
    assert [i["content"] for i in restore(store, "langgraph:b").history] == ["two", "echo: two"]


def test_delete_thread_deletes_its_context(store: Store) -> None:
    """delete_thread removes the thread's context; other threads stay."""
    saver = TerrariumSaver(store)
    graph = chat_graph().compile(checkpointer=saver)
    for thread in ("keep", "drop"):
        graph.invoke({"messages": [HumanMessage(thread)]}, {"configurable": {"thread_id": thread}})
    saver.delete_thread("drop")
    assert store.get_head(ContextId.parse("langgraph:drop")) is None
    assert saver.get_tuple({"configurable": {"thread_id": "drop"}}) is None
    assert saver.get_tuple({"configurable": {"thread_id": "keep"}}) is not None


def test_show_and_search_see_a_graph_conversation(tmp_path: Path) -> None:
    """A graph's messages are text that terrarium's show and search read."""
    root = tmp_path / "sessions"
    with TerrariumSaver(root) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        graph.invoke(
            {"messages": [HumanMessage("axolotl facts")]}, {"configurable": {"thread_id": "t"}}
        )
    result = CliRunner().invoke(
        cli, ["show", "langgraph:t", "--storage-dir", str(root)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "axolotl facts" in result.output and "echo: axolotl facts" in result.output
    with FsStore(root) as store:
        assert {hit.role for hit in search(store, "axolotl")} == {"user", "assistant"}


def test_a_thread_id_that_is_no_context_name_is_refused() -> None:
    """A thread id that cannot name a context is a one-line error, nothing written."""
    from terrarium import MemoryStore

    saver = TerrariumSaver(MemoryStore())
    with pytest.raises(InvalidContextId, match="'/'"):
        saver.get_tuple({"configurable": {"thread_id": "a/b"}})
    with pytest.raises(InvalidContextId):
        TerrariumSaver(MemoryStore(), context_type="Not A Type")
