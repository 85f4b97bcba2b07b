"""Both seed documents, statement by statement, in their own order (issue 17).

Hold ``seeds/004_...txt`` (the Terrarium Agent's "Session Storage Format") and
``seeds/002_...txt`` (the Rust ``session_store`` crate's module header) beside this file: each
section below is a heading of the document, and each test one statement of it that implies
behaviour, quoted in the test's ``QUOTE``. ``test_every_quote_is_in_the_documents`` checks the
quotes against the documents themselves (when ``../shared/seeds`` is beside the checkout), so
a quote cannot drift from what the documents say.

Two planned features of seeds/004 ("Automatic archival", "Session statistics dashboard") are
open issues (12 and 13) and have no test here yet.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import terrarium
from fakeserver import FakeServer
from helpers.seed_doc import SEED_FILE
from terrarium import (
    ContextId,
    FsStore,
    MultiContextManager,
    SegmentStartState,
    TraceEntry,
    VLLMClient,
    collect_state,
    create_compacted_segment,
    create_segment,
    fork,
    new_segment_id,
    new_session_id,
    restore,
    restore_by_segment,
)
from terrarium.export import FORMATS, export_context, export_many
from terrarium.model import utc_now
from terrarium.sessions import create_segment_with_ids, read_entries, save_trace

REPO = Path(__file__).resolve().parents[1]
SEEDS = REPO.parent / "shared" / "seeds"
TERRARIUM_DOC = "004_3f42c842b362027b.txt"
CRATE_DOC = "002_3525d682b2ac43de.txt"

QUOTES: dict[str, list[str]] = {TERRARIUM_DOC: [], CRATE_DOC: []}
"""Every statement quoted below, by document (filled in by :func:`quote`)."""


def quote(doc: str, *texts: str) -> tuple[str, ...]:
    """Record statements of ``doc`` that the test after it checks; returns them."""
    QUOTES[doc].extend(texts)
    return texts


_RUNNER: list[asyncio.Runner] = []
"""The test's event loop: a client belongs to one loop, so every turn of a test runs on it."""


@pytest.fixture(autouse=True)
def _loop() -> Iterator[None]:
    with asyncio.Runner() as runner:
        _RUNNER.append(runner)
        yield
        _RUNNER.pop()


def run(coro: Any) -> Any:
    return _RUNNER[-1].run(coro)


def make_manager(server: FakeServer, storage: str | Path, **kwargs: Any) -> MultiContextManager:
    client = VLLMClient(base_url=server.root_url, max_retries=0, backoff_base=0.001)
    return MultiContextManager(client, storage_dir=str(storage), **kwargs)


@contextmanager
def managed(
    server: FakeServer, storage: str | Path, **kwargs: Any
) -> Iterator[MultiContextManager]:
    """A manager closed, client and all, on the test's loop."""
    instance = make_manager(server, storage, **kwargs)
    try:
        yield instance
    finally:
        run(instance.aclose())


@pytest.fixture
def manager(fake_server: FakeServer, root: Path) -> Iterator[MultiContextManager]:
    with managed(fake_server, root) as instance:
        yield instance


def say(manager: MultiContextManager, context: str, text: str, **kwargs: Any) -> str:
    reply: str = run(manager.process_with_context(context, text, **kwargs))
    return reply


