"""Legacy Terrarium JSON folders through the Python API (``terrarium.legacy`` and the manager).

A folder of seed-format files (``sessions/{type}/{date}/{name}.json``, seeds/004) must look to
code ported from the seed exactly as it did: every old conversation listed, its stats, and a
turn that continues it with its full history; the file itself is never changed, and a delete
moves it into ``.trash/legacy/`` instead of unlinking it. Turns go to the fake model server
over real HTTP.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from fakeserver import FakeServer
from terrarium import FsStore, MemoryStore, SegmentStartState, create_segment, legacy, restore
from terrarium.agent.multi_context_manager import MultiContextManager
from terrarium.cli import cli
from terrarium.errors import ContextNotFound, StoreError
from terrarium.formats import terrarium_json as tj
from terrarium.formats.terrarium_json import LegacyFormatError
from terrarium.llm.vllm_client import VLLMClient
from terrarium.model import ContextId

SRC = Path(__file__).resolve().parents[1] / "src"

SEED_SNIPPET = """\
from agent.multi_context_manager import MultiContextManager
from llm.vllm_client import VLLMClient

# Initialize
client = VLLMClient(base_url="http://localhost:8000")
manager = MultiContextManager(client, storage_dir="./sessions")

# Process with context (auto-saves)
response = await manager.process_with_context(
    context_id="irc:#python",
    user_message="What's a decorator?",
    system_prompt="You are a helpful IRC bot. Be concise."
)

# List all sessions
all_contexts = manager.list_all_contexts()
# Returns: {"cli": [{"session_id": "main", "date": "2025-11-06", ...}], ...}

# Get session stats
stats = manager.get_stats("cli:main")
# Returns: {"context_id": "cli:main", "message_count": 10, ...}

# Clear history (keeps session)
manager.clear_context("cli:main")

