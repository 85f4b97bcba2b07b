"""The ``terrarium`` command line and the seed's ``chat.py``, through click's runner and real pipes.

Commands run in-process with ``CliRunner`` (stdin is then not a terminal: no picker, no
confirmation prompts); the pipe tests run the console script and ``chat.py`` as subprocesses
against the fake model server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fakeserver import FakeServer
from terrarium import (
    FsStore,
    PodActiveSegmentRef,
    SegmentStartState,
    create_segment,
    restore,
    save_delta,
    save_user_input,
)
from terrarium.cli import cli
from terrarium.model import ContextId

REPO = Path(__file__).resolve().parents[1]
TERRARIUM = [sys.executable, "-m", "terrarium.cli"]

LEGACY = {
    "session_id": "old",
    "context_type": "cli",
    "system_prompt": "You are a helpful AI assistant.",
    "messages": [
        {"role": "user", "content": "Hello!", "timestamp": "2025-11-06T14:30:00.123456"},
        {
            "role": "assistant",
            "content": "Hi! How can I help you?",
            "timestamp": "2025-11-06T14:30:03.456789",
        },
    ],
    "metadata": {
        "created_at": "2025-11-06T14:30:00.123456",
        "last_active": "2025-11-06T14:35:12.987654",
        "message_count": 2,
        "session_id": "old",
        "context_type": "cli",
        "session_date": "2025-11-06",
    },
}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "sessions"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "TERRARIUM_STORAGE_DIR",
        "TERRARIUM_STORE",
        "TERRARIUM_BASE_URL",
        "TERRARIUM_MODEL",
    ):
        monkeypatch.delenv(name, raising=False)


def add_context(root: Path, context: str, turns: list[tuple[str, str]]) -> None:
    """Create ``context`` with ``turns`` of (user, assistant) messages, through the library."""
    with FsStore(root) as store:
        create_segment(store, SegmentStartState(system_prompt="Be brief."), context=context)
        head = store.get_head(ContextId.parse(context))
        assert head is not None
        for user, assistant in turns:
            save_delta(
                store,
                head,
                [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
            )


def add_legacy(root: Path, name: str = "old", date: str = "2025-11-06") -> Path:
    data = json.loads(json.dumps(LEGACY))
    data["session_id"] = data["metadata"]["session_id"] = name
    path = root / "cli" / date / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2))
    return path


@pytest.fixture
def seeded(root: Path) -> Path:
    add_context(root, "cli:main", [("hi", "hello"), ("how are you?", "fine")])
    add_context(root, "irc:#python", [("what is a decorator?", "a function wrapper")])
    return root


def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, env=env, catch_exceptions=False)


def assert_one_line_error(result: Result, *needles: str, code: int = 1) -> None:
    assert result.exit_code == code, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ")
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0]


def message_count(root: Path, context: str) -> int:
    with FsStore(root) as store:
        return len(restore(store, context).history)


# --------------------------------------------------------------------------- options


def test_storage_dir_before_or_after_the_command(seeded: Path, tmp_path: Path) -> None:
    """--storage-dir works as a group option and as a command option; the command's wins."""
    for args in (
        ["--storage-dir", str(seeded), "list", "--json"],
        ["list", "--json", "--storage-dir", str(seeded)],
        [
            "--storage-dir",
            str(tmp_path / "elsewhere"),
            "list",
            "--json",
            "--storage-dir",
            str(seeded),
        ],
    ):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
        ids = [c["context_id"] for c in json.loads(result.stdout)["contexts"]]
        assert sorted(ids) == ["cli:main", "irc:#python"]


def test_storage_dir_from_the_environment(seeded: Path) -> None:
    result = invoke("list", "--json", env={"TERRARIUM_STORAGE_DIR": str(seeded)})
    assert len(json.loads(result.stdout)["contexts"]) == 2
    result = invoke("list", "--json", env={"TERRARIUM_STORE": str(seeded)})
    assert len(json.loads(result.stdout)["contexts"]) == 2


def test_sqlite_store_url(tmp_path: Path) -> None:
    """A store URL works wherever a folder does."""
    pytest.importorskip("terrarium.stores.sqlite")
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    from terrarium.stores.url import open_store

    store = open_store(url)
    try:
        create_segment(store, SegmentStartState(), context="cli:sql")
    finally:
        store.close()
    result = invoke("list", "--json", "--storage-dir", url)
    assert [c["context_id"] for c in json.loads(result.stdout)["contexts"]] == ["cli:sql"]


