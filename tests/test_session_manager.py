"""``PersistentSession`` (agent/session_manager.py, seeds/004 "See also"), on every store.

One conversation over a store: load or create by context id, add messages, save (auto-save
on by default, off per session), the seed's fields and session-file shape, legacy files, other
writers, and the manager using it as its cache entry (turns against the fake model server).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import terrarium
from fakeserver import FakeServer
from helpers.seed_doc import SEED_FILE
from pg import fresh_schema, pg_database  # noqa: F401  (the postgres store's database)
from terrarium import (
    ContextId,
    FsStore,
    MemoryStore,
    PersistentSession,
    SegmentStartState,
    Store,
    create_segment_with_ids,
    new_segment_id,
    new_session_id,
    read_entries,
    restore,
    states,
)
from terrarium.agent import MultiContextManager
from terrarium.agent import PersistentSession as AgentPersistentSession
from terrarium.agent.session_manager import PersistentSession as ModulePersistentSession
from terrarium.errors import ContextNotFound, InvalidContextId
from terrarium.export import export_context
from terrarium.formats import terrarium_json as tj
from terrarium.llm.vllm_client import VLLMClient
from terrarium.sessions import append_entries

CONTEXT = "irc:#python"
PROMPT = "You are a helpful IRC bot. Be concise."

SEED = json.loads(SEED_FILE)  # seeds/004's "Session File Format" example

BACKENDS = ["memory", "fs", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _open(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Store:
    if backend == "memory":
        return MemoryStore()
    if backend == "fs":
        return FsStore(tmp_path / "sessions")
    if backend == "sqlite":
        return terrarium.SqliteStore(tmp_path / "terrarium.db")
    return terrarium.PostgresStore(request.getfixturevalue("pg_database"), schema=fresh_schema())


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """A fresh store of each backend."""
    instance = _open(request.param, tmp_path, request)
    try:
        yield instance
    finally:
        instance.close()


def kinds(store: Store, context: str = CONTEXT) -> list[str]:
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    return [entry.kind for entry in read_entries(store, head)]


def contents(store: Store, context: str = CONTEXT) -> list[Any]:
    return [item["content"] for item in restore(store, context).history]


# ---------------------------------------------------------------------------- the API


def test_exported_under_every_documented_name() -> None:
    """terrarium.PersistentSession, terrarium.agent.PersistentSession and the seed's module
    path are one class."""
    assert PersistentSession is AgentPersistentSession is ModulePersistentSession
    assert "PersistentSession" in terrarium.__all__
    assert "PersistentSession" in terrarium.agent.__all__


# ---------------------------------------------------------------------------- lifecycle


def test_a_new_session_is_created_by_its_first_message(store: Store) -> None:
    """Creation: nothing is written until the first message, which creates the context."""
    session = PersistentSession(store, CONTEXT, system_prompt=PROMPT)
    assert not session.in_store
    assert store.get_head(ContextId.parse(CONTEXT)) is None
    assert session.message_count == 0
    assert session.system_prompt == PROMPT
    session.add_message("user", "What's a decorator?")
    assert session.in_store
    head = store.get_head(ContextId.parse(CONTEXT))
    assert head is not None
    assert session.session_date == head.date
    assert session.created_at == tj.to_legacy_ts(head.created_at)
    assert kinds(store) == ["header", "user_input"]
    assert restore(store, CONTEXT).system_prompt == PROMPT


def test_load_resumes_and_refuses_a_missing_context(store: Store) -> None:
    """Resume: load finds an existing context with its full history; a missing one is an
    error, and so is a bad context id."""
    with pytest.raises(ContextNotFound, match="cli:nobody"):
        PersistentSession.load(store, "cli:nobody")
    with pytest.raises(InvalidContextId):
        PersistentSession(store, "no-colon")
    first = PersistentSession(store, CONTEXT, system_prompt=PROMPT)
    first.add_message("user", "one")
    first.add_message("assistant", "two")
    again = PersistentSession.load(store, CONTEXT)
    assert again.in_store
    assert again.history == [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
    ]
    assert again.system_prompt == PROMPT
    assert (again.created_at, again.session_date) == (first.created_at, first.session_date)
    # an existing session keeps its own prompt: the argument is for new ones
    assert PersistentSession(store, CONTEXT, system_prompt="other").system_prompt == PROMPT


def test_messages_are_logged_as_the_manager_logs_a_turn(store: Store) -> None:
    """User messages are user_input entries, assistant messages item entries; the seed's
    message shape comes back."""
    session = PersistentSession(store, CONTEXT)
    said = session.add_message("user", "hi")
    assert set(said) == {"role", "content", "timestamp"}
    assert said["role"] == "user" and said["content"] == "hi"
    tj.parse_timestamp(said["timestamp"])
    session.add_message("assistant", "hello")
    assert kinds(store) == ["header", "user_input", "item"]
    assert contents(store) == ["hi", "hello"]
    assert [(m["role"], m["content"]) for m in session.messages] == [
        ("user", "hi"),
        ("assistant", "hello"),
    ]
    assert session.messages[0]["timestamp"] == said["timestamp"]


def test_message_count_and_last_active_follow_each_message(store: Store) -> None:
    """message_count counts the history; last_active is the last entry's time."""
    session = PersistentSession(store, CONTEXT)
    stamps = []
    for n in range(4):
        session.add_message("user" if n % 2 == 0 else "assistant", f"m{n}")
        assert session.message_count == n + 1
        stamps.append(session.last_active)
        assert session.metadata["last_active"] == session.last_active
        assert session.metadata["message_count"] == n + 1
    assert stamps == sorted(stamps)
    head = store.get_head(ContextId.parse(CONTEXT))
    assert head is not None
    last = read_entries(store, head)[-1]
    assert session.last_active == tj.to_legacy_ts(last.ts)


