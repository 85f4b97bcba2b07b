"""The gateway's ledger on every backend: what its caches hold is what a replay gives, after
random turns, forks, conversation edits and chat divergences; responses are found again by a
fresh ledger (a restart) and a delete through another one (a second gateway) is seen."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest

from contract.conftest import BACKEND_MARKS, BACKENDS
from pg import pg_database  # noqa: F401  (the "postgres" backend's database)
from terrarium import Store
from terrarium.gateway.ledger import Ledger, Point, turn_entries
from terrarium.gateway.responses import message_item
from terrarium.model import ContextId
from terrarium.sessions import restore


@pytest.fixture(params=[pytest.param(name, marks=BACKEND_MARKS.get(name, [])) for name in BACKENDS])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    instance = BACKENDS[request.param](tmp_path, request)
    try:
        yield instance
    finally:
        instance.close()


def user(text: str) -> dict[str, object]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def turn(n: int, failed: bool = False) -> list[tuple[str, dict[str, object]]]:
    return turn_entries(
        [user(f"q{n}")],
        [] if failed else [message_item(f"a{n}")],
        usage=None,
        finish="stop",
        error={"error": "boom", "error_type": "x"} if failed else None,
        record={"id": f"r{n}", "inputs": 1},
    )


@pytest.mark.parametrize("seed", range(3))
def test_cached_snapshots_equal_a_replay(seed: int, store: Store) -> None:
    rng = random.Random(seed)
    ledger = Ledger(store)
    thread = ContextId("resp", "t")
    conv = ContextId("conv", "conv_c")
    chat = ContextId("chat", "c")
    points: list[Point] = [ledger.start_thread(thread, turn(0))]
    ledger.create_conversation(conv, {"metadata": {}}, [user("hello")])
    for n in range(1, 40):
        action = rng.choice(["continue", "conv", "chat", "meta", "drop"])
        if action == "continue":
            base = rng.choice(points)
            points.append(
                ledger.continue_from(
                    base, turn(n, rng.random() < 0.2), move_head=True, base=ledger.snapshot(base)
                )
            )
        elif action == "conv":
            points.append(ledger.append_to_head(conv, turn(n, rng.random() < 0.2)))
        elif action == "chat":
            messages = [{"role": "user", "content": f"m{k}"} for k in range(rng.randint(1, 4))]
            tail = turn_entries(
                [],
                [{"role": "assistant", "content": "r"}],
                usage=None,
                finish="stop",
                error=None,
                record=None,
            )
            points.append(ledger.record_chat(chat, messages, tail))
        elif action == "meta":
            ledger.set_conversation(conv, {"metadata": {"n": str(n)}})
        else:
            items = ledger.snapshot(ledger.head(conv)).items  # type: ignore[arg-type]
            if items:
                ledger.delete_item(conv, str(rng.choice(items).get("id")))
    fresh = Ledger(store)
    for point in [*points, ledger.head(conv), ledger.head(chat), ledger.head(thread)]:
        if point is None:
            continue
        assert ledger.snapshot(point) == fresh.snapshot(point)
        snap = ledger.snapshot(point)  # each message encoded once, folds included: as sent
        assert [msgspec.json.decode(raw) for raw in snap.wire] == snap.messages
    head = ledger.head(conv)
    assert head is not None
    state = restore(store, conv)
    assert ledger.snapshot(head).items == state.model_history


def test_a_response_is_found_after_a_restart_and_not_after_its_delete(store: Store) -> None:
    ledger = Ledger(store)
    thread = ContextId("resp", "t")
    first = ledger.start_thread(thread, turn(1))
    ledger.continue_from(first, turn(2), move_head=True, base=None)
    fresh = Ledger(store)
    found = fresh.find("r1", thread)
    assert found is not None and found[0] == first
    inputs, outputs = fresh.response_items(found.point, found.record)
    assert inputs == [user("q1")] and outputs[0]["content"][0]["text"] == "a1"
    assert fresh.delete_response("r1", thread)
    assert Ledger(store).find("r1", thread) is None and ledger.find("r2", thread) is not None


def test_a_delete_by_another_process_is_seen(store: Store) -> None:
    """Two ledgers on one store (two gateways): a response one deletes is gone for the other,
    even after the other found it, and even once it has been continued."""
    one, two = Ledger(store), Ledger(store)
    thread = ContextId("resp", "t")
    first = one.start_thread(thread, turn(1))
    one.continue_from(first, turn(2), move_head=True, base=None)
    assert two.find("r1", thread) is not None and two.find("r2", thread) is not None
    assert one.delete_response("r1", thread) and one.delete_response("r2", thread)
    assert two.find("r1", thread) is None and two.find("r2", thread) is None


def test_a_turn_moves_the_head_only_from_the_head_its_caller_read(store: Store) -> None:
    """``find`` gives the head it read; ``continue_from`` moves the head from it to the
    segment written, and leaves it where another writer moved it since."""
    ledger = Ledger(store)
    thread = ContextId("resp", "t")
    first = ledger.start_thread(thread, turn(1))
    ledger.continue_from(first, turn(2), move_head=True, base=None)
    found = ledger.find("r1", thread)  # no longer the tail: continuing it forks
    assert found is not None and found.head == first.segment_id
    fork = ledger.continue_from(found.point, turn(3), move_head=True, base=None, head=found.head)
    head = store.get_head(thread)
    assert fork.segment_id != first.segment_id and head is not None
    assert head.segment_id == fork.segment_id
    tail = ledger.find("r2", thread)
    assert tail is not None and tail.head == fork.segment_id
    # Read before the fork moved it: the turn is appended, the fork keeps the head.
    ledger.continue_from(tail.point, turn(4), move_head=True, base=None, head=first.segment_id)
    head = store.get_head(thread)
    assert head is not None and head.segment_id == fork.segment_id
    # Read now: the head moves to the turn's segment.
    found = ledger.find("r4", thread)
    assert found is not None
    ledger.continue_from(found.point, turn(5), move_head=True, base=None, head=found.head)
    head = store.get_head(thread)
    assert head is not None and head.segment_id == first.segment_id


def test_a_chat_ui_sending_an_answer_back_trimmed_makes_no_branch() -> None:
    from terrarium.stores.memory import MemoryStore

    store = MemoryStore()
    ledger = Ledger(store)
    chat = ContextId("chat", "ui")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    reply = {"role": "assistant", "content": "Sure.\n", "tool_calls": [call]}
    tail = turn_entries([], [reply], usage=None, finish="stop", error=None, record=None)
    first = [{"role": "user", "content": "hi"}]
    ledger.record_chat(chat, first, tail)
    trimmed = {
        "role": "assistant",
        "content": "Sure.",
        "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
    }
    second = [*first, trimmed, {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    ledger.record_chat(chat, second, tail)
    head = store.get_head(chat)
    assert head is not None and len(store.list_segments(head.session_id)) == 1
    assert len(restore(store, chat).history) == 4
    edited = [{"role": "user", "content": "hello"}]
    ledger.record_chat(chat, edited, tail)
    assert len(store.list_segments(head.session_id)) == 2  # an edit is a branch


QUICK = {"memory": True, "fs": True, "sqlite": True, "postgres": False}


def test_store_calls_run_on_the_loop_for_a_quick_store_else_in_one_thread(
    store: Store, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """``terrarium gateway`` calls a store that answers in microseconds on the event loop (a
    thread's hand-overs cost more than its calls); PostgreSQL and a sync per write keep the
    worker thread, as a library caller gets by default."""
    import asyncio
    import threading

    from terrarium.cli.gateway import quick_store
    from terrarium.gateway.core import Core
    from terrarium.gateway.upstream import Upstream
    from terrarium.stores.fs import FsStore

    backend = request.node.callspec.params["store"]
    assert quick_store(store) is QUICK[backend]
    with FsStore(tmp_path / "synced", durability="fsync") as synced:
        assert not quick_store(synced)

    async def threads(core: Core) -> tuple[int, int]:
        ran = await core.run(threading.get_ident)
        await core.close()
        return threading.get_ident(), ran

    for store_thread in (None, True, False):
        kept = {} if store_thread is None else {"store_thread": store_thread}
        core = Core(store, Upstream("http://127.0.0.1:9/v1"), **kept)
        loop_thread, ran = asyncio.run(threads(core))
        assert (ran == loop_thread) is (store_thread is False)