# Delete session entirely
manager.delete_context("cli:main")
"""
"""The "Python API" block of seeds/004, word for word."""


def seed_file(
    root: Path,
    context: str,
    date: str,
    turns: list[tuple[str, str]],
    *,
    prompt: str = "You are a helpful AI assistant.",
    minute: int = 30,
) -> Path:
    """Write a session file exactly as the old tool did (seeds/004's structure, indent=2)."""
    ctx = ContextId.parse(context)
    messages: list[dict[str, str]] = []
    for n, (user, assistant) in enumerate(turns):
        stamp = f"{date}T14:{minute:02d}:{n:02d}.123456"
        messages.append({"role": "user", "content": user, "timestamp": stamp})
        messages.append({"role": "assistant", "content": assistant, "timestamp": stamp})
    created = f"{date}T14:{minute:02d}:00.123456"
    data = {
        "session_id": ctx.name,
        "context_type": ctx.type,
        "system_prompt": prompt,
        "messages": messages,
        "metadata": {
            "created_at": created,
            "last_active": messages[-1]["timestamp"] if messages else created,
            "message_count": len(messages),
            "session_id": ctx.name,
            "context_type": ctx.type,
            "session_date": date,
        },
    }
    path = root / ctx.type / date / f"{ctx.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False))
    return path


@pytest.fixture
def seeded(root: Path) -> dict[str, Path]:
    """The seed's example tree: cli:main, cli:xyz123, cli:morning_chat, irc:#python, ..."""
    return {
        "cli:main": seed_file(root, "cli:main", "2025-11-06", [("Hello!", "Hi! How can I help?")]),
        "cli:xyz123": seed_file(root, "cli:xyz123", "2025-11-06", [("a", "b")], minute=10),
        "cli:morning_chat": seed_file(
            root, "cli:morning_chat", "2025-11-05", [("good morning", "morning!")]
        ),
        "irc:#python": seed_file(
            root,
            "irc:#python",
            "2025-11-06",
            [("what is a list?", "an ordered sequence"), ("and a tuple?", "an immutable one")],
            prompt="You are an IRC bot.",
        ),
        "irc:#linux": seed_file(root, "irc:#linux", "2025-11-06", [("ls?", "lists")]),
    }


def make_manager(server: FakeServer, root: Path) -> MultiContextManager:
    client = VLLMClient(base_url=server.root_url, max_retries=0, backoff_base=0.001)
    return MultiContextManager(client, storage_dir=str(root))


def snapshot(paths: dict[str, Path]) -> dict[str, bytes]:
    return {context: path.read_bytes() for context, path in paths.items()}


def rows(listing: dict[str, list[dict[str, Any]]]) -> dict[str, tuple[int, bool]]:
    """``{context_id: (message_count, legacy)}`` of a ``list_all_contexts`` result."""
    return {
        item["context_id"]: (item["message_count"], item["legacy"])
        for items in listing.values()
        for item in items
    }


def trashed(root: Path) -> list[Path]:
    return sorted(p for p in (root / ".trash" / "legacy").rglob("*.json"))


# --------------------------------------------------------------------------- the seed's snippet


def test_seed_snippet_runs_on_a_folder_of_seed_files(
    seeded: dict[str, Path],
    root: Path,
    tmp_path: Path,
    fake_server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The seed's API block, run as written on its old folder, sees and continues every file."""
    shim = tmp_path / "shim"
    for package, module, name in (
        ("agent", "multi_context_manager", "MultiContextManager"),
        ("llm", "vllm_client", "VLLMClient"),
    ):
        (shim / package).mkdir(parents=True)
        (shim / package / "__init__.py").write_text("")
        (shim / package / f"{module}.py").write_text(
            f"from terrarium.{package}.{module} import {name}\n"
        )
    monkeypatch.syspath_prepend(str(shim))
    for name in ("agent", "agent.multi_context_manager", "llm", "llm.vllm_client"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.chdir(root.parent)
    before = snapshot(seeded)
    source = SEED_SNIPPET.replace("http://localhost:8000", fake_server.root_url)
    code = compile(source, "seeds/004", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    names: dict[str, Any] = {}

    async def main() -> None:
        result = eval(code, names)
        assert inspect.iscoroutine(result)
        await result
        await names["manager"].aclose()

    asyncio.run(main())

    # The turn continued irc:#python with its whole history, under the new system prompt.
    assert names["response"] == "echo: What's a decorator?"
    assert [(m["role"], m["content"]) for m in fake_server.requests[0]["messages"]] == [
        ("system", "You are a helpful IRC bot. Be concise."),
        ("user", "what is a list?"),
        ("assistant", "an ordered sequence"),
        ("user", "and a tuple?"),
        ("assistant", "an immutable one"),
        ("user", "What's a decorator?"),
    ]
    # Every old conversation was listed, in the seed's shape.
    assert rows(names["all_contexts"]) == {
        "cli:main": (2, True),
        "cli:xyz123": (2, True),
        "cli:morning_chat": (2, True),
        "irc:#python": (6, False),
        "irc:#linux": (2, True),
    }
    (main_row,) = [i for i in names["all_contexts"]["cli"] if i["session_id"] == "main"]
    assert main_row["date"] == "2025-11-06"
    assert main_row["created_at"] == "2025-11-06T14:30:00.123456"
    stats = names["stats"]
    assert stats["context_id"] == "cli:main" and stats["message_count"] == 2
    assert stats["session_date"] == "2025-11-06" and stats["legacy"] is True
    # clear imported cli:main, delete removed it and moved (not unlinked) its file.
    assert not seeded["cli:main"].exists()
    (moved,) = trashed(root)
    assert moved.read_bytes() == before["cli:main"]
    assert moved.relative_to(root / ".trash" / "legacy").parts[1:] == (
        "cli",
        "2025-11-06",
        "main.json",
    )
    for context, data in before.items():
        if context != "cli:main":
            assert seeded[context].read_bytes() == data, context
    with FsStore(root) as store:
        assert [h.context for h in store.list_contexts()] == ["irc:#python"]
        assert len(restore(store, "irc:#python").history) == 6


# --------------------------------------------------------------------------- listing, stats


def test_list_all_contexts_shows_legacy_files_and_the_log_hides_them(
    seeded: dict[str, Path], root: Path, fake_server: FakeServer
) -> None:
    manager = make_manager(fake_server, root)
    assert rows(manager.list_all_contexts()) == {
        "cli:main": (2, True),
        "cli:xyz123": (2, True),
        "cli:morning_chat": (2, True),
        "irc:#python": (4, True),
        "irc:#linux": (2, True),
    }
    cli_rows = manager.list_all_contexts()["cli"]
    assert [i["session_id"] for i in cli_rows] == ["main", "xyz123", "morning_chat"]
    assert cli_rows[0] == {
        "session_id": "main",
        "context_id": "cli:main",
        "date": "2025-11-06",
        "message_count": 2,
        "created_at": "2025-11-06T14:30:00.123456",
        "last_active": "2025-11-06T14:30:00.123456",
        "legacy": True,
        "problem": None,
    }
    # A context of the same name in the log hides the file.
    create_segment(manager.store, SegmentStartState(system_prompt="new"), context="cli:main")
    listed = rows(manager.list_all_contexts())
    assert listed["cli:main"] == (0, False) and len(listed) == 5
    assert manager.get_stats("cli:main")["legacy"] is False
    assert manager.get_stats("cli:main")["message_count"] == 0
    manager.close()


def test_get_stats_of_a_legacy_file_has_the_native_shape(
    seeded: dict[str, Path], root: Path, fake_server: FakeServer
) -> None:
    manager = make_manager(fake_server, root)
    old = manager.get_stats("irc:#python")
    create_segment(manager.store, SegmentStartState(system_prompt="x"), context="cli:new")
    new = manager.get_stats("cli:new")
    assert set(old) == set(new)
    assert old["session_id"] == "#python" and old["context_type"] == "irc"
    assert old["message_count"] == 4 and old["turns"] == 0
    assert old["system_prompt"] == "You are an IRC bot."
    assert old["created_at"] == "2025-11-06T14:30:00.123456"  # as the file wrote it (as list)
    assert (old["legacy"], new["legacy"]) == (True, False)
    assert [m["content"] for m in manager.history("irc:#python")][-1] == "an immutable one"
    with pytest.raises(ContextNotFound):
        manager.get_stats("cli:nothing")
    # Reading imported nothing and changed nothing.
    assert [h.context for h in manager.store.list_contexts()] == ["cli:new"]
    manager.close()


# --------------------------------------------------------------------------- turns


def test_a_turn_imports_once_and_continues_with_the_full_history(
    seeded: dict[str, Path], root: Path, fake_server: FakeServer
) -> None:
    before = snapshot(seeded)
    manager = make_manager(fake_server, root)

    async def main() -> None:
        await manager.process_with_context("cli:main", "again")
        await manager.process_with_context("cli:main", "and again")
        await manager.aclose()

    asyncio.run(main())
    assert [m["content"] for m in fake_server.requests[0]["messages"]] == [
        "You are a helpful AI assistant.",
        "Hello!",
        "Hi! How can I help?",
        "again",
    ]
    assert len(fake_server.requests[1]["messages"]) == 6
    assert snapshot(seeded) == before
    with FsStore(root) as store:
        head = store.get_head(ContextId.parse("cli:main"))
        assert head is not None
        assert store.list_segments(head.session_id) == [head.segment_id]
        header = store.read_segment(head.session_id, head.segment_id, stop_seq=0).header
        assert header["origin"]["kind"] == "import"
        assert header["origin"]["source"] == str(seeded["cli:main"])
        assert len(restore(store, "cli:main").history) == 6


def test_clear_of_a_legacy_context_imports_it_then_clears(
    seeded: dict[str, Path], root: Path, fake_server: FakeServer
) -> None:
    before = snapshot(seeded)
    manager = make_manager(fake_server, root)
    manager.clear_context("irc:#python")
    stats = manager.get_stats("irc:#python")
    assert stats["message_count"] == 0 and stats["segments"] == 2 and stats["legacy"] is False
    assert stats["system_prompt"] == "You are an IRC bot."
    with pytest.raises(ContextNotFound):
        manager.clear_context("irc:#nothing")
    manager.close()
    assert snapshot(seeded) == before
    with FsStore(root) as store:  # the old history is still in the tree
        head = store.get_head(ContextId.parse("irc:#python"))
        assert head is not None
        root_segment = store.list_segments(head.session_id)[0]
        header = store.read_segment(head.session_id, root_segment, stop_seq=0).header
        assert len(header["history"]) == 4


def test_fork_of_a_legacy_context_imports_it(
    seeded: dict[str, Path], root: Path, fake_server: FakeServer
) -> None:
    manager = make_manager(fake_server, root)
    assert manager.fork_context("cli:main", "cli:branch")["message_count"] == 2
    assert rows(manager.list_all_contexts())["cli:main"] == (2, False)
    manager.close()


def test_two_processes_resuming_one_legacy_context_import_it_once(
    seeded: dict[str, Path], root: Path, fake_server: FakeServer
) -> None:
    """Both turns land in one imported session: no second import, no fork, no error."""
    fake_server.delay = 0.3  # the first turn holds the context's lock while the other waits
    child = textwrap.dedent(
        """
        import asyncio, json, sys
        from terrarium.agent.multi_context_manager import MultiContextManager
        from terrarium.llm.vllm_client import VLLMClient

        base_url, root, word = sys.argv[1:]
        manager = MultiContextManager(VLLMClient(base_url=base_url, max_retries=0), root)
        print(json.dumps({"ready": True}), flush=True)
        sys.stdin.readline()

        async def main():
            reply = await manager.process_with_context("irc:#python", word)
            await manager.aclose()
            return reply

        print(json.dumps({"reply": asyncio.run(main())}), flush=True)
        """
    )
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", child, fake_server.root_url, str(root), word],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for word in ("one", "two")
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert json.loads(proc.stdout.readline()) == {"ready": True}
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=120) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    for proc, (out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err
        assert json.loads(out)["reply"].startswith("echo: ")
    with FsStore(root) as store:
        head = store.get_head(ContextId.parse("irc:#python"))
        assert head is not None
        assert store.list_segments(head.session_id) == [head.segment_id]
        read = store.read_segment(head.session_id, head.segment_id)
        assert read.header["origin"]["kind"] == "import"
        assert [e["seq"] for e in read.entries] == list(range(1, 11))
        history = restore(store, "irc:#python").history
    said = [m["content"] for m in history if m["role"] == "user"]
    assert said[:2] == ["what is a list?", "and a tuple?"]
    assert sorted(said[2:]) == ["one", "two"]
    assert len(history) == 8


# --------------------------------------------------------------------------- delete


def test_delete_of_a_legacy_context_moves_its_file_into_the_trash(
    seeded: dict[str, Path], root: Path, fake_server: FakeServer
) -> None:
    before = snapshot(seeded)
    manager = make_manager(fake_server, root)
    assert manager.delete_context("irc:#linux") is True
    assert not seeded["irc:#linux"].exists()
    (moved,) = trashed(root)
    assert moved.read_bytes() == before["irc:#linux"]
    assert moved.parent.parent.parent.parent == root / ".trash" / "legacy"
    assert moved.stat().st_mode & 0o777 == seeded["irc:#python"].stat().st_mode & 0o777
    assert moved.parent.stat().st_mode & 0o777 == 0o700
    assert "irc:#linux" not in rows(manager.list_all_contexts())
    assert manager.delete_context("irc:#linux") is False
    # A native delete empties what it trashed, never the legacy files waiting there.
    create_segment(manager.store, SegmentStartState(), context="cli:native")
    assert manager.delete_context("cli:native") is True
    assert trashed(root) == [moved]
    # Undo: move it back, and it is listed again.
    moved.rename(seeded["irc:#linux"])
    assert rows(manager.list_all_contexts())["irc:#linux"] == (2, True)
    manager.close()


def test_delete_of_an_imported_context_removes_both(
    seeded: dict[str, Path], root: Path, fake_server: FakeServer
) -> None:
    manager = make_manager(fake_server, root)
    manager.clear_context("cli:main")  # imported
    assert manager.delete_context("cli:main") is True
    assert "cli:main" not in rows(manager.list_all_contexts())
    assert [p.name for p in trashed(root)] == ["main.json"]
    manager.close()


def test_cli_delete_moves_the_legacy_file_into_the_trash(
    seeded: dict[str, Path], root: Path
) -> None:
    before = seeded["cli:xyz123"].read_bytes()
    result = CliRunner().invoke(cli, ["delete", "cli:xyz123", "--yes", "--storage-dir", str(root)])
    assert result.exit_code == 0, result.output
    (moved,) = trashed(root)
    assert moved.read_bytes() == before


# --------------------------------------------------------------------------- damaged files


def test_an_unreadable_legacy_file_is_a_problem_not_an_empty_context(
    seeded: dict[str, Path], root: Path, fake_server: FakeServer
) -> None:
    broken = root / "cli" / "2025-11-06" / "broken.json"
    broken.write_text('{"messages": [')
    manager = make_manager(fake_server, root)
    assert "cli:broken" not in rows(manager.list_all_contexts())
    (problem,) = legacy.listing(manager.store).problems
    assert problem.path == broken and problem.reason.startswith("not valid JSON")
    assert str(problem) == f"{broken}: {problem.reason}"
    with pytest.raises(LegacyFormatError, match=r"broken\.json: not valid JSON"):
        manager.get_stats("cli:broken")
    with pytest.raises(LegacyFormatError, match=r"broken\.json: not valid JSON"):
        asyncio.run(manager.process_with_context("cli:broken", "hello"))
    assert fake_server.requests == []
    assert manager.store.list_contexts() == []
    # delete moves it out of the way
    assert manager.delete_context("cli:broken") is True
    assert not broken.exists() and legacy.listing(manager.store).problems == ()
    manager.close()


def test_cli_list_warns_about_unreadable_legacy_files(seeded: dict[str, Path], root: Path) -> None:
    """One ``warning: <path>: <reason>`` line each on stderr; exit 0 with every readable one."""
    (root / "cli" / "2025-11-06" / "broken.json").write_text('{"messages": [')
    (root / "irc" / "2025-11-06" / "notalist.json").write_text('{"messages": 3}')
    for args in (["list"], ["list", "--json"]):
        result = CliRunner().invoke(cli, [*args, "--storage-dir", str(root)])
        assert result.exit_code == 0, result.output
        broken, notalist = result.stderr.splitlines()
        assert broken.startswith(f"warning: {root}/cli/2025-11-06/broken.json: not valid JSON")
        assert notalist == (
            f"warning: {root}/irc/2025-11-06/notalist.json: 'messages' must be a list, not a number"
        )
    listed = json.loads(result.stdout)["contexts"]
    assert sorted(row["context_id"] for row in listed) == sorted(seeded)
    assert all(row["legacy"] and row["legacy_path"] for row in listed)


# --------------------------------------------------------------------------- which file


def test_lookup_rules_misnamed_duplicate_flat_and_top_level_files(root: Path) -> None:
    store = FsStore(root)
    newer = seed_file(root, "cli:dup", "2025-11-07", [("new", "n")])
    older = seed_file(root, "cli:dup", "2025-11-06", [("old", "o")])
    misnamed = seed_file(root, "cli:inside", "2025-11-06", [("x", "y")])
    misnamed = misnamed.rename(misnamed.with_name("outside.json"))
    flat = seed_file(root, "cli:flat", "2025-11-06", [("f", "g")])
    flat = flat.rename(root / "cli" / "flat.json")
    top = seed_file(root, "web:top", "2025-11-06", [("t", "u")])
    top = top.rename(root / "top.json")
    found = legacy.listing(store)
    assert {i.context: Path(str(i.legacy_path)) for i in found.sessions} == {
        "cli:dup": newer,
        "cli:flat": flat,
        "web:top": top,
    }
    assert {p.path: p.reason for p in found.problems} == {
        older: f"another file of cli:dup, which is read from {newer}",
        misnamed: "holds cli:inside, which is looked up as inside.json",
    }
    for context, path in (("cli:dup", newer), ("cli:flat", flat), ("web:top", top)):
        assert legacy.find(store, ContextId.parse(context)) == path
    assert legacy.find(store, ContextId.parse("cli:inside")) is None
    assert legacy.find(store, ContextId.parse("cli:outside")) is None
    copy = legacy.read(store, ContextId.parse("web:top"))
    assert copy is not None and copy.path == top
    assert [m["content"] for m in restore(copy.store, "web:top").history] == ["t", "u"]
    assert legacy.listing(MemoryStore()) == legacy.LegacyListing()
    store.close()


def test_a_symbolic_link_out_of_the_store_is_not_read(root: Path, tmp_path: Path) -> None:
    outside = seed_file(tmp_path / "elsewhere", "cli:secret", "2025-11-06", [("s", "t")])
    link = root / "cli" / "2025-11-06" / "secret.json"
    link.parent.mkdir(parents=True)
    link.symlink_to(outside)
    with FsStore(root) as store:
        found = legacy.listing(store)
        assert found.sessions == ()
        assert [p.path for p in found.problems] == [link]
        assert "outside" in found.problems[0].reason
        with pytest.raises(LegacyFormatError, match="outside"):
            legacy.read(store, ContextId.parse("cli:secret"))


def test_the_listing_finds_what_iter_legacy_files_finds(root: Path) -> None:
    seed_file(root, "cli:a", "2025-11-06", [("a", "b")])
    seed_file(root, "irc:#b", "2025-11-05", [("a", "b")])
    (root / "cli" / "flat.json").write_text("{}")
    (root / "top.json").write_text("{}")
    (root / "cli" / "notes.txt").write_text("")
    (root / "cli" / "misc").mkdir()
    (root / "cli" / "misc" / "deep.json").write_text("{}")
    (root / ".trash" / "x").mkdir(parents=True)
    (root / ".trash" / "x" / "gone.json").write_text("{}")
    with FsStore(root) as store:
        create_segment(store, SegmentStartState(), context="cli:native.json")
        found = legacy.listing(store)
        paths = sorted(
            [Path(str(i.legacy_path)) for i in found.sessions] + [p.path for p in found.problems]
        )
        assert paths == sorted(tj.iter_legacy_files(root))


# --------------------------------------------------------------------------- the cache


def test_listing_parses_a_file_again_only_when_it_changed(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(legacy, "_RACY_NS", 0)  # files just written: trust their stamps
    parsed: list[Path] = []
    listed: list[Path] = []
    real_load, real_list = tj.load, legacy._list_folder

    def counting_load(path: Any, **kwargs: Any) -> Any:
        parsed.append(Path(path))
        return real_load(path, **kwargs)

    def counting_list(path: Path, level: int) -> Any:
        listed.append(path)
        return real_list(path, level)

    monkeypatch.setattr(tj, "load", counting_load)
    monkeypatch.setattr(legacy, "_list_folder", counting_list)
    one = seed_file(root, "cli:one", "2025-11-06", [("a", "b")])
    seed_file(root, "cli:two", "2025-11-06", [("a", "b")])
    with FsStore(root) as store:
        legacy.listing(store)
        assert len(parsed) == 2 and len(listed) == 3
        parsed.clear()
        listed.clear()
        legacy.listing(store)
        assert parsed == [] and listed == []
        seed_file(root, "cli:one", "2025-11-06", [("a", "b"), ("c", "d")])
        found = legacy.listing(store)
        assert parsed == [one] and listed == []
        assert found.by_context["cli:one"].message_count == 4
        # A native context in a new date folder: the folders that changed are listed again,
        # the old date folder is not.
        listed.clear()
        create_segment(store, SegmentStartState(), context="cli:native")
        legacy.listing(store)
        assert root / "cli" in listed and root / "cli" / "2025-11-06" not in listed
        listed.clear()
        legacy.listing(store)
        assert listed == []


def test_a_store_without_legacy_files_lists_no_folder_twice(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(legacy, "_RACY_NS", 0)
    listed: list[Path] = []
    real_list = legacy._list_folder
    monkeypatch.setattr(
        legacy, "_list_folder", lambda path, level: listed.append(path) or real_list(path, level)
    )
    with FsStore(root) as store:
        for n in range(5):
            create_segment(store, SegmentStartState(), context=f"cli:c{n}")
        legacy.listing(store)
        assert listed
        listed.clear()
        assert legacy.listing(store) == legacy.LegacyListing()
        assert listed == []


@pytest.mark.parametrize("linked", [".trash", ".trash/legacy"])
def test_a_legacy_file_is_never_trashed_through_a_link_out_of_the_store(
    root: Path, tmp_path: Path, linked: str
) -> None:
    """Deleting a legacy context moves its file into the store's own trash only: a trash
    folder that is a link out of the root is refused, and the file stays where it was."""
    kept = seed_file(root, "cli:old", "2025-11-06", [("a", "b")])
    before = kept.read_bytes()
    outside = tmp_path / "outside"
    outside.mkdir()
    (root / linked).parent.mkdir(parents=True, exist_ok=True)
    (root / linked).symlink_to(outside, target_is_directory=True)
    with FsStore(root) as store:
        with pytest.raises(StoreError, match="outside"):
            legacy.trash(store, ContextId.parse("cli:old"))
    assert list(outside.iterdir()) == []
    assert kept.read_bytes() == before
