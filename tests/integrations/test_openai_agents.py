"""TerrariumSession: the Agents SDK's Session protocol over every terrarium store.

Each test states one behaviour the SDK documents for its sessions (``agents.memory.Session``),
run on memory, fs, sqlite and postgres, then a real ``Runner`` over a scripted fake model.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agents import Agent, RunConfig, Runner, function_tool
from agents.memory import Session, SessionSettings
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
from click.testing import CliRunner
from openai import AsyncOpenAI

from fakeserver import FakeReply, FakeServer, FakeToolCall
from helpers.responses import RESPONSES_ITEMS
from terrarium import ContextId, FsStore, MemoryStore, SqliteStore, Store
from terrarium.cli import cli
from terrarium.errors import InvalidContextId, InvalidEntry
from terrarium.integrations.openai_agents import TerrariumSession
from terrarium.search import search

# The items the SDK itself writes: inputs, assistant messages, tool calls and their results.
USER = {"role": "user", "content": "What's the weather in Paris?"}
CALL = {
    "type": "function_call",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city": "Paris"}',
    "id": "fc_1",
}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": "sunny"}
REPLY = {
    "type": "message",
    "role": "assistant",
    "id": "msg_1",
    "status": "completed",
    "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def numbered(n: int, tag: str = "item") -> list[dict[str, Any]]:
    return [{"role": "user", "content": f"{tag} {i}"} for i in range(n)]


# --------------------------------------------------------------------------- the protocol


def test_it_is_an_sdk_session(store: Store) -> None:
    """The SDK recognises it as a Session; its context is ``agents:{session_id}``."""
    session = TerrariumSession("s1", store)
    assert isinstance(session, Session)
    assert session.session_id == "s1"
    assert session.context == ContextId("agents", "s1")
    assert isinstance(session.session_settings, SessionSettings)


def test_items_come_back_in_order_as_written(store: Store) -> None:
    """get_items gives every item of every add_items call, oldest first, equal to the input."""
    session = TerrariumSession("s1", store)
    run(session.add_items([USER, CALL]))
    run(session.add_items([OUTPUT, REPLY]))
    assert run(session.get_items()) == [USER, CALL, OUTPUT, REPLY]
    assert run(TerrariumSession("s1", store).get_items()) == [USER, CALL, OUTPUT, REPLY]


def test_a_new_session_is_empty_and_reading_creates_nothing(store: Store) -> None:
    """A session never written has no items, and reading it creates no context."""
    session = TerrariumSession("fresh", store)
    assert run(session.get_items()) == []
    assert run(session.get_items(limit=3)) == []
    assert store.get_head(session.context) is None


def test_limit_gives_the_latest_items_in_order(store: Store) -> None:
    """limit=N gives the last N items oldest first; more than there are gives them all."""
    session = TerrariumSession("s1", store)
    items = numbered(5)
    run(session.add_items(items))
    assert run(session.get_items(limit=2)) == items[3:]
    assert run(session.get_items(limit=1)) == items[4:]
    assert run(session.get_items(limit=50)) == items
    assert run(session.get_items(limit=0)) == []
    assert run(session.get_items(limit=None)) == items
    assert run(session.get_items(limit=-1)) == items


def test_every_limit_agrees_with_the_sdks_own_session(store: Store) -> None:
    """For every limit from 0 to twice the history, get_items equals the SDK's SQLiteSession
    holding the same items (the last N, all of them once N reaches the length)."""
    from agents import SQLiteSession

    items = numbered(6)
    ours = TerrariumSession("s1", store)
    theirs = SQLiteSession("s1")
    run(ours.add_items(items))
    run(theirs.add_items(items))
    for limit in range(13):
        expected = run(theirs.get_items(limit=limit))
        assert run(ours.get_items(limit=limit)) == expected, limit
        assert expected == (items[-limit:] if limit else [])


def test_session_settings_limit_is_the_default(store: Store) -> None:
    """session_settings.limit applies when no limit is passed; an explicit limit wins."""
    session = TerrariumSession("s1", store, session_settings=SessionSettings(limit=2))
    items = numbered(4)
    run(session.add_items(items))
    assert run(session.get_items()) == items[2:]
    assert run(session.get_items(limit=3)) == items[1:]
    as_dict = TerrariumSession("s1", store, session_settings={"limit": 1})
    assert run(as_dict.get_items()) == items[3:]


def test_pop_item_on_an_empty_session_is_none(store: Store) -> None:
    """pop_item on a session with no items returns None, and changes nothing."""
    session = TerrariumSession("empty", store)
    assert run(session.pop_item()) is None
    assert store.get_head(session.context) is None
    run(session.add_items([USER]))
    assert run(session.pop_item()) == USER
    assert run(session.pop_item()) is None
    assert run(session.get_items()) == []


def test_pop_item_removes_the_latest_and_keeps_it_in_the_tree(store: Store) -> None:
    """pop_item returns the newest item and drops it; the log still holds it (a rewind)."""
    session = TerrariumSession("s1", store)
    run(session.add_items([USER, CALL, OUTPUT]))
    before = store.get_head(session.context)
    assert run(session.pop_item()) == OUTPUT
    assert run(session.get_items()) == [USER, CALL]
    assert run(session.pop_item()) == CALL
    assert run(session.get_items()) == [USER]
    assert before is not None
    kept = store.read_segment(before.session_id, before.segment_id).entries
    assert [entry["item"] for entry in kept] == [USER, CALL, OUTPUT]
    run(session.add_items([REPLY]))
    assert run(session.get_items()) == [USER, REPLY]


def test_a_popped_item_is_not_found_by_search(store: Store) -> None:
    """Search finds what get_items returns: a popped item only with ``all_branches``, marked
    off; a kept one at its place in the items."""
    from terrarium.index._query import SearchQuery

    session = TerrariumSession("s1", store)
    run(session.add_items([USER, REPLY, {"role": "user", "content": "Paris again?"}]))
    run(session.pop_item())
    hits = search(store, "Paris")
    assert [(hit.message, hit.branch) for hit in hits] == [(0, "head")]
    every = search(store, SearchQuery("Paris", all_branches=True))
    assert sorted((hit.branch, hit.message) for hit in every) == [("head", 0), ("off", None)]
    assert "again" in next(hit.snippet for hit in every if hit.branch == "off")


def test_clear_session_empties_it_and_keeps_history_in_the_tree(store: Store) -> None:
    """clear_session leaves no items; the session works on; the old items stay in the log."""
    session = TerrariumSession("s1", store)
    run(session.add_items([USER, REPLY]))
    before = store.get_head(session.context)
    run(session.clear_session())
    assert run(session.get_items()) == []
    assert run(session.pop_item()) is None
    assert before is not None
    kept = store.read_segment(before.session_id, before.segment_id).entries
    assert [entry["item"] for entry in kept] == [USER, REPLY]
    run(session.add_items([OUTPUT]))
    assert run(session.get_items()) == [OUTPUT]


def test_clearing_an_unused_or_empty_session_writes_nothing(store: Store) -> None:
    """clear_session on a session never written creates no context; on an empty one, no
    new segment."""
    session = TerrariumSession("s1", store)
    run(session.clear_session())
    assert store.get_head(session.context) is None
    run(session.add_items([USER]))
    run(session.clear_session())
    head = store.get_head(session.context)
    run(session.clear_session())
    assert store.get_head(session.context) == head


def test_sessions_are_isolated(store: Store) -> None:
    """Two session ids, and a session and another context, never see each other's items."""
    one, two = TerrariumSession("one", store), TerrariumSession("two", store)
    other = TerrariumSession("one", store, context="irc:#agents")
    run(one.add_items([USER]))
    run(two.add_items([REPLY]))
    run(other.add_items([OUTPUT]))
    assert run(one.get_items()) == [USER]
    assert run(two.get_items()) == [REPLY]
    assert run(other.get_items()) == [OUTPUT]
    run(one.clear_session())
    assert run(two.pop_item()) == REPLY
    assert run(other.get_items()) == [OUTPUT]
    assert store.get_head(ContextId.parse("irc:#agents")) is not None