def test_usage_errors_are_one_line(root: Path) -> None:
    assert_one_line_error(invoke("show", "--storage-dir", str(root)), "CONTEXT", code=2)
    assert_one_line_error(invoke("nosuchcommand"), "nosuchcommand", code=2)
    assert_one_line_error(invoke("list", "--bogus"), "--bogus", code=2)


# --------------------------------------------------------------------------- list


def test_list_plain_text_when_not_a_terminal(seeded: Path) -> None:
    result = invoke("list", "--storage-dir", str(seeded))
    assert result.exit_code == 0
    out = result.stdout
    assert "\x1b[" not in out and "─" not in out and "│" not in out
    lines = out.splitlines()
    assert lines[0].split() == ["context", "messages", "last", "active", "created", "source"]
    assert lines[1].split()[:2] == ["cli:main", "4"]
    assert lines[2].split()[:2] == ["irc:#python", "2"]


def test_list_json_schema(seeded: Path) -> None:
    add_legacy(seeded)
    result = invoke("list", "--json", "--storage-dir", str(seeded))
    rows = json.loads(result.stdout)["contexts"]
    assert [r["context_id"] for r in rows] == ["cli:main", "cli:old", "irc:#python"]
    for row in rows:
        assert set(row) == {
            "context_id",
            "type",
            "name",
            "date",
            "created_at",
            "last_active",
            "message_count",
            "legacy",
            "legacy_path",
            "problem",
            "state",
            "pinned",
        }
        assert row["problem"] is None
    old = rows[1]
    assert old["legacy"] is True and old["message_count"] == 2
    assert old["date"] == "2025-11-06" and old["legacy_path"].endswith("old.json")
    assert rows[0]["legacy"] is False and rows[0]["legacy_path"] is None
    assert rows[2]["type"] == "irc" and rows[2]["name"] == "#python"


def test_list_by_type_and_empty(seeded: Path, tmp_path: Path) -> None:
    result = invoke("list", "--type", "irc", "--json", "--storage-dir", str(seeded))
    assert [r["context_id"] for r in json.loads(result.stdout)["contexts"]] == ["irc:#python"]
    (tmp_path / "empty").mkdir()
    result = invoke("list", "--storage-dir", str(tmp_path / "empty"))
    assert result.exit_code == 0 and result.stdout == ""
    assert "no sessions" in result.stderr


# --------------------------------------------------------------------------- show


def test_show_text(seeded: Path) -> None:
    result = invoke("show", "cli:main", "--storage-dir", str(seeded))
    assert result.exit_code == 0
    out = result.stdout
    assert out.startswith("cli:main  4 messages")
    assert "system prompt: Be brief." in out
    assert out.index("hi") < out.index("hello") < out.index("how are you?") < out.index("fine")
    assert "[user " in out and "[assistant " in out


def test_show_json_and_segments(seeded: Path) -> None:
    invoke("fork", "cli:main", "cli:branch", "--storage-dir", str(seeded))
    invoke("clear", "cli:main", "--storage-dir", str(seeded))
    result = invoke("show", "cli:branch", "--json", "--segments", "--storage-dir", str(seeded))
    data = json.loads(result.stdout)
    assert set(data) == {
        "context_id",
        "type",
        "name",
        "created_at",
        "last_active",
        "system_prompt",
        "message_count",
        "turns",
        "legacy",
        "messages",
        "segments",
    }
    assert data["message_count"] == 4 and data["system_prompt"] == "Be brief."
    assert [m["role"] for m in data["messages"]] == ["user", "assistant", "user", "assistant"]
    assert all(set(m) >= {"ts", "role", "content"} for m in data["messages"])
    assert len(data["segments"]) == 1 and data["segments"][0]["head"] is True
    main = json.loads(
        invoke("show", "cli:main", "--json", "--segments", "--storage-dir", str(seeded)).stdout
    )
    assert main["message_count"] == 0
    kinds = [s["origin"]["kind"] for s in main["segments"]]
    assert kinds == ["root", "clear"]
    assert [s["head"] for s in main["segments"]] == [False, True]
    assert set(main["segments"][0]) == {"segment_id", "origin", "created_at", "entries", "head"}
    assert set(main["segments"][0]["origin"]) == {"kind", "parent", "at_seq", "source"}
    text = invoke("show", "cli:branch", "--segments", "--storage-dir", str(seeded)).stdout
    assert "head segment entries" in text