def test_bad_messages_write_nothing(store: Store) -> None:
    """A role other than user or assistant, or content that is not text, is refused in one
    line before anything is created."""
    session = PersistentSession(store, CONTEXT)
    with pytest.raises(ValueError, match="role must be 'user' or 'assistant'"):
        session.add_message("tool", "x")
    with pytest.raises(TypeError, match="content must be a string"):
        session.add_message("user", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        session.add_message("user", "\ud800")
    assert store.get_head(ContextId.parse(CONTEXT)) is None
    assert session.message_count == 0


def test_system_prompt_changes_are_logged(store: Store) -> None:
    """Setting the prompt of a new session goes into its header; of a saved one, it is a
    config change that a reload sees."""
    session = PersistentSession(store, CONTEXT)
    session.system_prompt = "first"
    session.add_message("user", "hi")
    assert kinds(store) == ["header", "user_input"]
    session.system_prompt = "second"
    assert kinds(store) == ["header", "user_input", "config_changed"]
    assert PersistentSession.load(store, CONTEXT).system_prompt == "second"
    assert session.chat_messages()[0] == {"role": "system", "content": "second"}
    assert session.to_dict()["system_prompt"] == "second"


# ---------------------------------------------------------------------------- saving


def test_autosave_off_writes_nothing_until_save(store: Store) -> None:
    """autosave=False: a new session is not even created until save(), which writes every
    queued message and returns how many."""
    session = PersistentSession(store, CONTEXT, system_prompt=PROMPT, autosave=False)
    session.add_message("user", "one")
    session.add_message("assistant", "two")
    assert store.get_head(ContextId.parse(CONTEXT)) is None
    assert session.unsaved_entries == 2
    assert session.message_count == 2
    assert [m["content"] for m in session.to_dict()["messages"]] == ["one", "two"]
    assert session.save() == 2
    assert session.unsaved_entries == 0
    assert session.save() == 0
    assert contents(store) == ["one", "two"]
    assert kinds(store) == ["header", "user_input", "item"]
    session.add_message("user", "three")
    assert contents(store) == ["one", "two"]  # still off for this session
    assert session.save() == 1
    assert contents(store) == ["one", "two", "three"]


def test_autosave_off_on_an_existing_session_and_turned_back_on(store: Store) -> None:
    """Auto-save is per session: another session on the same context writes at once, and
    turning it on saves what is pending."""
    PersistentSession(store, CONTEXT).add_message("user", "saved")
    quiet = PersistentSession.load(store, CONTEXT, autosave=False)
    assert not quiet.autosave
    quiet.add_message("assistant", "pending")
    assert contents(store) == ["saved"]
    quiet.autosave = True
    assert contents(store) == ["saved", "pending"]
    assert quiet.unsaved_entries == 0
    quiet.add_message("user", "at once")
    assert contents(store) == ["saved", "pending", "at once"]


def test_close_saves_and_a_store_url_is_opened_and_closed(tmp_path: Path) -> None:
    """Given a folder (or a store URL) the session opens the store; close() saves what is
    queued and closes it."""
    root = tmp_path / "sessions"
    with PersistentSession(str(root), "cli:main", autosave=False) as session:
        session.add_message("user", "kept")
        assert isinstance(session.store, FsStore)
    with FsStore(root) as store:
        assert contents(store, "cli:main") == ["kept"]
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    with PersistentSession(url, "cli:main") as session:
        session.add_message("user", "in sqlite")
    assert PersistentSession.load(url, "cli:main").history[0]["content"] == "in sqlite"


# ---------------------------------------------------------------------------- the seed's shape


def test_to_dict_has_the_seed_file_shape_field_for_field(store: Store) -> None:
    """to_dict() has exactly the seed example's keys, in its order, with its types: top
    level, each message, the metadata."""
    session = PersistentSession(store, "cli:main", system_prompt="You are a helpful AI assistant.")
    session.add_message("user", "Hello!")
    session.add_message("assistant", "Hi! How can I help you?")
    data = session.to_dict()
    assert list(data) == list(SEED)
    for key, value in SEED.items():
        assert type(data[key]) is type(value), key
    assert list(data["metadata"]) == list(SEED["metadata"])
    for key, value in SEED["metadata"].items():
        assert type(data["metadata"][key]) is type(value), key
    for message, example in zip(data["messages"], SEED["messages"], strict=True):
        assert list(message) == list(example)
        assert all(type(message[k]) is type(v) for k, v in example.items())
        assert (message["role"], message["content"]) == (example["role"], example["content"])
        # the seed's timestamp form: naive ISO 8601 with microseconds
        assert len(message["timestamp"]) == len(example["timestamp"])
        assert dt.datetime.fromisoformat(message["timestamp"]).tzinfo is None
    meta = data["metadata"]
    assert (data["session_id"], data["context_type"]) == ("main", "cli")
    assert data["system_prompt"] == SEED["system_prompt"]
    assert (meta["session_id"], meta["context_type"]) == ("main", "cli")
    assert meta["message_count"] == 2 == session.message_count
    assert meta["session_date"] == session.session_date == meta["created_at"][:10]
    assert meta["created_at"] == session.created_at
    assert meta["last_active"] == session.last_active
    assert session.metadata == meta
    assert session.messages == data["messages"]


def test_to_dict_is_the_terrarium_json_export(store: Store) -> None:
    """to_dict() is what ``terrarium export -f terrarium-json`` writes for the context."""
    session = PersistentSession(store, CONTEXT, system_prompt=PROMPT)
    session.add_message("user", "What's a decorator?")
    session.add_message("assistant", "A function that wraps another.")
    assert session.to_dict() == json.loads(tj.export_context(store, CONTEXT))
    exported = export_context(store, CONTEXT, "terrarium-json")
    assert isinstance(exported, str)
    assert session.to_dict() == json.loads(exported)


def test_a_new_session_with_nothing_said_is_a_seed_file_too(store: Store) -> None:
    """Before its first message a session has the seed's shape: no messages, count 0."""
    data = PersistentSession(store, "web:session_abc123").to_dict()
    assert list(data) == list(SEED)
    assert data["messages"] == []
    assert data["system_prompt"] == ""
    assert data["metadata"]["message_count"] == 0
    assert (data["session_id"], data["context_type"]) == ("session_abc123", "web")


# ---------------------------------------------------------------------------- resume


def test_load_finds_a_session_of_another_date(store: Store) -> None:
    """Resume across dates: a session created on an earlier day is found and continued,
    keeping its date."""
    create_segment_with_ids(
        store,
        new_session_id(),
        new_segment_id(),
        SegmentStartState("old prompt", history=[{"role": "user", "content": "yesterday"}]),
        context="cli:morning_chat",
        ts="2025-11-05T09:00:00.000001Z",
    )
    session = PersistentSession.load(store, "cli:morning_chat")
    assert session.session_date == "2025-11-05"
    assert session.created_at == "2025-11-05T09:00:00.000001"
    session.add_message("assistant", "today")
    assert contents(store, "cli:morning_chat") == ["yesterday", "today"]
    assert session.to_dict()["metadata"]["session_date"] == "2025-11-05"


def test_load_across_date_folders_without_the_index(root: Path) -> None:
    """The filesystem store finds a context in an older date folder even after its index is
    lost (the seed's "searches across dates if needed")."""
    with FsStore(root) as store:
        create_segment_with_ids(
            store,
            new_session_id(),
            new_segment_id(),
            SegmentStartState(),
            context="cli:main",
            ts="2025-11-05T09:00:00Z",
        )
        PersistentSession(store, "cli:main").add_message("user", "then")
    assert (root / "cli" / "2025-11-05" / "main" / "head.json").exists()
    for path in sorted((root / ".index").rglob("*"), reverse=True):
        if path.is_file() and path.parent.name in ("contexts", "sessions"):
            path.unlink()
    with FsStore(root) as store:
        session = PersistentSession.load(store, "cli:main")
        assert session.history == [{"role": "user", "content": "then"}]
        assert session.session_date == "2025-11-05"


def write_seed_file(root: Path) -> Path:
    path = root / "cli" / "2025-11-06" / "main.json"
    path.parent.mkdir(parents=True)
    path.write_text(SEED_FILE)
    return path


def test_a_legacy_seed_file_loads_in_place_and_is_imported_on_the_first_message(
    root: Path,
) -> None:
    """A seed-format JSON file loads as a session without being changed or imported; the
    first message imports it into the log and continues it."""
    path = write_seed_file(root)
    before = path.read_bytes()
    with FsStore(root) as store:
        session = PersistentSession.load(store, "cli:main")
        assert not session.in_store
        assert session.legacy_path == path
        assert session.to_dict() == SEED
        assert session.messages == SEED["messages"]
        assert session.metadata == SEED["metadata"]
        assert session.system_prompt == SEED["system_prompt"]
        assert session.created_at == SEED["metadata"]["created_at"]
        assert session.session_date == "2025-11-06"
        assert session.message_count == 2
        assert store.get_head(ContextId.parse("cli:main")) is None
        session.add_message("user", "I'm back")
        assert session.in_store and session.legacy_path is None
        assert contents(store, "cli:main") == ["Hello!", "Hi! How can I help you?", "I'm back"]
        data = session.to_dict()
        assert data["messages"][:2] == SEED["messages"]
        assert data["metadata"]["message_count"] == 3
        assert data["metadata"]["created_at"] == SEED["metadata"]["created_at"]
    assert path.read_bytes() == before


def test_a_legacy_file_with_autosave_off_is_imported_by_save(root: Path) -> None:
    """With auto-save off the file is imported only when save() writes the queued messages."""
    write_seed_file(root)
    with FsStore(root) as store:
        session = PersistentSession(store, "cli:main", autosave=False)
        session.add_message("user", "queued")
        assert store.get_head(ContextId.parse("cli:main")) is None
        assert [m["content"] for m in session.messages][-1] == "queued"
        assert session.save() == 1
        assert contents(store, "cli:main")[-1] == "queued"
        assert len(contents(store, "cli:main")) == 3


# ---------------------------------------------------------------------------- other writers


def test_a_stale_session_sees_another_sessions_messages(store: Store) -> None:
    """Two sessions on one context: each write first checks the store, so neither
    overwrites the other and both see everything."""
    a = PersistentSession(store, CONTEXT)
    a.add_message("user", "from a")
    b = PersistentSession.load(store, CONTEXT)
    b.add_message("assistant", "from b")
    a.add_message("user", "a again")
    assert contents(store) == ["from a", "from b", "a again"]
    assert a.message_count == 3
    b.refresh()
    assert b.history == a.history


@pytest.fixture(params=["fs", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def two_stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[Store, Store]]:
    """Two stores on the same data, as two processes would open them."""
    first = _open(request.param, tmp_path, request)
    if isinstance(first, FsStore):
        second: Store = FsStore(first.root)
    elif isinstance(first, terrarium.SqliteStore):
        second = terrarium.SqliteStore(first.path)
    else:
        assert isinstance(first, terrarium.PostgresStore)
        dsn = request.getfixturevalue("pg_database")
        second = terrarium.PostgresStore(dsn, schema=first.schema)
    try:
        yield first, second
    finally:
        second.close()
        first.close()


def test_sessions_in_two_store_instances_interleave_without_loss(
    two_stores: tuple[Store, Store],
) -> None:
    """Sessions of one context opened through two stores on the same data (two processes)
    each see the other's messages before they write."""
    one, two = two_stores
    a = PersistentSession(one, CONTEXT)
    b = PersistentSession(two, CONTEXT)  # opened before a's first message: new for it too
    for n in range(3):
        a.add_message("user", f"a{n}")
        b.add_message("assistant", f"b{n}")
    expected = [x for n in range(3) for x in (f"a{n}", f"b{n}")]
    assert contents(one) == expected
    a.refresh()
    assert [m["content"] for m in a.history] == expected == [m["content"] for m in b.history]
    assert a.message_count == b.message_count == 6


def test_a_writer_that_bypasses_the_lock_is_detected_and_followed(store: Store) -> None:
    """A write that does not take the context lock makes the session's expected seq stale:
    the conflict is detected, the session re-reads and appends after it."""
    session = PersistentSession(store, CONTEXT)
    session.add_message("user", "first")
    ref = store.get_head(ContextId.parse(CONTEXT))
    assert ref is not None
    real_refresh = session._refresh
    calls = {"n": 0}

    def stale_refresh() -> bool:  # pretend the cache check ran before the other write
        calls["n"] += 1
        return True

    session._refresh = stale_refresh  # type: ignore[method-assign]
    append_entries(store, ref, [("item", {"item": {"role": "assistant", "content": "sneaky"}})])
    session.add_message("user", "after")
    session._refresh = real_refresh  # type: ignore[method-assign]
    assert calls["n"] == 1
    assert contents(store) == ["first", "sneaky", "after"]
    assert [m["content"] for m in session.history] == ["first", "sneaky", "after"]


def test_saving_onto_a_context_that_moved_on_forks_instead_of_clobbering(store: Store) -> None:
    """Queued messages of a stale view are saved onto a fork of that view; the other
    writer's entries stay in the session tree."""
    PersistentSession(store, CONTEXT).add_message("user", "shared")
    quiet = PersistentSession.load(store, CONTEXT, autosave=False)
    quiet.add_message("assistant", "mine")
    PersistentSession.load(store, CONTEXT).add_message("assistant", "theirs")
    assert quiet.save() == 1
    assert contents(store) == ["shared", "mine"]
    assert quiet.history == restore(store, CONTEXT).history
    session_id = restore(store, CONTEXT).session_id
    assert len(store.list_segments(session_id)) == 2  # the other branch is kept


def test_public_writes_take_the_store_context_lock(store: Store) -> None:
    """add_message and save hold the store's context lock (ContextLocking) while writing."""
    assert isinstance(store, terrarium.ContextLocking)
    taken: list[str] = []
    real = store.lock_context

    def recording(context: ContextId) -> Any:
        taken.append(str(context))
        return real(context)

    store.lock_context = recording  # type: ignore[method-assign]
    session = PersistentSession(store, CONTEXT, autosave=False)
    session.add_message("user", "x")
    session.save()
    assert taken == [CONTEXT, CONTEXT]


def test_a_deleted_context_is_an_error_not_a_silent_recreate(store: Store) -> None:
    """A saved session whose context was deleted refuses further messages."""
    session = PersistentSession(store, CONTEXT)
    session.add_message("user", "x")
    states.delete_context(store, ContextId.parse(CONTEXT))
    with pytest.raises(ContextNotFound, match="was deleted"):
        session.add_message("user", "y")
    assert store.get_head(ContextId.parse(CONTEXT)) is None


def test_threads_sharing_one_session_lose_nothing(store: Store) -> None:
    """One session object used by several threads: every message logged once, no gaps."""
    session = PersistentSession(store, CONTEXT)

    def say(n: int) -> None:
        for i in range(10):
            session.add_message("user", f"{n}-{i}")

    threads = [threading.Thread(target=say, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    logged = contents(store)
    assert sorted(logged) == sorted(f"{n}-{i}" for n in range(4) for i in range(10))
    assert session.message_count == 40
    head = store.get_head(ContextId.parse(CONTEXT))
    assert head is not None
    assert [e.seq for e in read_entries(store, head)] == list(range(41))


# ---------------------------------------------------------------------------- the manager


def make_manager(server: FakeServer, store: Store, **kwargs: Any) -> MultiContextManager:
    client = VLLMClient(base_url=server.root_url, max_retries=0, backoff_base=0.001)
    return MultiContextManager(client, store=store, **kwargs)


def test_the_manager_turns_write_through_its_persistent_session(
    store: Store, fake_server: FakeServer
) -> None:
    """get_session returns the manager's own cache entry: a turn moves its message_count,
    and what is added through it is in the next request."""

    async def main() -> None:
        manager = make_manager(fake_server, store)
        session = manager.get_session(CONTEXT)
        assert not session.in_store  # new: created by its first message
        await manager.process_with_context(CONTEXT, "What's a decorator?", PROMPT)
        assert manager.get_session(CONTEXT) is session
        assert session.in_store
        assert session.message_count == 2
        assert session.system_prompt == PROMPT
        assert session.history[-1] == {"role": "assistant", "content": "echo: What's a decorator?"}
        session.add_message("user", "added by hand")
        session.add_message("assistant", "noted")
        await manager.process_with_context(CONTEXT, "and now?")
        assert session.message_count == 6
        sent = fake_server.requests[-1]["messages"]
        assert [m["content"] for m in sent[-3:]] == ["added by hand", "noted", "and now?"]
        stats = manager.get_stats(CONTEXT)
        assert stats["message_count"] == session.message_count
        assert stats["last_active"] == restore(store, CONTEXT).last_active
        assert session.to_dict()["metadata"]["message_count"] == 6
        await manager.aclose()

    asyncio.run(main())
    assert kinds(store)[:2] == ["header", "user_input"]
    assert contents(store)[-1] == "echo: and now?"


def test_the_managers_autosave_is_the_sessions(store: Store, fake_server: FakeServer) -> None:
    """set_autosave and save act on the session the manager holds, and vice versa."""

    async def main() -> None:
        manager = make_manager(fake_server, store)
        await manager.process_with_context(CONTEXT, "one")
        session = manager.get_session(CONTEXT)
        manager.set_autosave(CONTEXT, False)
        assert session.autosave is False
        await manager.process_with_context(CONTEXT, "two")
        assert session.unsaved_entries == manager.get_stats(CONTEXT)["unsaved_entries"] == 5
        assert contents(store) == ["one", "echo: one"]
        assert manager.save(CONTEXT) == 5
        assert session.unsaved_entries == 0
        session.add_message("user", "queued by hand")
        assert manager.get_stats(CONTEXT)["unsaved_entries"] == 1
        session.autosave = True
        assert contents(store)[-1] == "queued by hand"
        await manager.aclose()

    asyncio.run(main())


def test_the_manager_resumes_a_session_written_alone(store: Store, fake_server: FakeServer) -> None:
    """A session written without a manager is continued by a manager turn, with its history
    sent."""
    alone = PersistentSession(store, CONTEXT, system_prompt=PROMPT)
    alone.add_message("user", "before")
    alone.add_message("assistant", "the manager")

    async def main() -> None:
        manager = make_manager(fake_server, store)
        await manager.process_with_context(CONTEXT, "now")
        await manager.aclose()

    asyncio.run(main())
    sent = fake_server.requests[-1]["messages"]
    assert [m["content"] for m in sent] == [PROMPT, "before", "the manager", "now"]
    alone.add_message("user", "after")
    assert contents(store) == ["before", "the manager", "now", "echo: now", "after"]


def test_get_session_of_a_legacy_file_reads_it_in_place(
    root: Path, fake_server: FakeServer
) -> None:
    """The manager's session of a context only a legacy file holds reads the file without
    importing it; the first turn imports it and the same object follows."""
    path = write_seed_file(root)
    with FsStore(root) as store:

        async def main() -> None:
            manager = make_manager(fake_server, store)
            session = manager.get_session("cli:main")
            assert session.legacy_path == path
            assert session.to_dict() == SEED
            assert store.get_head(ContextId.parse("cli:main")) is None
            with pytest.raises(ContextNotFound):
                manager.clear_context("cli:nothing")
            await manager.process_with_context("cli:main", "again")
            assert manager.get_session("cli:main") is session
            assert session.in_store
            assert session.message_count == 4
            await manager.aclose()

        asyncio.run(main())
        assert contents(store, "cli:main")[-2:] == ["again", "echo: again"]


def test_messages_queued_before_a_new_contexts_first_turn_are_kept(
    store: Store, fake_server: FakeServer
) -> None:
    """With auto-save off, messages added to a new context's session before its first turn
    stay queued ahead of the turn's, and save() writes them all in order."""

    async def main() -> None:
        manager = make_manager(fake_server, store, autosave=False)
        session = manager.get_session(CONTEXT)
        session.add_message("user", "context first")
        session.add_message("assistant", "ok")
        await manager.process_with_context(CONTEXT, "then a turn")
        assert session.unsaved_entries == 7
        sent = fake_server.requests[-1]["messages"]
        assert [m["content"] for m in sent] == ["context first", "ok", "then a turn"]
        assert manager.save() == 7
        await manager.aclose()

    asyncio.run(main())
    assert contents(store) == ["context first", "ok", "then a turn", "echo: then a turn"]
    assert kinds(store)[:3] == ["header", "user_input", "item"]


@pytest.mark.timeout(60)
def test_a_context_in_a_turn_is_not_evicted_from_under_it(
    store: Store, fake_server: FakeServer
) -> None:
    """More contexts in turns at once than the cache holds, auto-save off: the cache keeps
    each session until its turn ends (evicting one in a turn would wait for the lock its own
    turn holds), then evicts it with its entries saved."""
    fake_server.delay = 0.05

    async def main() -> None:
        manager = make_manager(fake_server, store, cache_size=1, autosave=False)
        await asyncio.gather(
            *(manager.process_with_context(f"cli:c{n}", f"hi {n}") for n in range(3))
        )
        manager.close()
        await manager.client.aclose()

    asyncio.run(main())
    for n in range(3):
        assert contents(store, f"cli:c{n}") == [f"hi {n}", f"echo: hi {n}"]


def test_an_unreadable_legacy_file_is_a_one_line_error(root: Path) -> None:
    """A legacy file that is not a session raises its one-line error naming the file, and
    nothing is written."""
    path = root / "cli" / "2025-11-06" / "broken.json"
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    for opener in (PersistentSession, PersistentSession.load):
        with pytest.raises(tj.LegacyFormatError, match=r"broken\.json: not valid JSON") as info:
            opener(str(root), "cli:broken")
        assert "\n" not in str(info.value)
    with FsStore(root) as store:
        assert store.get_head(ContextId.parse("cli:broken")) is None
    assert path.read_text() == "{not json"


def test_an_eviction_whose_save_fails_keeps_the_entries_and_not_the_error(
    store: Store, fake_server: FakeServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Evicting a context whose queued entries cannot be saved logs it and keeps the session
    cached; the turn that caused the eviction is not failed, and close() saves them later."""

    async def main() -> None:
        manager = make_manager(fake_server, store, cache_size=1, autosave=False)
        await manager.process_with_context("cli:a", "queued")
        session = manager.get_session("cli:a")
        real_save = session.save

        def failing_save() -> int:
            raise OSError("disk on fire")

        session.save = failing_save  # type: ignore[method-assign]
        assert await manager.process_with_context("cli:b", "hi") == "echo: hi"
        assert "disk on fire" in caplog.text
        assert manager.get_session("cli:a") is session
        session.save = real_save  # type: ignore[method-assign]
        manager.close()
        await manager.client.aclose()

    asyncio.run(main())
    assert contents(store, "cli:a") == ["queued", "echo: queued"]
    assert contents(store, "cli:b") == ["hi", "echo: hi"]


def test_a_failed_save_keeps_the_entries_queued(store: Store) -> None:
    """A save that fails in the store loses nothing: the entries stay queued, and the next
    save writes them."""
    session = PersistentSession(store, CONTEXT)
    session.add_message("user", "saved")
    session.autosave = False
    session.add_message("assistant", "queued")
    real_append = store.append
    calls = {"n": 0}

    def failing_append(*args: Any, **kwargs: Any) -> int:
        calls["n"] += 1
        raise OSError("no space left on device")

    store.append = failing_append  # type: ignore[method-assign]
    with pytest.raises(OSError, match="no space left"):
        session.save()
    store.append = real_append  # type: ignore[method-assign]
    assert calls["n"] == 1
    assert session.unsaved_entries == 1
    assert session.save() == 1
    assert contents(store) == ["saved", "queued"]


@pytest.mark.parametrize("autosave", [True, False])
def test_a_message_kept_in_a_blob_stays_whole_in_the_session(
    tmp_path: Path, autosave: bool
) -> None:
    """The log holds a long message as a preview and a blob; the open session, like a session
    opened afresh, holds all of it."""
    store = FsStore(tmp_path, blob_threshold=1024)
    long = "word " * 2_000
    session = PersistentSession(store, CONTEXT, autosave=autosave)
    for role, text in (("user", "hello"), ("assistant", "hi"), ("user", long)):
        session.add_message(role, text)
    session.save()
    assert session.chat_messages()[-1]["content"] == long
    assert PersistentSession(store, CONTEXT).chat_messages()[-1]["content"] == long
    store.close()