def test_unicode_and_sql_looking_text_is_kept_verbatim(store: Store) -> None:
    """Unicode, quotes and SQL in ids and items are data: stored and returned unchanged."""
    tricky = [
        {"role": "user", "content": "Robert'); DROP TABLE entries;-- 🦜 ünïcödé 日本語"},
        {"role": "user", "content": "' OR 1=1 --"},
        {"role": "user", "content": 'quotes " \\ \n newlines \t and NUL-free 🧪'},
    ]
    session = TerrariumSession("x'; DELETE FROM heads; --", store)
    run(session.add_items(tricky))
    assert run(session.get_items()) == tricky
    assert run(TerrariumSession("ünï 日本", store).get_items()) == []
    assert run(session.pop_item()) == tricky[-1]


def test_items_of_every_responses_type_round_trip(store: Store) -> None:
    """Messages with typed parts, calls, outputs, reasoning and unknown kinds come back equal,
    keys in the same order."""
    items = copy.deepcopy(RESPONSES_ITEMS)
    session = TerrariumSession("all", store)
    run(session.add_items(items))
    got = run(session.get_items())
    assert got == RESPONSES_ITEMS
    assert [list(item) for item in got] == [list(item) for item in RESPONSES_ITEMS]
    assert run(session.pop_item()) == RESPONSES_ITEMS[-1]