def run_script(
    *args: str, cwd: Path, stdin: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``python <args>`` from the checkout, as a user would, without TERRARIUM_* settings."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    full_env.update(env)
    return subprocess.run(
        [sys.executable, *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=full_env,
        timeout=120,
    )


def seed_json(session_id: str, context_type: str, created: str, turns: int = 1) -> dict[str, Any]:
    """A session file in the seed's format (its "Session File Format" example's shape)."""
    start = dt.datetime.fromisoformat(created)
    messages = []
    for i in range(turns):
        for role, text, seconds in (("user", f"q{i}", 10 * i), ("assistant", f"a{i}", 10 * i + 3)):
            stamp = (start + dt.timedelta(seconds=seconds)).isoformat(timespec="microseconds")
            messages.append({"role": role, "content": text, "timestamp": stamp})
    return {
        "session_id": session_id,
        "context_type": context_type,
        "system_prompt": "You are a helpful AI assistant.",
        "messages": messages,
        "metadata": {
            "created_at": created,
            "last_active": created,
            "message_count": len(messages),
            "session_id": session_id,
            "context_type": context_type,
            "session_date": created[:10],
        },
    }


def write_seed_file(root: Path, relative: str, data: dict[str, Any]) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


def listing_paths(manager: MultiContextManager) -> dict[str, str]:
    """``{context_id: date}`` of every row of ``list_all_contexts``."""
    return {
        f"{ctype}:{row['session_id']}": row["date"]
        for ctype, rows in manager.list_all_contexts().items()
        for row in rows
    }


# =============================================================================================
# seeds/004: "Session Storage Format"
# =============================================================================================

# --------------------------------------------------------------------------- Storage Structure

STORAGE_TREE = quote(
    TERRARIUM_DOC,
    "│   │   ├── xyz123.json",
    "│       ├── #python.json",
    "│       ├── pokemon_run1.json",
    "        └── session_abc123.json",
)
# The tree of the document, file by file.
SEED_TREE = {
    "cli/2025-11-06/xyz123.json": "cli:xyz123",
    "cli/2025-11-06/main.json": "cli:main",
    "cli/2025-11-05/morning_chat.json": "cli:morning_chat",
    "irc/2025-11-06/#python.json": "irc:#python",
    "irc/2025-11-06/#linux.json": "irc:#linux",
    "game/2025-11-06/pokemon_run1.json": "game:pokemon_run1",
    "game/2025-11-06/chess_game2.json": "game:chess_game2",
    "web/2025-11-06/session_abc123.json": "web:session_abc123",
}


def test_the_storage_structure_is_read_where_it_lies(
    root: Path, manager: MultiContextManager
) -> None:
    """Sessions organized by context type and date: the document's tree is listed as is."""
    for relative, context in SEED_TREE.items():
        ctype, name = context.split(":", 1)
        date = relative.split("/")[1]
        write_seed_file(root, relative, seed_json(name, ctype, f"{date}T14:30:00.123456"))
    before = {p: p.read_bytes() for p in root.rglob("*.json")}
    assert listing_paths(manager) == {
        context: relative.split("/")[1] for relative, context in SEED_TREE.items()
    }
    assert sorted(manager.list_all_contexts()) == ["cli", "game", "irc", "web"]
    assert {p: p.read_bytes() for p in root.rglob("*.json")} == before  # a read writes nothing


# --------------------------------------------------------------------------- Path Format

PATH_FORMAT = quote(
    TERRARIUM_DOC,
    "sessions/{context_type}/{date}/{session_id}.json",
    "- **date**: YYYY-MM-DD format from session creation",
)


def test_path_format_type_then_creation_date_then_name(root: Path, tmp_path: Path) -> None:
    """A session lives under its type and its creation date; the seed's file path is what
    ``export --all -f terrarium-json`` writes, and later activity never moves it."""
    with FsStore(root) as store:
        create_segment_with_ids(
            store, new_session_id(), new_segment_id(), context="cli:main", ts="2025-11-05T23:59:00Z"
        )
        create_segment(store, context="irc:#python")
        today = dt.datetime.now(dt.UTC).date().isoformat()
        assert (root / "cli" / "2025-11-05" / "main").is_dir()
        assert (root / "irc" / today / "#python").is_dir()
        export_many(store, None, "terrarium-json", tmp_path / "out")
    assert (tmp_path / "out" / "cli" / "2025-11-05" / "main.json").is_file()
    assert (tmp_path / "out" / "irc" / today / "#python.json").is_file()


IDS_WITHIN_TYPE = quote(TERRARIUM_DOC, "- **session_id**: Unique identifier within context type")


def test_a_session_id_is_unique_within_its_type_only(manager: MultiContextManager) -> None:
    """``cli:main`` and ``irc:main`` are two sessions."""
    say(manager, "cli:main", "in the cli")
    say(manager, "irc:main", "on irc")
    assert [m["content"] for m in manager.history("cli:main")] == ["in the cli", "echo: in the cli"]
    assert [m["content"] for m in manager.history("irc:main")] == ["on irc", "echo: on irc"]


# --------------------------------------------------------------------------- Context ID Format

CONTEXT_IDS = quote(
    TERRARIUM_DOC,
    "Full context identifier: `{type}:{id}`",
    "- `cli:main`",
    "- `irc:#python`",
    "- `game:pokemon_run1`",
    "- `web:session_abc`",
)


@pytest.mark.parametrize(
    ("text", "ctype", "name"),
    [
        ("cli:main", "cli", "main"),
        ("irc:#python", "irc", "#python"),
        ("game:pokemon_run1", "game", "pokemon_run1"),
        ("web:session_abc", "web", "session_abc"),
    ],
)
def test_the_context_id_examples(text: str, ctype: str, name: str) -> None:
    """Each example is ``{type}:{id}``, accepted for a new context and written back as is."""
    context = ContextId.parse(text)
    assert (context.type, context.name, str(context)) == (ctype, name, text)
    context.check_new()


# --------------------------------------------------------------------------- Session File Format


def _document_example() -> dict[str, Any]:
    """The document's session file, word for word."""
    return json.loads(SESSION_FILE_EXAMPLE)


SESSION_FILE_EXAMPLE = SEED_FILE.rstrip("\n")
quote(TERRARIUM_DOC, SESSION_FILE_EXAMPLE)


def test_the_example_session_file_is_read(root: Path, manager: MultiContextManager) -> None:
    """The example file, as written, is a session: its messages, prompt and creation date.
    Its ``message_count`` (10, beside two messages) is derived data: counted, not trusted."""
    write_seed_file(root, "cli/2025-11-06/main.json", _document_example())
    assert [(m["role"], m["content"]) for m in manager.history("cli:main")] == [
        ("user", "Hello!"),
        ("assistant", "Hi! How can I help you?"),
    ]
    stats = manager.get_stats("cli:main")
    assert stats["message_count"] == 2
    assert stats["system_prompt"] == "You are a helpful AI assistant."
    assert (stats["created_at"], stats["last_active"]) == (  # as written, as list shows them
        "2025-11-06T14:30:00.123456",
        "2025-11-06T14:35:12.987654",
    )
    assert stats["session_date"] == "2025-11-06"


FIELDS = quote(
    TERRARIUM_DOC,
    "- `session_id` (string): Unique identifier",
    "- `context_type` (string): Context type (cli, irc, game, web)",
    "- `system_prompt` (string): System prompt for the conversation",
    "- `messages` (array): Conversation history",
    "- `metadata` (object): Session metadata",
    '- `role` (string): "user" or "assistant"',
    "- `content` (string): Message text",
    "- `timestamp` (string): ISO 8601 timestamp",
    "- `created_at` (string): Session creation timestamp",
    "- `last_active` (string): Last activity timestamp",
    "- `message_count` (integer): Number of messages",
    "- `session_id` (string): Session identifier",
    "- `context_type` (string): Context type",
    "- `session_date` (string): Date in YYYY-MM-DD format",
)


def test_every_field_of_the_format_as_written(manager: MultiContextManager) -> None:
    """A native session exported as Terrarium JSON has every field, of the type named, with
    the example's keys in the example's order."""
    say(manager, "cli:main", "Hello!", system_prompt="You are a helpful AI assistant.")
    say(manager, "cli:main", "And again")
    data = json.loads(export_context(manager.store, "cli:main", "terrarium-json"))
    example = _document_example()
    assert list(data) == list(example)
    assert list(data["metadata"]) == list(example["metadata"])
    assert (data["session_id"], data["context_type"]) == ("main", "cli")
    assert data["system_prompt"] == "You are a helpful AI assistant."
    assert [list(m) for m in data["messages"]] == [["role", "content", "timestamp"]] * 4
    assert [m["role"] for m in data["messages"]] == ["user", "assistant"] * 2
    assert all(isinstance(m["content"], str) for m in data["messages"])
    for stamp in [m["timestamp"] for m in data["messages"]] + [
        data["metadata"]["created_at"],
        data["metadata"]["last_active"],
    ]:
        assert dt.datetime.fromisoformat(stamp)  # ISO 8601
    meta = data["metadata"]
    assert meta["message_count"] == len(data["messages"]) == 4
    assert isinstance(meta["message_count"], int)
    assert (meta["session_id"], meta["context_type"]) == ("main", "cli")
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", meta["session_date"])
    assert meta["session_date"] == meta["created_at"][:10]
    assert meta["last_active"] >= meta["created_at"]


# --------------------------------------------------------------------------- Python API

PYTHON_API = quote(
    TERRARIUM_DOC,
    'client = VLLMClient(base_url="http://localhost:8000")',
    'manager = MultiContextManager(client, storage_dir="./sessions")',
)


def test_the_client_takes_the_server_root_and_the_manager_a_folder(
    fake_server: FakeServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``base_url`` without ``/v1``, as the document writes it, reaches the server's
    ``/v1`` API; ``storage_dir="./sessions"`` is relative to the working folder."""
    monkeypatch.chdir(tmp_path)
    client = VLLMClient(base_url=fake_server.root_url)
    assert not fake_server.root_url.endswith("/v1")
    manager = MultiContextManager(client, storage_dir="./sessions")
    assert say(manager, "cli:main", "hello") == "echo: hello"
    run(manager.aclose())
    assert fake_server.requests[-1]["messages"][-1]["content"] == "hello"
    assert list((tmp_path / "sessions" / "cli").iterdir())


PROCESS = quote(
    TERRARIUM_DOC,
    "# Process with context (auto-saves)",
    'context_id="irc:#python",',
    'user_message="What\'s a decorator?",',
    'system_prompt="You are a helpful IRC bot. Be concise."',
)


def test_process_with_context_answers_and_has_saved_when_it_returns(
    fake_server: FakeServer, manager: MultiContextManager, root: Path
) -> None:
    """The call returns the reply text, and both messages are on disk by then: a new
    manager (another process) sees them."""
    response = run(
        manager.process_with_context(
            context_id="irc:#python",
            user_message="What's a decorator?",
            system_prompt="You are a helpful IRC bot. Be concise.",
        )
    )
    assert response == "echo: What's a decorator?"
    assert fake_server.requests[-1]["messages"][0] == {
        "role": "system",
        "content": "You are a helpful IRC bot. Be concise.",
    }
    with FsStore(root) as store:
        state = restore(store, "irc:#python")
    assert [m["content"] for m in state.history] == [
        "What's a decorator?",
        "echo: What's a decorator?",
    ]
    assert state.system_prompt == "You are a helpful IRC bot. Be concise."


LIST_ALL = quote(
    TERRARIUM_DOC,
    '# Returns: {"cli": [{"session_id": "main", "date": "2025-11-06", ...}], ...}',
)


def test_list_all_contexts_returns_rows_by_type(manager: MultiContextManager) -> None:
    """A dict from type to a list of rows with ``session_id`` and ``date``."""
    say(manager, "cli:main", "hi")
    say(manager, "irc:#python", "hi")
    listing = manager.list_all_contexts()
    assert sorted(listing) == ["cli", "irc"]
    (row,) = listing["cli"]
    assert row["session_id"] == "main"
    assert row["date"] == dt.datetime.now(dt.UTC).date().isoformat()
    assert listing["irc"][0]["session_id"] == "#python"


GET_STATS = quote(TERRARIUM_DOC, '# Returns: {"context_id": "cli:main", "message_count": 10, ...}')


def test_get_stats_returns_the_context_id_and_message_count(manager: MultiContextManager) -> None:
    for i in range(5):
        say(manager, "cli:main", f"message {i}")
    stats = manager.get_stats("cli:main")
    assert (stats["context_id"], stats["message_count"]) == ("cli:main", 10)


CLEAR = quote(TERRARIUM_DOC, "# Clear history (keeps session)", 'manager.clear_context("cli:main")')


def test_clear_context_keeps_the_session(manager: MultiContextManager) -> None:
    say(manager, "cli:main", "hi", system_prompt="Be brief.")
    manager.clear_context("cli:main")
    assert "cli:main" in listing_paths(manager)
    stats = manager.get_stats("cli:main")
    assert stats["message_count"] == 0
    assert stats["system_prompt"] == "Be brief."


DELETE = quote(TERRARIUM_DOC, "# Delete session entirely", 'manager.delete_context("cli:main")')


def test_delete_context_removes_the_session(manager: MultiContextManager) -> None:
    say(manager, "cli:main", "hi")
    say(manager, "cli:other", "hi")
    assert manager.delete_context("cli:main") is True
    assert listing_paths(manager).keys() == {"cli:other"}
    with pytest.raises(terrarium.ContextNotFound):
        manager.get_stats("cli:main")
    assert manager.delete_context("cli:main") is False


# --------------------------------------------------------------------------- CLI Usage

CLI_PICKER = quote(TERRARIUM_DOC, "# Interactive session picker", "python chat.py")


def test_chat_py_with_piped_input_needs_no_picker(tmp_path: Path, fake_server: FakeServer) -> None:
    """Without a terminal the picker never blocks: the chat is ``cli:main``. (On a terminal
    the picker opens: tests/test_chat_pty.py::test_seed_chat_py_on_a_terminal.)"""
    result = run_script(
        str(REPO / "chat.py"),
        cwd=tmp_path,
        stdin="hello\n",
        TERRARIUM_BASE_URL=fake_server.base_url,
    )
    assert result.returncode == 0, result.stderr
    assert "echo: hello" in result.stdout
    assert (tmp_path / "sessions" / "cli").is_dir()
    with FsStore(tmp_path / "sessions") as store:
        assert [h.context for h in store.list_contexts()] == ["cli:main"]


CLI_FLAGS = quote(
    TERRARIUM_DOC,
    "python chat.py --session-id main",
    "python chat.py --list-sessions",
    "python chat.py --delete-session main",
)


def test_chat_py_session_id_list_sessions_and_delete_session(
    tmp_path: Path, fake_server: FakeServer
) -> None:
    chat_py = str(REPO / "chat.py")
    url = fake_server.base_url
    said = run_script(
        chat_py, "--session-id", "main", "--base-url", url, cwd=tmp_path, stdin="hi\n"
    )
    assert said.returncode == 0, said.stderr
    run_script(chat_py, "--session-id", "other", "--base-url", url, cwd=tmp_path, stdin="yo\n")
    listed = run_script(chat_py, "--list-sessions", cwd=tmp_path)
    assert listed.returncode == 0
    assert "cli:main" in listed.stdout and "cli:other" in listed.stdout
    # Without a terminal nothing asks: deleting needs --yes, and says so.
    refused = run_script(chat_py, "--delete-session", "main", cwd=tmp_path)
    assert refused.returncode != 0 and "--yes" in refused.stderr
    deleted = run_script(chat_py, "--delete-session", "main", "--yes", cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr
    listed = run_script(chat_py, "--list-sessions", cwd=tmp_path)
    assert "cli:main" not in listed.stdout and "cli:other" in listed.stdout


# --------------------------------------------------------------------------- Session Lifecycle

CREATION = quote(
    TERRARIUM_DOC,
    "1. **Creation**: New session created on first message",
    "- Assigned today's date",
    "- Saved to `sessions/{type}/{date}/{id}.json`",
)


def test_creation_on_the_first_message_with_todays_date(
    manager: MultiContextManager, root: Path
) -> None:
    assert listing_paths(manager) == {}
    assert not (root / "game").exists()
    say(manager, "game:pokemon_run1", "start")
    today = dt.datetime.now(dt.UTC).date().isoformat()
    assert listing_paths(manager) == {"game:pokemon_run1": today}
    assert (root / "game" / today / "pokemon_run1").is_dir()


USAGE = quote(
    TERRARIUM_DOC,
    "2. **Usage**: Messages added during conversation",
    "- Auto-saved after each interaction",
    "- `last_active` updated",
)


def test_usage_saves_each_interaction_and_moves_last_active(
    manager: MultiContextManager, root: Path
) -> None:
    say(manager, "cli:main", "one")
    first = manager.get_stats("cli:main")["last_active"]
    say(manager, "cli:main", "two")
    with FsStore(root) as store:  # another reader, not the manager's cache
        assert len(restore(store, "cli:main").history) == 4
    assert manager.get_stats("cli:main")["last_active"] > first


RESUME = quote(
    TERRARIUM_DOC,
    "3. **Resume**: Load existing session",
    "- Searches across dates if needed",
    "- Full history restored",
)


def test_resume_finds_an_older_date_and_sends_the_full_history(
    fake_server: FakeServer, root: Path
) -> None:
    """Sessions created on other days, native and in the seed's files, continue where they
    are: no second session today, and the whole history goes to the model."""
    with FsStore(root) as store:
        create_segment_with_ids(
            store,
            new_session_id(),
            new_segment_id(),
            SegmentStartState(history=[{"role": "user", "content": "old q"}]),
            context="cli:main",
            ts="2025-11-05T10:00:00Z",
        )
    write_seed_file(
        root, "irc/2025-11-04/#linux.json", seed_json("#linux", "irc", "2025-11-04T09:00:00.000000")
    )
    with managed(fake_server, root) as manager:
        say(manager, "cli:main", "new q")
        assert [m["content"] for m in fake_server.requests[-1]["messages"]] == ["old q\n\nnew q"]
        say(manager, "irc:#linux", "more")
        sent = [m["content"] for m in fake_server.requests[-1]["messages"]]
        assert sent == ["You are a helpful AI assistant.", "q0", "a0", "more"]
        assert listing_paths(manager) == {"cli:main": "2025-11-05", "irc:#linux": "2025-11-04"}
    assert sorted(p.name for p in (root / "cli").iterdir()) == ["2025-11-05"]


ARCHIVE = quote(
    TERRARIUM_DOC,
    "4. **Archive**: Old sessions remain on disk",
    "- Organized by date for easy cleanup",
    "- Can manually archive/delete old dates",
)


def test_old_date_folders_can_be_moved_away_and_back_by_hand(
    fake_server: FakeServer, root: Path, tmp_path: Path
) -> None:
    """Moving a date folder out of the store by hand archives its sessions: the rest keep
    working, nothing is half found; moving it back brings them back whole."""
    with FsStore(root) as store:
        for name, day in (("old", "2025-01-02"), ("older", "2025-01-01")):
            create_segment_with_ids(
                store,
                new_session_id(),
                new_segment_id(),
                SegmentStartState(history=[{"role": "user", "content": f"from {day}"}]),
                context=f"cli:{name}",
                ts=f"{day}T10:00:00Z",
            )
    with managed(fake_server, root) as manager:
        say(manager, "cli:main", "today")
        assert set(listing_paths(manager)) == {"cli:main", "cli:old", "cli:older"}
    archive = tmp_path / "archive"
    archive.mkdir()
    (root / "cli" / "2025-01-01").rename(archive / "2025-01-01")
    with managed(fake_server, root) as manager:
        assert set(listing_paths(manager)) == {"cli:main", "cli:old"}
        with pytest.raises(terrarium.ContextNotFound):
            manager.get_stats("cli:older")
        say(manager, "cli:old", "still here")
    (archive / "2025-01-01").rename(root / "cli" / "2025-01-01")
    with managed(fake_server, root) as manager:
        assert set(listing_paths(manager)) == {"cli:main", "cli:old", "cli:older"}
        assert [m["content"] for m in manager.history("cli:older")] == ["from 2025-01-01"]


# --------------------------------------------------------------------------- Migration

MIGRATION = quote(
    TERRARIUM_DOC,
    "python scripts/migrate_sessions.py --dry-run",
    "python scripts/migrate_sessions.py",
    "python scripts/migrate_sessions.py --storage-dir ./my_sessions",
    "- Reads `created_at` from metadata",
    "- Creates date subdirectories",
    "- Moves sessions to appropriate date folders",
    "- Updates metadata with `session_date` field",
)


def _flat(folder: Path) -> Path:
    """A pre-date session file: ``{type}/{id}.json`` with no ``session_date``."""
    data = seed_json("main", "cli", "2025-10-30T08:00:00.000000")
    del data["metadata"]["session_date"]
    return write_seed_file(folder, "cli/main.json", data)


def test_the_migration_script_as_documented(tmp_path: Path) -> None:
    script = str(REPO / "scripts" / "migrate_sessions.py")
    flat = _flat(tmp_path / "sessions")
    before = flat.read_bytes()
    dry = run_script(script, "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "2025-10-30" in dry.stdout
    assert flat.read_bytes() == before  # a dry run changes nothing
    done = run_script(script, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    moved = tmp_path / "sessions" / "cli" / "2025-10-30" / "main.json"
    assert not flat.exists()
    assert json.loads(moved.read_text())["metadata"]["session_date"] == "2025-10-30"
    custom = _flat(tmp_path / "my_sessions")
    assert run_script(script, "--storage-dir", "./my_sessions", cwd=tmp_path).returncode == 0
    assert not custom.exists()
    assert (tmp_path / "my_sessions" / "cli" / "2025-10-30" / "main.json").is_file()


# --------------------------------------------------------------------------- Best Practices

SESSION_IDS = quote(
    TERRARIUM_DOC,
    "- **CLI**: Use descriptive names (`main`, `project_x`, `brainstorm`)",
    "- **IRC**: Use channel names (`#python`, `#linux`)",
    "- **Games**: Use game+run (`pokemon_run1`, `chess_game2`)",
    "- **Web**: Use session tokens (`session_abc123`)",
)


def test_every_recommended_session_id_makes_a_session(manager: MultiContextManager) -> None:
    contexts = [
        "cli:main",
        "cli:project_x",
        "cli:brainstorm",
        "irc:#python",
        "irc:#linux",
        "game:pokemon_run1",
        "game:chess_game2",
        "web:session_abc123",
    ]
    for context in contexts:
        say(manager, context, f"hello {context}")
    assert sorted(listing_paths(manager)) == sorted(contexts)
    for context in contexts:
        assert manager.history(context)[0]["content"] == f"hello {context}"


CLEANUP = quote(TERRARIUM_DOC, "- Delete unused sessions with `--delete-session`")
# (chat.py --delete-session: test_chat_py_session_id_list_sessions_and_delete_session above.)

LOCATION = quote(
    TERRARIUM_DOC,
    "- Default: `./sessions/` (relative to project root)",
    "- Custom: Use `--storage-dir` or `storage_dir` parameter",
    "- Production: Consider absolute paths",
)


def test_storage_location_default_custom_and_absolute(
    tmp_path: Path, fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    client = VLLMClient(base_url=fake_server.root_url, max_retries=0)
    default = MultiContextManager(client)
    say(default, "cli:default", "hi")
    default.close()
    assert list((tmp_path / "sessions" / "cli").glob("*/default"))
    absolute = tmp_path / "srv" / "terrarium"
    production = MultiContextManager(client, storage_dir=absolute)
    say(production, "cli:prod", "hi")
    run(production.aclose())  # closes the client both shared
    assert list((absolute / "cli").glob("*/prod"))
    listed = run_script("-m", "terrarium.cli", "list", "--storage-dir", str(absolute), cwd=REPO)
    assert listed.returncode == 0, listed.stderr
    assert "cli:prod" in listed.stdout and "cli:default" not in listed.stdout


BACKUP = quote(
    TERRARIUM_DOC,
    "- Sessions are just JSON files",
    "- Easy to backup: `tar -czf sessions-backup.tar.gz sessions/`",
)


def test_a_tar_backup_restores_every_session(manager: MultiContextManager, root: Path) -> None:
    """The native store is plain files too (JSON lines): the documented ``tar`` backs it up,
    and the unpacked copy is a store with the same conversations."""
    say(manager, "cli:main", "keep me")
    say(manager, "irc:#python", "me too")
    backup = root.parent / "sessions-backup.tar.gz"
    subprocess.run(["tar", "-czf", str(backup), "sessions/"], cwd=root.parent, check=True)
    elsewhere = root.parent / "restored"
    elsewhere.mkdir()
    subprocess.run(["tar", "-xzf", str(backup)], cwd=elsewhere, check=True)
    for path in (root / "cli").rglob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            json.loads(line)  # every line of a log is JSON
    with FsStore(root) as original, FsStore(elsewhere / "sessions") as copy:
        for context in ("cli:main", "irc:#python"):
            assert restore(copy, context).history == restore(original, context).history


GITIGNORE = quote(TERRARIUM_DOC, "- Version control: `.gitignore` should exclude `sessions/`")


def test_the_checkout_ignores_its_sessions_folder() -> None:
    """The project's own ``.gitignore`` follows the advice (``/sessions/``)."""
    lines = (REPO / ".gitignore").read_text().splitlines()
    assert "/sessions/" in lines or "sessions/" in lines


# --------------------------------------------------------------------------- Multi-Context

MULTI = quote(
    TERRARIUM_DOC,
    "- **Multiple endpoints** share one vLLM instance",
    "- **Isolation**: Each context has independent history",
    'IRC bot gets message → manager.process_with_context("irc:#python", msg)',
    'Pokemon needs move   → manager.process_with_context("game:pokemon", state)',
    'User asks question   → manager.process_with_context("cli:main", question)',
)


def test_the_example_flow_keeps_each_context_to_itself(
    fake_server: FakeServer, manager: MultiContextManager
) -> None:
    """One client, three endpoints, twice round: each request holds its own context only."""
    flow = [("irc:#python", "msg"), ("game:pokemon", "state"), ("cli:main", "question")]
    for round_ in range(2):
        for context, text in flow:
            say(manager, context, f"{text} {round_}")
            sent = [m["content"] for m in fake_server.requests[-1]["messages"]]
            before = [] if round_ == 0 else [f"{text} 0", f"echo: {text} 0"]
            assert sent == [*before, f"{text} {round_}"]


FAST_SWITCHING = quote(TERRARIUM_DOC, "- **Fast switching**: In-memory cache + vLLM APC")


class CountingStore(FsStore):
    """An FsStore that counts the segment reads a restore makes."""

    reads = 0

    def read_segment(self, *args: Any, **kwargs: Any) -> Any:
        CountingStore.reads += 1
        return super().read_segment(*args, **kwargs)


def test_switching_between_cached_contexts_reads_no_log_and_keeps_the_prefix(
    fake_server: FakeServer, root: Path
) -> None:
    """Back on a cached context, no segment is read again, and what is sent begins with
    exactly what was sent last time (so the server's prefix cache is hit)."""
    client = VLLMClient(base_url=fake_server.root_url, max_retries=0)
    manager = MultiContextManager(client, store=CountingStore(root))
    say(manager, "irc:#python", "a")
    say(manager, "cli:main", "b")
    reads = CountingStore.reads
    previous = fake_server.requests[0]["messages"]
    say(manager, "irc:#python", "c")
    assert CountingStore.reads == reads
    sent = fake_server.requests[-1]["messages"]
    assert sent[: len(previous)] == previous
    run(manager.aclose())
    manager.store.close()


# --------------------------------------------------------------------------- Future Enhancements

SQLITE = quote(TERRARIUM_DOC, "- SQLite backend option (queryable, analytics)")


def test_the_sqlite_backend_is_queryable(fake_server: FakeServer, tmp_path: Path) -> None:
    db = tmp_path / "sessions.db"
    with managed(fake_server, f"sqlite:///{db}") as manager:
        say(manager, "cli:main", "hello")
        say(manager, "irc:#python", "hi")
        assert manager.get_stats("cli:main")["message_count"] == 2
    with sqlite3.connect(db) as conn:  # the log's own tables answer plain SQL
        rows = conn.execute(
            "SELECT c.context, e.kind, json_extract(e.line, '$.item.content') FROM contexts c "
            "JOIN segments g USING (session_id) JOIN entries e ON e.seg = g.id "
            "WHERE e.kind IN ('user_input', 'item') ORDER BY c.context, e.seq"
        ).fetchall()
    assert rows == [
        ("cli:main", "user_input", "hello"),
        ("cli:main", "item", "echo: hello"),
        ("irc:#python", "user_input", "hi"),
        ("irc:#python", "item", "echo: hi"),
    ]


SEARCH = quote(TERRARIUM_DOC, "- Session search by content")


def test_sessions_are_searched_by_content(manager: MultiContextManager) -> None:
    say(manager, "cli:main", "tell me about decorators")
    say(manager, "irc:#python", "what is a generator")
    hits = manager.search("decorators")
    assert {str(hit.context) for hit in hits} == {"cli:main"}
    assert {str(hit.context) for hit in manager.search("generator", type="irc")} == {"irc:#python"}


EXPORT = quote(TERRARIUM_DOC, "- Export to different formats")


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_every_export_format_holds_the_conversation(fmt: str, manager: MultiContextManager) -> None:
    say(manager, "cli:main", "exported words")
    data = export_context(manager.store, "cli:main", fmt)
    text = data.decode() if isinstance(data, bytes) else data
    assert "exported words" in text


# --------------------------------------------------------------------------- Notes

THREADS = quote(
    TERRARIUM_DOC,
    "- **Thread safety**: Not currently thread-safe (use for sequential processing)",
    "- **File locking**: No locking (single-process assumption)",
)


def test_beyond_the_notes_threads_share_a_context_safely(
    fake_server: FakeServer, root: Path
) -> None:
    """What the seed could not do: turns from several threads (each with its own client, as
    a client belongs to one event loop) on one context of one store all land."""

    def worker(n: int) -> None:
        async def turns() -> None:
            manager = make_manager(fake_server, root)
            for i in range(3):
                await manager.process_with_context("cli:main", f"t{n}-{i}")
            await manager.aclose()

        asyncio.run(turns())

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with FsStore(root) as store:
        history = restore(store, "cli:main").history
    users = sorted(m["content"] for m in history if m["role"] == "user")
    assert users == sorted(f"t{n}-{i}" for n in range(4) for i in range(3))
    assert len(history) == 24


CACHE = quote(TERRARIUM_DOC, "- **Cache size**: Default 10 sessions in memory (configurable)")


def test_the_cache_holds_ten_sessions_by_default(fake_server: FakeServer, root: Path) -> None:
    with managed(fake_server, root) as manager:
        assert manager.cache_size == 10
        for i in range(12):
            say(manager, f"cli:c{i}", "hi")
        cached = [manager.get_stats(f"cli:c{i}")["cached"] for i in range(12)]
    assert cached == [False, False] + [True] * 10
    with managed(fake_server, root, cache_size=2) as manager:
        for i in range(3):
            say(manager, f"cli:c{i}", "again")
        assert [manager.get_stats(f"cli:c{i}")["cached"] for i in range(3)] == [False, True, True]


AUTOSAVE = quote(TERRARIUM_DOC, "- **Auto-save**: Enabled by default (can disable per-session)")


def test_autosave_is_on_by_default_and_off_per_session(
    manager: MultiContextManager, root: Path
) -> None:
    def on_disk(context: str) -> int:
        with FsStore(root) as store:
            return len(restore(store, context).history)

    say(manager, "cli:saved", "a")
    assert on_disk("cli:saved") == 2
    say(manager, "cli:held", "a")
    manager.set_autosave("cli:held", False)
    say(manager, "cli:held", "b")
    say(manager, "cli:saved", "b")
    assert (on_disk("cli:held"), on_disk("cli:saved")) == (2, 4)
    assert manager.save("cli:held") > 0
    assert on_disk("cli:held") == 4


# --------------------------------------------------------------------------- See Also

SEE_ALSO = quote(
    TERRARIUM_DOC,
    "- `agent/session_manager.py` - PersistentSession implementation",
    "- `agent/multi_context_manager.py` - MultiContextManager implementation",
    "- `scripts/migrate_sessions.py` - Migration utility",
)


def test_the_named_files_exist_where_the_document_puts_them() -> None:
    from terrarium.agent import multi_context_manager, session_manager

    assert multi_context_manager.MultiContextManager is MultiContextManager
    assert session_manager.PersistentSession is terrarium.PersistentSession
    assert (REPO / "scripts" / "migrate_sessions.py").is_file()
    assert (REPO / "chat.py").is_file()


def test_the_persistent_session_is_what_the_manager_manages(
    manager: MultiContextManager, root: Path
) -> None:
    """One conversation: the manager's turns write through it, it adds and saves messages
    itself, and ``to_dict()`` is the seed's session file."""
    say(manager, "cli:main", "Hello!", system_prompt="You are a helpful AI assistant.")
    session = manager.get_session("cli:main")
    assert isinstance(session, terrarium.PersistentSession)
    assert (session.context_type, session.session_id, session.message_count) == ("cli", "main", 2)
    session.add_message("user", "And now?")  # auto-saved
    say(manager, "cli:main", "Still there?")
    assert session.message_count == 5
    data = session.to_dict()
    example = _document_example()
    assert list(data) == list(example) and list(data["metadata"]) == list(example["metadata"])
    assert [m["content"] for m in data["messages"]][2:4] == ["And now?", "Still there?"]
    assert data["metadata"]["message_count"] == 5
    with FsStore(root) as store:
        assert len(restore(store, "cli:main").history) == 5
    alone = terrarium.PersistentSession(root, "web:session_abc123", autosave=False)
    alone.add_message("user", "hi")
    assert not (root / "web").exists()  # created on the first save, not before
    assert alone.save() == 1
    alone.close()
    assert [m["content"] for m in manager.history("web:session_abc123")] == ["hi"]


# =============================================================================================
# seeds/002: the session_store crate
# =============================================================================================

ARCHITECTURE = quote(
    CRATE_DOC,
    "//! belonging to the same logical conversation. Each Segment is recorded",
    "//! as a sequence of [`LogEntry`] values, one per line in a `.jsonl`",
)


@pytest.fixture
def conversation(store: FsStore) -> Iterator[tuple[FsStore, ContextId]]:
    """``cli:main`` with two turns logged through the manager's entry kinds."""
    context = ContextId("cli", "main")
    create_segment(store, SegmentStartState(system_prompt="Be brief."), context=context)
    head = store.get_head(context)
    assert head is not None
    for i in range(2):
        terrarium.save_user_input(store, head, {"role": "user", "content": f"q{i}"})
        terrarium.save_delta(store, head, [{"role": "assistant", "content": f"a{i}"}])
        terrarium.save_turn_end(store, head)
    yield store, context


def test_a_segment_is_a_jsonl_file_of_log_entries(
    conversation: tuple[FsStore, ContextId], root: Path
) -> None:
    """One JSON object per line, the header first, seqs counting from 0."""
    (path,) = (root / "cli").rglob("*.jsonl")
    lines = [json.loads(line) for line in path.read_bytes().splitlines()]
    assert lines[0]["kind"] == "header"
    assert [line["seq"] for line in lines] == list(range(len(lines)))
    assert uuid.UUID(path.name.removesuffix(".jsonl")) == uuid.UUID(lines[0]["segment_id"])


REPLAY = quote(
    CRATE_DOC,
    "//! file. Reading a segment log and collecting entries reconstructs the",
    "//! Worker state at that segment — no separate snapshots or checkpoints",
)


def test_collecting_a_segments_entries_reconstructs_the_state(
    conversation: tuple[FsStore, ContextId],
) -> None:
    store, context = conversation
    state = restore(store, context)
    collected = collect_state(read_entries(store, state))
    assert collected.history == state.history
    assert (collected.turns, collected.system_prompt) == (2, "Be brief.")
    assert [m["content"] for m in state.history] == ["q0", "a0", "q1", "a1"]


MINT = quote(
    CRATE_DOC,
    "//! needed. Compaction and fork operations mint a fresh Segment within",
    "/// All Segments belonging to the same Session share this ID. Compaction",
    "/// `WHERE session_id = ?` retrieves the full lineage.",
)


def test_fork_and_compaction_mint_segments_of_the_same_session(tmp_path: Path) -> None:
    """Both start a new segment id under the same session id, and on SQLite one
    ``WHERE session_id = ?`` finds the whole tree."""
    db = tmp_path / "s.db"
    with terrarium.SqliteStore(db) as store:
        session_id, root_segment = create_segment(store, context="cli:main")
        head = store.get_head(ContextId("cli", "main"))
        assert head is not None
        terrarium.save_user_input(store, head, {"role": "user", "content": "hi"})
        forked = fork(store, head)
        compacted = create_compacted_segment(store, head, [{"role": "user", "content": "summary"}])
        assert len({root_segment, forked, compacted}) == 3
        assert set(store.list_segments(session_id)) == {root_segment, forked, compacted}
        assert restore_by_segment(store, session_id, forked).history == [
            {"role": "user", "content": "hi"}
        ]
    with sqlite3.connect(db) as conn:
        found = conn.execute(
            "SELECT segment_id FROM segments WHERE session_id = ?", (str(session_id),)
        ).fetchall()
    assert {uuid.UUID(s) for (s,) in found} == {root_segment, forked, compacted}


FREE_FUNCTIONS = quote(
    CRATE_DOC,
    "//! This crate provides free functions for persistence operations.",
    "//! The caller (typically Pod) holds the Worker directly and calls these",
)


def test_persistence_is_free_functions_over_a_store() -> None:
    """Every operation the crate lists is a plain function taking the store first."""
    import inspect

    for name in ("create_segment", "fork", "fork_at", "save_delta", "save_usage", "restore"):
        function = getattr(terrarium, name)
        assert inspect.isfunction(function), name
        assert next(iter(inspect.signature(function).parameters)) == "store", name


QUICK_START = quote(
    CRATE_DOC,
    '//! let store = FsStore::new("./sessions")?;',
    "//! let (session_id, segment_id) = create_segment(&store, SegmentStartState {",
    "//! system_prompt: None,",
    "//! config: &config,",
    "//! history: &[],",
)


def test_the_quick_start_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No context is needed: the session is replayed, extended by the crate's functions, and
    a context can adopt it later (``attach_context``)."""
    monkeypatch.chdir(tmp_path)
    config = {"model": "m", "temperature": 0.2}
    store = FsStore("./sessions")
    session_id, segment_id = create_segment(
        store, SegmentStartState(system_prompt=None, config=config, history=[])
    )
    with store:
        ref = terrarium.PodActiveSegmentRef(session_id, segment_id)
        terrarium.save_delta(store, ref, [{"role": "user", "content": "hello"}])
        assert restore_by_segment(store, session_id, segment_id).config == config
        assert store.list_contexts() == [] and terrarium.detached_sessions(store) == [session_id]
        branch = fork(store, ref)
        head = terrarium.attach_context(
            store, "cli:main", terrarium.PodActiveSegmentRef(session_id, branch)
        )
        assert (head.session_id, head.segment_id) == (session_id, branch)
        assert restore(store, "cli:main").history == [{"role": "user", "content": "hello"}]
        assert [h.context for h in store.list_contexts()] == ["cli:main"]
        assert terrarium.detached_sessions(store) == []


TRACE = quote(
    CRATE_DOC,
    "//! Debug-mode [`TraceEntry`] records capture raw stream events in a separate",
    "//! `.trace.jsonl` file, independent of the segment log.",
)


def test_trace_entries_go_to_their_own_file(
    conversation: tuple[FsStore, ContextId], root: Path
) -> None:
    """A trace is a ``.trace.jsonl`` beside the segment, which it leaves unchanged; an empty
    trace makes no file at all."""
    store, context = conversation
    head = store.get_head(context)
    assert head is not None
    (segment,) = (root / "cli").rglob("*[0-9a-f].jsonl")
    before = segment.read_bytes()
    save_trace(store, head, [])
    assert not list(root.rglob("*.trace.jsonl"))
    save_trace(store, head, [TraceEntry(utc_now(), "chunk", {"delta": "a"})])
    (trace,) = root.rglob("*.trace.jsonl")
    assert trace.name == segment.name.replace(".jsonl", ".trace.jsonl")
    assert segment.read_bytes() == before
    assert store.read_trace(head.session_id, head.segment_id)[0]["event"] == "chunk"


MODULES = quote(
    CRATE_DOC,
    "pub mod event_trace;",
    "pub mod fs_store;",
    "pub mod logged_item;",
    "pub mod pod_metadata;",
    "pub mod segment;",
    "pub mod segment_log;",
    "pub mod store;",
    "pub mod system_item;",
)


def test_every_crate_module_is_mapped_in_the_architecture() -> None:
    """docs/architecture.md says which of our modules holds each of the crate's."""
    text = (REPO / "docs" / "architecture.md").read_text()
    for line in MODULES:
        module = line.removeprefix("pub mod ").removesuffix(";")
        assert f"`{module}`" in text, module


EXPORTS = quote(
    CRATE_DOC,
    "pub use logged_item::{LoggedContentPart, LoggedItem, LoggedRole, from_logged, to_logged};",
    "pub use segment_log::{",
)


def test_every_name_the_crate_exports_is_ours(seed_text: dict[str, str]) -> None:
    """Every name in the crate's ``pub use`` lines, read from the document itself."""
    names: set[str] = set()
    for block in re.findall(r"pub use ([^;]+);", seed_text[CRATE_DOC].replace("|", "")):
        tail = block.split("::")[-1]
        names.update(re.findall(r"\w+", tail))
    assert len(names) > 40
    assert sorted(names - set(terrarium.__all__)) == []


IDS = quote(
    CRATE_DOC,
    "/// Session identifier — the fork-tree root. UUID v7 (time-ordered).",
    "/// Segment identifier. UUID v7 (time-ordered, lexicographically sortable).",
)


def test_ids_are_uuid7_in_time_order() -> None:
    ids = [new_session_id() for _ in range(50)] + [new_segment_id() for _ in range(50)]
    assert {i.version for i in ids} == {7}
    assert [str(i) for i in ids[:50]] == sorted(str(i) for i in ids[:50])
    assert [str(i) for i in ids[50:]] == sorted(str(i) for i in ids[50:])
    assert str(ids[49]) < str(ids[50])  # made later: sorts later, across kinds


# =============================================================================================
# The quotes themselves
# =============================================================================================


@pytest.fixture(scope="module")
def seed_text() -> dict[str, str]:
    """Both documents, from ``../shared/seeds`` (required under CI)."""
    if not SEEDS.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no seed documents at {SEEDS}")
        pytest.skip(f"no seed documents at {SEEDS}; put the shared folder beside the checkout")
    return {name: (SEEDS / name).read_text() for name in QUOTES}


def _plain(text: str) -> str:
    """The crate's text without the page's ``|`` separator lines."""
    return "\n".join(line for line in text.splitlines() if line.strip() != "|")


def test_every_quote_is_in_the_documents(seed_text: dict[str, str]) -> None:
    for doc, texts in QUOTES.items():
        body = _plain(seed_text[doc])
        missing = [text for text in texts if text not in body]
        assert missing == [], doc