def test_show_errors(seeded: Path, tmp_path: Path) -> None:
    assert_one_line_error(
        invoke("show", "cli:nope", "--storage-dir", str(seeded)), "no session 'cli:nope'"
    )
    # a bare name is cli:'s, as for chat (tests/test_cli_conventions.py)
    bare = invoke("show", "nocolon", "--storage-dir", str(seeded))
    assert_one_line_error(bare, "no session 'cli:nocolon'")
    assert_one_line_error(invoke("show", "cli:..", "--storage-dir", str(seeded)), "'..'")
    assert_one_line_error(invoke("show", "BAD:x", "--storage-dir", str(seeded)), "context type")
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert_one_line_error(
        invoke("list", "--storage-dir", str(afile)), "not a sessions folder or store URL"
    )


def test_legacy_session_lists_shows_exports(root: Path) -> None:
    path = add_legacy(root)
    before = path.read_bytes()
    show = json.loads(invoke("show", "cli:old", "--json", "--storage-dir", str(root)).stdout)
    assert show["legacy"] is True and show["message_count"] == 2
    assert show["system_prompt"] == "You are a helpful AI assistant."
    assert show["messages"][0]["content"] == "Hello!"
    exported = invoke("export", "cli:old", "-f", "terrarium-json", "--storage-dir", str(root))
    assert json.loads(exported.stdout) == LEGACY
    stats = json.loads(invoke("stats", "cli:old", "--json", "--storage-dir", str(root)).stdout)
    assert stats["legacy"] is True and stats["message_count"] == 2
    assert path.read_bytes() == before
    # reading never imports it
    with FsStore(root) as store:
        assert store.list_contexts() == []


# --------------------------------------------------------------------------- stats


def test_stats_one_and_all(seeded: Path) -> None:
    data = json.loads(invoke("stats", "cli:main", "--json", "--storage-dir", str(seeded)).stdout)
    assert data["context_id"] == "cli:main" and data["message_count"] == 4
    assert {"usage", "turns", "last_run", "segments", "legacy", "created_at"} <= set(data)
    total = json.loads(invoke("stats", "--json", "--storage-dir", str(seeded)).stdout)
    assert set(total) == {"contexts", "messages", "turns", "legacy", "damaged", "by_type", "usage"}
    assert total["contexts"] == 2 and total["messages"] == 6
    assert total["by_type"] == {
        "cli": {"contexts": 1, "messages": 4},
        "irc": {"contexts": 1, "messages": 2},
    }
    text = invoke("stats", "cli:main", "--storage-dir", str(seeded)).stdout
    assert "messages" in text and "4" in text
    assert "2 sessions" in invoke("stats", "--storage-dir", str(seeded)).stdout
    assert_one_line_error(invoke("stats", "cli:zzz", "--storage-dir", str(seeded)), "cli:zzz")


# --------------------------------------------------------------------------- delete, clear, fork


def test_delete_purge_needs_yes_without_a_terminal(seeded: Path) -> None:
    result = invoke("delete", "cli:main", "--purge", "--storage-dir", str(seeded))
    assert_one_line_error(result, "--yes")
    assert message_count(seeded, "cli:main") == 4
    result = invoke("delete", "cli:main", "--purge", "--yes", "--storage-dir", str(seeded))
    assert result.exit_code == 0
    ids = [
        c["context_id"]
        for c in json.loads(invoke("list", "--json", "--storage-dir", str(seeded)).stdout)[
            "contexts"
        ]
    ]
    assert ids == ["irc:#python"]
    assert_one_line_error(
        invoke("delete", "cli:main", "-y", "--storage-dir", str(seeded)), "cli:main"
    )


def test_delete_legacy_session_removes_its_file(root: Path) -> None:
    path = add_legacy(root)
    assert invoke("delete", "cli:old", "--yes", "--storage-dir", str(root)).exit_code == 0
    assert not path.exists()


def test_clear_keeps_the_old_history_in_the_tree(seeded: Path) -> None:
    assert invoke("clear", "cli:main", "--storage-dir", str(seeded)).exit_code == 0
    data = json.loads(invoke("stats", "cli:main", "--json", "--storage-dir", str(seeded)).stdout)
    assert data["message_count"] == 0 and data["segments"] == 2
    assert_one_line_error(invoke("clear", "cli:none", "--storage-dir", str(seeded)), "cli:none")