def test_a_bad_item_is_refused_and_nothing_is_written(store: Store) -> None:
    """An item with neither a role nor a type is refused in one line; no item of that call,
    and no context, is written."""
    session = TerrariumSession("bad", store)
    with pytest.raises(InvalidEntry, match="role"):
        run(session.add_items([USER, {"content": "no role, no type"}]))
    assert store.get_head(session.context) is None
    run(session.add_items([USER]))
    with pytest.raises(InvalidEntry):
        run(session.add_items([REPLY, {"type": ""}]))
    assert run(session.get_items()) == [USER]


def test_five_threads_with_their_own_loops_lose_nothing(store: Store) -> None:
    """Five threads, each running its own event loop, add at once: every item is kept and
    each add_items call's items stay together, in order."""
    session = TerrariumSession("busy", store)
    start = threading.Barrier(5)
    errors: list[BaseException] = []

    def writer(n: int) -> None:
        try:
            start.wait()
            for batch in range(3):
                run(session.add_items(numbered(4, f"t{n}b{batch}")))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    texts = [item["content"] for item in run(session.get_items())]
    assert len(texts) == 60
    for i in range(0, 60, 4):
        tag = texts[i].rsplit(" ", 1)[0]
        assert texts[i : i + 4] == [f"{tag} {k}" for k in range(4)]
    assert sorted({t.rsplit(" ", 1)[0] for t in texts}) == sorted(
        f"t{n}b{b}" for n in range(5) for b in range(3)
    )


def test_store_calls_run_off_the_event_loop() -> None:
    """Every store call runs in a worker thread, never on the event loop's thread."""
    seen: set[int] = set()

    class Recording(MemoryStore):
        def get_head(self, context: ContextId) -> Any:
            seen.add(threading.get_ident())
            return super().get_head(context)

    async def use(session: TerrariumSession) -> int:
        await session.add_items([USER, REPLY])
        await session.get_items()
        await session.pop_item()
        await session.clear_session()
        return threading.get_ident()

    loop_thread = run(use(TerrariumSession("s", Recording())))
    assert seen
    assert loop_thread not in seen


# --------------------------------------------------------------------------- construction


def test_a_path_or_url_is_opened_and_closed_by_the_session(tmp_path: Path) -> None:
    """Given a path or a URL, the session opens the store and close() closes it; a store
    object is left open."""
    with TerrariumSession("s", tmp_path / "sessions") as session:
        run(session.add_items([USER]))
        assert isinstance(session.store, FsStore)
    with TerrariumSession("s", f"sqlite:{tmp_path / 'a.db'}") as session:
        run(session.add_items([REPLY]))
        assert isinstance(session.store, SqliteStore)
    with pytest.raises(RuntimeError, match="closed"):
        run(session.get_items())
    with FsStore(tmp_path / "sessions") as store:
        assert run(TerrariumSession("s", store).get_items()) == [USER]
        TerrariumSession("s", store).close()
        assert store.get_head(ContextId.parse("agents:s")) is not None
    with SqliteStore(tmp_path / "a.db") as db:
        assert run(TerrariumSession("s", db).get_items()) == [REPLY]


def test_a_closed_session_refuses_every_call(tmp_path: Path) -> None:
    """After close(), each method raises RuntimeError, an empty add included."""
    session = TerrariumSession("s", MemoryStore())
    session.close()
    for call in (
        lambda: session.get_items(),
        lambda: session.add_items([]),
        lambda: session.pop_item(),
        lambda: session.clear_session(),
    ):
        with pytest.raises(RuntimeError, match="closed"):
            run(call())


def test_an_invalid_context_is_a_one_line_error() -> None:
    """A session id or context that is no valid context id is refused when constructed."""
    with pytest.raises(InvalidContextId, match="'/'"):
        TerrariumSession("a/b", MemoryStore())
    with pytest.raises(InvalidContextId, match="type:name"):
        TerrariumSession("s", MemoryStore(), context="nocolon")


# --------------------------------------------------------------------------- a real Runner


def weather_model(messages: list[dict[str, Any]]) -> str | FakeReply:
    """Call get_weather for each user message; answer with its result once it is back."""
    last = messages[-1]
    if last["role"] == "tool":
        return FakeReply(content=f"Forecast: {last['content']}.")
    return FakeReply(
        tool_calls=[FakeToolCall("get_weather", '{"city": "Paris"}', id=f"call_{len(messages)}")]
    )


@function_tool
def get_weather(city: str) -> str:
    """Tell the weather in a city."""
    return f"sunny in {city} with quokkas"


@pytest.fixture
def weather(fake_server: FakeServer) -> Iterator[Callable[[], Agent[Any]]]:
    """Make an agent with a get_weather tool over the scripted fake model (one per loop)."""
    fake_server.reply = weather_model
    clients: list[AsyncOpenAI] = []

    def make() -> Agent[Any]:
        # No kept-alive connections: a client outlives the event loop of a run (run_sync's),
        # and a pooled socket would be left open when that loop closes.
        http = httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0))
        client = AsyncOpenAI(
            base_url=fake_server.base_url, api_key="test", max_retries=0, http_client=http
        )
        clients.append(client)
        model = OpenAIChatCompletionsModel(model=fake_server.model, openai_client=client)
        return Agent(name="weather", instructions="Be brief.", model=model, tools=[get_weather])

    yield make
    for client in clients:
        run(client.close())


NO_TRACING = RunConfig(tracing_disabled=True)


@pytest.fixture
def default_loop() -> Iterator[None]:
    """A default event loop for run_sync, which runs on it and leaves it open: closed here."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    yield
    loop.close()
    asyncio.set_event_loop(None)


def kinds(items: list[Any]) -> list[str]:
    return [item.get("type") or item["role"] for item in items]


TURN = ["user", "function_call", "function_call_output", "message"]


def test_runner_run_with_a_tool_over_two_turns(
    store: Store, weather: Callable[[], Agent[Any]], fake_server: FakeServer
) -> None:
    """Runner.run keeps each turn (input, call, result, reply) in the session and sends the
    first turn's history with the second."""
    session = TerrariumSession("runner", store)

    async def two_turns() -> tuple[str, str]:
        agent = weather()
        first = await Runner.run(agent, "Weather in Paris?", session=session, run_config=NO_TRACING)
        second = await Runner.run(agent, "And tomorrow?", session=session, run_config=NO_TRACING)
        return first.final_output, second.final_output

    first, second = run(two_turns())
    assert first == second == "Forecast: sunny in Paris with quokkas."
    items = run(session.get_items())
    assert kinds(items) == TURN + TURN
    assert items[0] == {"content": "Weather in Paris?", "role": "user"}
    assert items[2]["output"] == "sunny in Paris with quokkas"
    assert items[1]["call_id"] == items[2]["call_id"]
    third_request = fake_server.requests[2]["messages"]
    sent = [m.get("content") for m in third_request if m["role"] == "user"]
    assert sent == ["Weather in Paris?", "And tomorrow?"]
    assert any(m["role"] == "tool" for m in third_request[:-1])


def test_runner_run_sync_and_run_streamed_use_the_session(
    tmp_path: Path, weather: Callable[[], Agent[Any]], default_loop: None
) -> None:
    """run_sync and run_streamed append their turns to the same session as run does."""
    session = TerrariumSession("mixed", f"sqlite:{tmp_path / 'agents.db'}")
    result = Runner.run_sync(weather(), "Paris today?", session=session, run_config=NO_TRACING)
    assert result.final_output == "Forecast: sunny in Paris with quokkas."

    async def streamed() -> Any:
        result = Runner.run_streamed(
            weather(), "Paris tonight?", session=session, run_config=NO_TRACING
        )
        events = [event.type async for event in result.stream_events()]
        assert "raw_response_event" in events
        return result.final_output

    assert run(streamed()) == "Forecast: sunny in Paris with quokkas."
    items = run(session.get_items())
    assert kinds(items) == TURN + TURN
    assert [items[0]["content"], items[4]["content"]] == ["Paris today?", "Paris tonight?"]
    session.close()


def test_show_and_search_see_an_agents_conversation(
    tmp_path: Path, weather: Callable[[], Agent[Any]], default_loop: None
) -> None:
    """What a Runner wrote is a conversation terrarium's show and search read as text."""
    root = tmp_path / "sessions"
    with TerrariumSession("trip", root) as session:
        Runner.run_sync(weather(), "Weather in Paris?", session=session, run_config=NO_TRACING)
    result = CliRunner().invoke(
        cli, ["show", "agents:trip", "--storage-dir", str(root)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    for text in ("Weather in Paris?", "get_weather", "sunny in Paris with quokkas", "Forecast"):
        assert text in result.output
    with FsStore(root) as store:
        hits = search(store, "quokkas")
        assert {hit.context for hit in hits} == {"agents:trip"}
        assert {hit.role for hit in hits} == {"tool", "assistant"}
        exported = json.dumps(store.read_segment(*_head(store)).entries)
        assert "function_call_output" in exported


def _head(store: Store) -> tuple[Any, Any]:
    head = store.get_head(ContextId.parse("agents:trip"))
    assert head is not None
    return head.session_id, head.segment_id