def test_fork_whole_and_at(seeded: Path) -> None:
    assert invoke("fork", "cli:main", "cli:copy", "--storage-dir", str(seeded)).exit_code == 0
    assert message_count(seeded, "cli:copy") == 4
    # entries 1 and 2 of the head segment are the first user message and reply
    result = invoke("fork", "cli:main", "irc:half", "--at", "2", "--storage-dir", str(seeded))
    assert result.exit_code == 0, result.output
    assert message_count(seeded, "irc:half") == 2
    assert_one_line_error(
        invoke("fork", "cli:main", "cli:copy", "--storage-dir", str(seeded)),
        "session 'cli:copy' already exists",
    )
    assert_one_line_error(
        invoke("fork", "cli:ghost", "cli:x", "--storage-dir", str(seeded)), "cli:ghost"
    )
    # an entry the head segment does not have is an error naming the range, and nothing is
    # made (it forked the whole history, as if --at were not given)
    past = invoke("fork", "cli:main", "cli:past", "--at", "99", "--storage-dir", str(seeded))
    assert_one_line_error(past, "at entry 99: it has entries 0..")
    assert invoke("show", "cli:past", "--storage-dir", str(seeded)).exit_code == 1


def test_compact_with_the_model(seeded: Path, fake_server: FakeServer) -> None:
    long_turns = [(f"question {n} " + "words " * 40, f"answer {n} " + "x " * 40) for n in range(3)]
    add_context(seeded, "cli:long", long_turns)
    fake_server.reply = "SUMMARY: greetings were exchanged"
    result = invoke(
        "compact", "cli:long", "--base-url", fake_server.base_url, "--storage-dir", str(seeded)
    )
    assert result.exit_code == 0, result.output
    assert "SUMMARY: greetings were exchanged" in result.stdout
    assert "compacted cli:long: 6 messages -> 6" in result.stderr  # summary, ack, last 4
    history = json.loads(invoke("show", "cli:long", "--json", "--storage-dir", str(seeded)).stdout)
    assert "SUMMARY" in history["messages"][0]["content"]


def test_compact_refuses_when_the_summary_would_not_shrink(
    seeded: Path, fake_server: FakeServer
) -> None:
    """Nothing older than the kept tail: refused before any model call; a summary longer
    than what it replaces: refused after it, the log unchanged but for the call's usage."""
    before = message_count(seeded, "cli:main")
    url = ["--base-url", fake_server.base_url, "--storage-dir", str(seeded)]
    result = invoke("compact", "cli:main", *url)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""
    assert result.stderr.strip() == (
        "cli:main not compacted: all 4 of its messages are recent ones a compaction keeps as "
        "they are, so there is nothing to summarise"
    )
    assert fake_server.requests == []

    add_context(seeded, "cli:short", [("a", "b"), ("c", "d"), ("e", "f")])
    fake_server.reply = "a summary far longer than the two one-letter messages it would replace"
    result = invoke("compact", "cli:short", *url)
    assert result.exit_code == 0, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cli:short not compacted: the summary (")
    assert lines[0].endswith("would not be shorter than the 2 messages it replaces (2 characters)")
    assert len(fake_server.requests) == 1
    assert message_count(seeded, "cli:main") == before
    shown = json.loads(invoke("show", "cli:short", "--json", "--storage-dir", str(seeded)).stdout)
    assert [m["content"] for m in shown["messages"]] == ["a", "b", "c", "d", "e", "f"]
    stats = json.loads(invoke("stats", "cli:short", "--json", "--storage-dir", str(seeded)).stdout)
    assert stats["segments"] == 1 and stats["usage"]["calls"] == 1


def test_compact_unreachable_server_is_one_line(seeded: Path) -> None:
    add_context(seeded, "cli:six", [("a", "b"), ("c", "d"), ("e", "f")])
    result = invoke(
        "compact",
        "cli:six",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--retries",
        "0",
        "--storage-dir",
        str(seeded),
    )
    assert_one_line_error(result, "http://127.0.0.1:9/v1", "--base-url", "TERRARIUM_BASE_URL")


# --------------------------------------------------------------------------- export, import


def test_export_formats(seeded: Path, tmp_path: Path) -> None:
    md = invoke("export", "cli:main", "--format", "markdown", "--storage-dir", str(seeded))
    assert md.exit_code == 0 and "how are you?" in md.stdout
    out = tmp_path / "main.jsonl"
    result = invoke(
        "export", "cli:main", "-f", "jsonl", "-o", str(out), "--storage-dir", str(seeded)
    )
    assert result.exit_code == 0 and out.exists()
    assert json.loads(out.read_text().splitlines()[0])["kind"] == "header"
    legacy = json.loads(
        invoke("export", "cli:main", "-f", "terrarium-json", "--storage-dir", str(seeded)).stdout
    )
    assert legacy["session_id"] == "main" and len(legacy["messages"]) == 4
    for fmt in ("html", "openai"):
        assert (
            invoke("export", "irc:#python", "-f", fmt, "--storage-dir", str(seeded)).exit_code == 0
        )
    assert_one_line_error(
        invoke("export", "cli:main", "-f", "docx", "--storage-dir", str(seeded)), "docx", code=2
    )
    assert_one_line_error(invoke("export", "cli:no", "--storage-dir", str(seeded)), "cli:no")


def test_import_legacy_and_jsonl(seeded: Path, tmp_path: Path) -> None:
    legacy_dir = tmp_path / "old-sessions"
    path = add_legacy(legacy_dir)
    before = path.read_bytes()
    target = tmp_path / "target"
    result = invoke("import", str(path), "--storage-dir", str(target))
    assert result.exit_code == 0, result.output
    assert "imported cli:old (2 messages)" in result.stderr
    assert path.read_bytes() == before
    assert message_count(target, "cli:old") == 2
    # a native export comes back losslessly, under another name with --as
    exported = tmp_path / "main.jsonl"
    invoke("export", "cli:main", "-f", "jsonl", "-o", str(exported), "--storage-dir", str(seeded))
    result = invoke("import", str(exported), "--storage-dir", str(target))
    assert result.exit_code == 0, result.output
    assert message_count(target, "cli:main") == 4
    assert_one_line_error(
        invoke("import", str(exported), "--storage-dir", str(target)), "already exists"
    )
    # a folder of legacy files
    add_legacy(legacy_dir, "other")
    third = tmp_path / "third"
    result = invoke("import", str(legacy_dir), "--storage-dir", str(third))
    assert result.exit_code == 0 and result.stderr == f"imported 2 sessions into {third}\n"


def test_import_errors_are_one_line(tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    assert_one_line_error(
        invoke("import", str(broken), "--storage-dir", str(tmp_path / "s")), "broken.json"
    )
    assert_one_line_error(
        invoke("import", str(tmp_path / "missing.json"), "--storage-dir", str(tmp_path / "s")),
        "missing.json",
        code=2,
    )


# --------------------------------------------------------------------------- migrate


def test_migrate_dry_run_then_to_log(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    flat = root / "cli" / "old.json"
    flat.parent.mkdir(parents=True)
    flat.write_text(json.dumps(LEGACY))
    result = invoke("migrate", "--dry-run", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    assert "would move" in result.stdout and flat.exists()
    result = invoke("migrate", "--to-log", "--storage-dir", str(root))
    assert result.exit_code == 0, result.output
    assert not flat.exists() and (root / "cli" / "2025-11-06" / "old.json").exists()
    rows = json.loads(invoke("list", "--json", "--storage-dir", str(root)).stdout)["contexts"]
    assert [(r["context_id"], r["legacy"]) for r in rows] == [("cli:old", False)]


def test_migrate_reports_broken_files(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    (root / "cli").mkdir(parents=True)
    (root / "cli" / "bad.json").write_text("[1, 2")
    result = invoke("migrate", "--storage-dir", str(root))
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1].startswith("Error: 1 of 1")


# --------------------------------------------------------------------------- fsck, reindex


def _segment_file(root: Path, context: str) -> Path:
    with FsStore(root) as store:
        head = store.get_head(ContextId.parse(context))
        folder = store.folder_of(ContextId.parse(context))
        assert head is not None and folder is not None
        return folder / f"{head.segment_id}.jsonl"


def test_fsck_clean(seeded: Path) -> None:
    """A clean check's summary is fsck's result: on stdout, nothing on stderr."""
    result = invoke("fsck", "--storage-dir", str(seeded))
    assert result.exit_code == 0, result.output
    summary = f"checked 2 sessions, 2 segments, 6 entries in {seeded}: 0 problems, 0 unresolved"
    assert (result.stdout, result.stderr) == (summary + "\n", "")
    data = json.loads(invoke("fsck", "--json", "--storage-dir", str(seeded)).stdout)
    assert data["ok"] is True and data["contexts"] == 2 and data["segments"] == 2
    assert data["entries"] == 6 and data["problems"] == []
    assert set(data) == {"ok", "store", "repair", "contexts", "segments", "entries", "problems"}


def test_fsck_reports_corrupt_lines_and_torn_tails_without_changing_anything(
    seeded: Path,
) -> None:
    corrupt = _segment_file(seeded, "cli:main")
    lines = corrupt.read_bytes().splitlines(keepends=True)
    lines[1] = b'{"v": 1, "seq": 1, "kind": "item", oops\n'
    corrupt.write_bytes(b"".join(lines))
    torn = _segment_file(seeded, "irc:#python")
    torn.write_bytes(torn.read_bytes() + b'{"v": 1, "seq": 2, "ki')
    snapshot = {p: p.read_bytes() for p in seeded.rglob("*") if p.is_file()}

    result = invoke("fsck", "--storage-dir", str(seeded))
    assert result.exit_code == 1
    assert f"{corrupt}:2: corrupt:" in result.stdout
    assert f"{torn}:4: torn:" in result.stdout
    assert result.stdout.endswith(": 2 problems, 2 unresolved\n")  # the report, then the error
    assert result.stderr.startswith("Error: 2 problems found") and result.stderr.count("\n") == 1
    data = json.loads(invoke("fsck", "--json", "--storage-dir", str(seeded)).stdout)
    assert data["ok"] is False
    assert sorted(p["kind"] for p in data["problems"]) == ["corrupt", "torn"]
    problem = next(p for p in data["problems"] if p["kind"] == "corrupt")
    assert problem["path"] == str(corrupt) and problem["line"] == 2
    assert problem["context"] == "cli:main"
    assert {p: p.read_bytes() for p in seeded.rglob("*") if p.is_file()} == snapshot

    result = invoke("fsck", "--repair", "--json", "--storage-dir", str(seeded))
    repaired = json.loads(result.stdout)
    assert result.exit_code == 1  # the corrupt line is left for a person
    assert {p["kind"]: p["repaired"] for p in repaired["problems"]} == {
        "corrupt": False,
        "torn": True,
    }
    assert torn.read_bytes().endswith(b"\n")
    assert list(torn.parent.glob("*.torn-*"))
    assert corrupt.read_bytes() == snapshot[corrupt]


def test_fsck_repair_rebuilds_a_lost_index(seeded: Path) -> None:
    import shutil

    shutil.rmtree(seeded / ".index" / "contexts" / "irc")
    data = json.loads(invoke("fsck", "--json", "--storage-dir", str(seeded)).stdout)
    assert [p["kind"] for p in data["problems"]] == ["unindexed"]
    assert invoke("fsck", "--repair", "--storage-dir", str(seeded)).exit_code == 0
    assert invoke("fsck", "--storage-dir", str(seeded)).exit_code == 0


def test_reindex(seeded: Path) -> None:
    import shutil

    shutil.rmtree(seeded / ".index/contexts")
    assert invoke("show", "cli:main", "--storage-dir", str(seeded)).exit_code == 0  # found anyway
    result = invoke("reindex", "--storage-dir", str(seeded))
    assert result.exit_code == 0 and "reindexed 2" in result.stderr
    assert (
        len(json.loads(invoke("list", "--json", "--storage-dir", str(seeded)).stdout)["contexts"])
        == 2
    )
    assert invoke("show", "cli:main", "--storage-dir", str(seeded)).exit_code == 0


def test_reindex_a_sqlite_store(tmp_path: Path) -> None:
    """reindex rebuilds a SQLite store's search tables and counts; search finds the same."""
    url = f"sqlite:///{tmp_path / 'sessions.db'}"
    from terrarium.stores.url import open_store

    store = open_store(url)
    try:
        head = create_segment(store, SegmentStartState(), context="cli:sql")
        save_user_input(store, PodActiveSegmentRef(*head), "zeta appears once")
    finally:
        store.close()
    before = json.loads(invoke("search", "zeta", "--json", "--storage-dir", url).stdout)["hits"]
    result = invoke("reindex", "--storage-dir", url)
    assert result.exit_code == 0 and "reindexed 1" in result.stderr
    after = json.loads(invoke("search", "zeta", "--json", "--storage-dir", url).stdout)["hits"]
    assert after == before and len(after) == 1


def test_a_lost_index_is_rebuilt_whole_on_first_listing(seeded: Path) -> None:
    """With all of .index gone, listing rebuilds it, and what it lists can be opened."""
    import shutil

    shutil.rmtree(seeded / ".index")
    listed = json.loads(invoke("list", "--json", "--storage-dir", str(seeded)).stdout)
    assert len(listed["contexts"]) == 2
    for row in listed["contexts"]:
        assert invoke("show", row["context_id"], "--storage-dir", str(seeded)).exit_code == 0


# --------------------------------------------------------------------------- chat from a pipe


def test_chat_piped_in_process(root: Path, fake_server: FakeServer) -> None:
    result = invoke(
        "chat",
        "--base-url",
        fake_server.base_url,
        "--storage-dir",
        str(root),
        input="hi\n\nthere\n",
    )
    assert result.exit_code == 0, result.output
    assert result.stdout == "echo: hi\necho: there\n"
    assert message_count(root, "cli:main") == 4
    # the second request carried the whole history
    assert [m["content"] for m in fake_server.last_request["messages"]] == [
        "hi",
        "echo: hi",
        "there",
    ]


def test_chat_piped_commands(root: Path, fake_server: FakeServer, tmp_path: Path) -> None:
    script = (
        "one\n/fork side\n/stats\ntwo\n/switch cli:main\n/history\n/export markdown -\n//slash\n"
    )
    result = invoke(
        "chat",
        "cli:main",
        "--system-prompt",
        "Be terse.",
        "--base-url",
        fake_server.base_url,
        "--storage-dir",
        str(root),
        input=script,
    )
    assert result.exit_code == 0, result.output
    assert "echo: two" in result.stdout and "echo: /slash" in result.stdout
    assert message_count(root, "cli:side") == 4  # one, echo, two, echo
    assert message_count(root, "cli:main") == 4  # one, echo, /slash, echo
    assert "# " in result.stdout or "one" in result.stdout
    assert fake_server.last_request["messages"][0] == {"role": "system", "content": "Be terse."}


def test_chat_piped_unknown_command_fails(root: Path, fake_server: FakeServer) -> None:
    result = invoke(
        "chat", "--base-url", fake_server.base_url, "--storage-dir", str(root), input="/nope\n"
    )
    assert_one_line_error(result, "/nope", "/help")


def test_chat_session_id_and_type(root: Path, fake_server: FakeServer) -> None:
    result = invoke(
        "chat",
        "--session-id",
        "#dev",
        "--type",
        "irc",
        "--base-url",
        fake_server.base_url,
        "--storage-dir",
        str(root),
        input="yo\n",
    )
    assert result.exit_code == 0
    assert message_count(root, "irc:#dev") == 2
    result = invoke("chat", "cli:a", "--session-id", "b", "--storage-dir", str(root), input="")
    assert_one_line_error(result, "disagree")


def test_chat_resumes_a_legacy_session(root: Path, fake_server: FakeServer) -> None:
    path = add_legacy(root)
    before = path.read_bytes()
    result = invoke(
        "chat",
        "cli:old",
        "--base-url",
        fake_server.base_url,
        "--storage-dir",
        str(root),
        input="again\n",
    )
    assert result.exit_code == 0, result.output
    assert path.read_bytes() == before
    sent = fake_server.last_request["messages"]
    assert [m["content"] for m in sent] == [
        "You are a helpful AI assistant.",
        "Hello!",
        "Hi! How can I help you?",
        "again",
    ]
    rows = json.loads(invoke("list", "--json", "--storage-dir", str(root)).stdout)["contexts"]
    assert [(r["context_id"], r["legacy"], r["message_count"]) for r in rows] == [
        ("cli:old", False, 4)
    ]


def run_pipe(
    args: list[str], stdin: str, cwd: Path, **env: str
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    full_env.update(env)
    return subprocess.run(
        args, input=stdin, capture_output=True, text=True, cwd=cwd, env=full_env, timeout=60
    )


def test_chat_through_a_real_pipe(tmp_path: Path, fake_server: FakeServer) -> None:
    """``printf 'hi\\nthere\\n' | terrarium chat --base-url ...`` prints the replies, exits 0."""
    result = run_pipe(
        [*TERRARIUM, "chat", "--base-url", fake_server.base_url], "hi\nthere\n", tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "echo: hi\necho: there\n"
    assert message_count(tmp_path / "sessions", "cli:main") == 4


def test_chat_unreachable_server_one_line_nonzero(tmp_path: Path) -> None:
    result = run_pipe(
        [*TERRARIUM, "chat", "--retries", "0"],
        "hi\n",
        tmp_path,
        TERRARIUM_BASE_URL="http://127.0.0.1:9/v1",
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "http://127.0.0.1:9/v1" in lines[0] and "--base-url" in lines[0]
    assert "TERRARIUM_BASE_URL" in lines[0]
    # the first message of a new session that got no answer leaves nothing, and says so
    assert "nothing was kept: cli:main begins with its first answered message" in lines[0]
    listed = json.loads(run_pipe([*TERRARIUM, "list", "--json"], "", tmp_path).stdout)
    assert listed["contexts"] == []


@pytest.mark.parametrize(
    "option",
    [["--base-url", "http://127.0.0.1:9/v1"], ["--model", "no-such-model"], ["--base-url", "x"]],
)
def test_a_failed_one_shot_leaves_no_new_session(
    tmp_path: Path, fake_server: FakeServer, option: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mistyped --base-url, a wrong model, a bad URL: ``chat -p`` fails in one line saying
    nothing was kept, and no session is left behind; the same in an existing session keeps
    the message, marked failed. In-process, in the default ./sessions."""
    monkeypatch.chdir(tmp_path)
    base = ["--base-url", fake_server.base_url, "--retries", "0"]
    failed = invoke("chat", "cli:badurl", "-p", "hi", *base, *option, input="")
    assert failed.exit_code == 1
    [line] = failed.stderr.strip().splitlines()
    assert "nothing was kept: cli:badurl begins with its first answered message" in line
    assert "Run the command again" in line
    listed = json.loads(invoke("list", "--json", input="").stdout)
    assert listed["contexts"] == []
    shown = invoke("show", "cli:badurl", input="")
    assert shown.exit_code == 1 and "no session 'cli:badurl'" in shown.stderr

    assert invoke("chat", "cli:ok", "-p", "hi", *base, input="").exit_code == 0
    failed = invoke("chat", "cli:ok", "-p", "again", *base, *option, input="")
    assert failed.exit_code == 1
    assert "your message is kept, marked failed" in failed.stderr
    data = json.loads(invoke("stats", "cli:ok", "--json", input="").stdout)
    assert data["message_count"] == 3 and data["last_run"] == "errored"


# --------------------------------------------------------------------------- chat.py


def chat_py(*args: str, stdin: str = "", cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_pipe([sys.executable, str(REPO / "chat.py"), *args], stdin, cwd, **env)


def seed(*args: str, stdin: str = "", **env: str) -> Result:
    """``chat.py ARGS`` in-process (its click command), in the current folder, with no
    ``TERRARIUM_`` setting of the caller's but ``env`` (and the tests' index folder)."""
    from terrarium.cli.seed import seed_chat

    unset: dict[str, str | None] = {
        k: None for k in os.environ if k.startswith("TERRARIUM_") and k != "TERRARIUM_INDEX_DIR"
    }
    runner = CliRunner(env={**unset, **env})
    return runner.invoke(seed_chat, list(args), input=stdin, prog_name="chat.py")


def test_chat_py_seed_commands(
    tmp_path: Path, fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's commands, run from a folder with ./sessions, and with --storage-dir (the
    script itself once, as a process; then its command in-process)."""
    url = fake_server.base_url
    result = chat_py("--session-id", "main", "--base-url", url, stdin="hello\n", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "echo: hello\n"
    assert (tmp_path / "sessions").is_dir()
    monkeypatch.chdir(tmp_path)
    result = seed(stdin="piped\n", TERRARIUM_BASE_URL=url)  # no picker: cli:main
    assert result.exit_code == 0 and result.stdout == "echo: piped\n"
    listing = seed("--list-sessions")
    assert listing.exit_code == 0
    assert listing.stdout.splitlines()[1].split()[:2] == ["cli:main", "4"]

    other = tmp_path / "other"
    result = seed("--session-id", "x", "--storage-dir", str(other), "--base-url", url, stdin="a\n")
    assert result.exit_code == 0
    assert "cli:x" in seed("--list-sessions", "--storage-dir", str(other)).stdout

    refused = seed("--delete-session", "main")
    assert refused.exit_code == 1 and "--yes" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    deleted = seed("--delete-session", "main", "--yes")
    assert deleted.exit_code == 0, deleted.stderr
    assert "cli:main" not in seed("--list-sessions").stdout
    missing = seed("--delete-session", "main", "--yes")
    assert missing.exit_code == 1 and "no session 'cli:main'" in missing.stderr


def test_console_script_and_module(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "terrarium"
    if script.exists():
        result = run_pipe([str(script), "--version"], "", tmp_path)
        assert result.returncode == 0 and "terrarium" in result.stdout
    result = run_pipe([*TERRARIUM, "--help"], "", tmp_path)
    assert result.returncode == 0 and "chat" in result.stdout
