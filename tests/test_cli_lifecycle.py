"""The lifecycle commands (archive, unarchive, delete, trash, pin, unpin, maintain, list
--archived/--all, search --archived) through the real command line, on a store with
``Lifecycle`` (the reference store, put behind the command line's ``open_store``), on a store
without it, and, for the question ``delete --purge`` asks, in a real terminal.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import CliRunner, Result
from starlette.testclient import TestClient

import terrarium.blobs
import terrarium.cli.app
import terrarium.lifecycle
from helpers.history import add_context
from helpers.plain_store import PlainStore
from terrarium import FsStore, MemoryStore, states
from terrarium.cli import cli
from terrarium.lifecycle import MaintenanceLog, config_path
from terrarium.model import ContextId
from terrarium.stores.base import Lifecycle, Store
from terrarium.web import create_app

LATER = datetime.now(UTC) + timedelta(days=40)


@pytest.fixture
def store(monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryStore]:
    """cli:a (two messages), cli:b (pinned), irc:c; every command opens this store."""
    memory = MemoryStore()
    add_context(memory, "cli:a", "walrus one", "two")
    add_context(memory, "cli:b", "walrus pinned")
    add_context(memory, "irc:c", "three")
    states.pin_context(memory, ContextId.parse("cli:b"))
    monkeypatch.setattr(terrarium.cli.app, "open_store", lambda *a, **k: memory)
    yield memory


@pytest.fixture
def later(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forty days from now: every context is inactive for longer than 30d."""
    monkeypatch.setattr(terrarium.lifecycle, "_now", lambda: LATER)


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def ok(*args: str) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return result


def one_line_error(result: Result, needle: str, code: int = 1) -> None:
    assert result.exit_code == code, result.output
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert needle in result.stderr, result.stderr


def listed(*args: str) -> list[tuple[str, str, bool]]:
    data = json.loads(ok("list", "--json", *args).stdout)
    return [(c["context_id"], c["state"], c["pinned"]) for c in data["contexts"]]


def archived(store: Lifecycle) -> list[str]:
    return [a.context for a in states.archived_contexts(store)]


# --------------------------------------------------------------------------- archive


def test_archive_dry_run_prints_what_would_move_and_moves_nothing(
    store: MemoryStore, later: None
) -> None:
    result = ok("archive", "--older-than", "30d", "--dry-run")
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["context", "messages", "last", "active", "size", "pinned"]
    assert [line.split()[0] for line in lines[1:]] == ["cli:a", "irc:c"]
    assert "would archive 2 sessions" in result.stderr
    assert "skipped 1 pinned session" in result.stderr
    assert archived(store) == []
    data = json.loads(ok("archive", "--older-than", "30d", "--dry-run", "--json").stdout)
    assert data["dry_run"] is True and data["skipped_pinned"] == ["cli:b"]
    assert [c["context_id"] for c in data["contexts"]] == ["cli:a", "irc:c"]
    assert data["bytes_saved"] == sum(c["hot_bytes"] for c in data["contexts"]) > 0
    assert MaintenanceLog.of(store).records() == []


def test_archive_by_age_and_type_then_list_shows_states(store: MemoryStore, later: None) -> None:
    result = ok("archive", "--older-than", "30d", "--type", "cli")
    assert result.stdout == ""
    assert result.stderr.startswith("archived 1 session: ")  # one line, no progress bar
    assert "skipped 1 pinned session" in result.stderr
    assert archived(store) == ["cli:a"]
    assert listed() == [("cli:b", "hot", True), ("irc:c", "hot", False)]
    assert listed("--archived") == [("cli:a", "archived", False)]
    assert sorted(listed("--all")) == [
        ("cli:a", "archived", False),
        ("cli:b", "hot", True),
        ("irc:c", "hot", False),
    ]
    table = ok("list", "--all").stdout.splitlines()
    assert table[0].split()[-1] == "state"
    assert any(line.startswith("cli:b") and line.endswith("hot, pinned") for line in table)
    (record,) = MaintenanceLog.of(store).records()
    assert record["action"] == "archive" and record["why"] == "command: terrarium archive"


def test_archive_named_takes_pinned_and_json_has_the_store_figures(store: MemoryStore) -> None:
    data = json.loads(ok("archive", "cli:b", "--json").stdout)
    (entry,) = data["contexts"]
    assert entry["context_id"] == "cli:b" and entry["pinned"] is True
    assert entry["hot_bytes"] > 0 and entry["archived_bytes"] > 0 and entry["archived_at"]
    assert data["dry_run"] is False and data["bytes_saved"] == 0  # nothing compresses in memory
    assert archived(store) == ["cli:b"]
    assert ok("archive", "cli:b").stderr == "nothing to archive\n"


def test_archive_refuses_bad_input_in_one_line(store: MemoryStore) -> None:
    one_line_error(invoke("archive"), "name the sessions to archive, or give an age")
    one_line_error(invoke("archive", "--older-than", "30 days"), "bad age '30 days'")
    too_long = "bad age '99999999999d': longer than 999999999 days"
    one_line_error(invoke("archive", "--older-than", "99999999999d"), too_long)
    one_line_error(invoke("archive", "cli:nope"), "no session 'cli:nope'")
    assert archived(store) == []


def test_archived_sessions_show_export_and_search_by_reference(store: MemoryStore) -> None:
    ok("archive", "cli:a")
    assert "walrus one" in ok("show", "cli:a").stdout
    assert "walrus one" in ok("export", "cli:a", "-f", "jsonl").stdout
    hits = json.loads(ok("search", "walrus", "--json").stdout)["hits"]
    assert {h["context_id"] for h in hits} == {"cli:b"}
    hits = json.loads(ok("search", "walrus", "--archived", "--json").stdout)["hits"]
    assert {h["context_id"] for h in hits} == {"cli:a", "cli:b"}
    assert archived(store) == ["cli:a"]  # reading changed nothing


def test_searching_an_archived_session_without_archived_says_to_pass_it(store: MemoryStore) -> None:
    """``search -c`` of an archived session finds nothing, as a search of no match does
    (exit 1), in one line that says why and what to pass; with --json that line is on stderr."""
    ok("archive", "cli:a")
    hint = "no messages match 'walrus': cli:a is archived (pass --archived to search it)\n"
    for args in ([], ["--json"]):
        result = invoke("search", "walrus", "-c", "cli:a", *args)
        assert result.exit_code == 1
        assert result.stderr == hint
        assert result.stdout == "" if not args else json.loads(result.stdout)["hits"] == []
    none = invoke("search", "nowhere", "-c", "cli:a", "--archived")
    assert (none.exit_code, none.stderr) == (1, "no messages match 'nowhere'\n")
    assert invoke("search", "walrus", "-c", "cli:b").exit_code == 0


def test_a_search_that_finds_nothing_says_what_a_wider_one_would(store: MemoryStore) -> None:
    """Nothing on the current branches: the line names ``--all-branches`` and what it finds;
    nothing in hot sessions while some are archived: it counts those (not read); nothing
    anywhere: the bare line. Exit 1 each time, the line on stderr with --json too."""
    plain = invoke("search", "nowhere")
    assert (plain.exit_code, plain.stderr) == (1, "no messages match 'nowhere'\n")
    ok("rewind", "cli:a", "-n", "2")  # the whole conversation leaves it, kept in the tree
    off = json.loads(ok("search", "walrus", "-c", "cli:a", "--all-branches", "--json").stdout)
    hint = (
        "no messages match 'walrus' on the current branches "
        f"(--all-branches finds {len(off['hits'])} message)\n"
    )
    assert len(off["hits"]) == 1
    for args in ([], ["--json"]):
        result = invoke("search", "walrus", "-c", "cli:a", *args)
        assert (result.exit_code, result.stderr) == (1, hint)
    ok("archive", "irc:c")
    cold = invoke("search", "three")
    hint = "no messages match 'three' in hot sessions (1 archived session: --archived)\n"
    assert (cold.exit_code, cold.stderr) == (1, hint)
    other_type = invoke("search", "three", "--type", "cli")
    assert (other_type.exit_code, other_type.stderr) == (1, "no messages match 'three'\n")


def test_unarchive(store: MemoryStore) -> None:
    ok("archive", "cli:a")
    assert ok("unarchive", "cli:a").stderr == "unarchived cli:a\n"
    assert archived(store) == []
    assert ok("unarchive", "cli:a").stderr == "cli:a is not archived\n"
    one_line_error(invoke("unarchive", "cli:nope"), "no session 'cli:nope'")


# --------------------------------------------------------------------------- delete, trash


def test_delete_moves_to_the_trash_and_says_how_to_restore(store: MemoryStore) -> None:
    result = ok("delete", "cli:a")  # no question, no --yes: it can be undone
    (entry,) = states.trashed_contexts(store)
    assert result.stderr == (
        f"deleted cli:a (moved to the trash; undo with: terrarium trash restore {entry.trash_id})\n"
    )
    assert [c for c, _, _ in listed()] == ["cli:b", "irc:c"]
    trash = json.loads(ok("trash", "list", "--json").stdout)["trash"]
    assert [(t["trash_id"], t["context_id"], t["archived"]) for t in trash] == [
        (entry.trash_id, "cli:a", False)
    ]
    assert ok("trash", "list").stdout.splitlines()[1].startswith(entry.trash_id)
    assert ok("trash", "restore", "cli:a").stderr == "restored cli:a\n"
    assert states.trashed_contexts(store) == []
    assert ok("show", "cli:a", "--json").stdout.count("walrus one") == 1
    (record,) = MaintenanceLog.of(store).records()
    assert (record["action"], record["why"]) == ("trash", "command: terrarium delete")


def test_restore_into_a_taken_id_needs_as(store: MemoryStore) -> None:
    ok("archive", "cli:a")
    ok("delete", "cli:a")
    add_context(store, "cli:a", "new life")
    one_line_error(invoke("trash", "restore", "cli:a"), "--as")
    (entry,) = states.trashed_contexts(store)
    assert ok("trash", "restore", entry.trash_id, "--as", "cli:old").stderr == (
        "restored cli:old (archived)\n"
    )
    assert archived(store) == ["cli:old"]
    one_line_error(invoke("trash", "restore", "cli:zzz"), "nothing in the trash")


def test_delete_purge_needs_yes_without_a_terminal(store: MemoryStore) -> None:
    one_line_error(invoke("delete", "cli:a", "--purge"), "--yes")
    assert store.get_head(ContextId.parse("cli:a")) is not None
    assert ok("delete", "cli:a", "--purge", "--yes").stderr == "deleted cli:a for ever\n"
    assert store.get_head(ContextId.parse("cli:a")) is None
    assert states.trashed_contexts(store) == []
    (record,) = MaintenanceLog.of(store).records()
    assert (record["action"], record["context"]) == ("purge", "cli:a")
    one_line_error(invoke("delete", "cli:a", "--purge", "--yes"), "no session 'cli:a'")


def test_trash_purge_by_age_name_and_all(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("cli:a", "cli:b", "irc:c"):
        ok("delete", name)
    assert ok("trash", "purge", "--older-than", "30d").stderr == "nothing to purge\n"
    monkeypatch.setattr(terrarium.lifecycle, "_now", lambda: LATER)
    dry = ok("trash", "purge", "--older-than", "30d", "--dry-run")
    assert "would purge 2 sessions" in dry.stderr  # not cli:b: pinned
    one_line_error(invoke("trash", "purge", "--older-than", "30d"), "--yes")
    assert len(states.trashed_contexts(store)) == 3
    assert ok("trash", "purge", "irc:c", "--yes").stderr.startswith("purged 1 session")
    assert ok("trash", "purge", "--yes").stderr.startswith("purged 1 session")  # cli:a
    assert [e.context for e in states.trashed_contexts(store)] == ["cli:b"]
    assert ok("trash", "purge", "cli:b", "--yes").stderr.startswith("purged 1 session")
    assert ok("trash", "list").stderr.startswith("the trash of ")
    actions = [r["action"] for r in MaintenanceLog.of(store).records()]
    assert actions == ["trash"] * 3 + ["purge_trash"] * 3
    one_line_error(invoke("trash", "purge", "cli:zzz", "--yes"), "nothing in the trash")


def test_trash_purge_collects_the_large_outputs_nothing_refers_to(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    memory = MemoryStore(blob_threshold=8)  # every message below is a blob
    add_context(memory, "cli:a", "a long shared message")
    add_context(memory, "cli:b", "a long shared message", "a reply only cli:b has")
    monkeypatch.setattr(terrarium.cli.app, "open_store", lambda *a, **k: memory)
    assert len(memory.blob_digests()) == 2
    ok("delete", "cli:b")
    assert len(memory.blob_digests()) == 2  # in the trash, cli:b still refers to both
    # An hour later (a blob put in the last hour may be about to be named by an append).
    hour_later = time.time() + 3700
    monkeypatch.setattr(terrarium.blobs, "time", SimpleNamespace(time=lambda: hour_later))
    ok("trash", "purge", "--yes")
    assert len(memory.blob_digests()) == 1  # cli:a's message stays
    last = MaintenanceLog.of(memory).records()[-1]
    assert (last["action"], last["blobs"]) == ("collect_blobs", 1)


# --------------------------------------------------------------------------- pin


def test_pin_and_unpin(store: MemoryStore) -> None:
    assert "pinned irc:c" in ok("pin", "irc:c").stderr
    assert states.pinned_contexts(store) == {"cli:b", "irc:c"}
    assert ok("unpin", "cli:b").stderr == "unpinned cli:b\n"
    assert states.pinned_contexts(store) == {"irc:c"}
    one_line_error(invoke("pin", "cli:nope"), "no session 'cli:nope'")


# --------------------------------------------------------------------------- maintain


def test_maintain_without_a_policy_is_silent(store: MemoryStore, later: None) -> None:
    result = ok("maintain")
    assert result.stdout == "" and result.stderr == ""
    assert archived(store) == []


def test_maintain_applies_the_user_policy_and_is_quiet_when_done(
    store: MemoryStore, later: None
) -> None:
    policy = config_path()
    policy.parent.mkdir(parents=True)
    policy.write_text(
        '[retention]\narchive_after = "30d"\npurge_trash_after = "30d"\n'
        '[retention.types.irc]\narchive_after = "never"\n'
    )
    dry = json.loads(ok("maintain", "--dry-run", "--json").stdout)
    assert dry["policy"] == str(policy) and dry["dry_run"] is True
    assert [c["context_id"] for c in dry["archived"]] == ["cli:a"]
    assert archived(store) == []
    result = ok("maintain")
    assert result.stdout == "archived cli:a\n"
    assert result.stderr.startswith("maintain: archived 1, purged 0")
    assert archived(store) == ["cli:a"]
    again = ok("maintain")
    assert again.stdout == "" and again.stderr == ""  # cron: nothing happened, nothing said
    records = MaintenanceLog.of(store).records()
    assert [r["action"] for r in records] == ["archive", "maintain", "maintain"]
    assert records[0]["why"] == f"policy {policy}"


def test_maintain_fails_on_a_bad_policy(store: MemoryStore) -> None:
    policy = config_path()
    policy.parent.mkdir(parents=True)
    policy.write_text('[retention]\narchive_after = "soon"\n')
    one_line_error(invoke("maintain"), f"{policy}: retention.archive_after")


# --------------------------------------------------------------------------- without Lifecycle


@pytest.fixture
def plain(monkeypatch: pytest.MonkeyPatch) -> Store:
    store: Any = PlainStore()
    add_context(store, "cli:a", "one")
    monkeypatch.setattr(terrarium.cli.app, "open_store", lambda *a, **k: store)
    assert not isinstance(store, Lifecycle)
    return store  # type: ignore[no-any-return]


@pytest.mark.parametrize(
    "args",
    [
        ["archive", "cli:a"],
        ["unarchive", "cli:a"],
        ["trash", "list"],
        ["trash", "restore", "cli:a"],
        ["trash", "purge", "--yes"],
        ["pin", "cli:a"],
        ["unpin", "cli:a"],
        ["maintain"],
        ["delete", "cli:a"],
        ["delete", "cli:a", "--purge", "--yes"],
    ],
)
def test_a_store_without_lifecycle_says_it_cannot_archive(plain: Store, args: list[str]) -> None:
    """Without the state primitives there is no trash, archive or pin, and no delete: every
    delete goes through the trash (or its purge)."""
    one_line_error(invoke(*args), "this backend cannot archive, trash or pin sessions")
    assert plain.get_head(ContextId.parse("cli:a")) is not None


# --------------------------------------------------------------------------- a terminal


def test_delete_purge_asks_on_a_terminal(tmp_path: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    root = tmp_path / "sessions"
    with FsStore(root) as fs:
        add_context(fs, "cli:main", "hi")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "terrarium.cli", "delete", "cli:main", "--purge", "--storage-dir", str(root)],
        encoding="utf-8",
        timeout=60,
    )
    child.expect(r"Delete cli:main and all its history for ever\? \[y/N\]")
    child.send("y\r")
    child.expect("deleted cli:main for ever")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    with FsStore(root) as fs:
        assert fs.get_head(ContextId.parse("cli:main")) is None


def test_json_fields_are_documented(store: MemoryStore, later: None) -> None:
    """Every key the lifecycle commands' --json prints appears in its section of docs/cli.md."""
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text(encoding="utf-8")

    def section(command: str) -> str:
        match = re.search(rf"^### terrarium {command}\n(.*?)(?=^##)", text, re.M | re.S)
        assert match, command
        return match.group(1)

    def keys(value: object) -> set[str]:
        if isinstance(value, dict):
            return set(value) | {k for inner in value.values() for k in keys(inner)}
        if isinstance(value, list):
            return {k for inner in value for k in keys(inner)}
        return set()

    policy = config_path()
    policy.parent.mkdir(parents=True)
    policy.write_text('[retention]\narchive_after = "30d"\n')
    runs = [
        ("archive", ["archive", "--older-than", "30d", "--dry-run"]),
        ("maintain", ["maintain", "--dry-run"]),
        ("archive", ["archive", "cli:a"]),
        ("maintain", ["maintain"]),
    ]
    ok("delete", "irc:c")
    runs.append(("trash", ["trash", "list"]))
    for command, args in runs:
        # maintain's entries are documented as those of archive and trash list
        shown = section(command) + (section("archive") + section("trash")) * (command == "maintain")
        for key in keys(json.loads(ok(*args, "--json").stdout)):
            assert f"`{key}`" in shown, f"{args}: {key} not documented"


def test_a_progress_bar_only_when_stderr_is_a_terminal(
    store: MemoryStore, later: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a terminal, archive draws click's progress bar (labelled) on stderr; elsewhere it
    prints only its one summary line (see test_archive_by_age_and_type_then_list_shows_states)."""
    from terrarium.cli.output import Output

    monkeypatch.setattr(Output, "err_rich", property(lambda self: True))
    monkeypatch.setattr(Output, "note", lambda self, text, style="": print(text, file=sys.stderr))
    result = ok("archive", "--older-than", "30d")
    assert result.stderr.startswith("archiving")
    assert "archived 2 sessions" in result.stderr


@pytest.mark.parametrize("kind", ["fs", "sqlite"])
def test_fsck_reads_every_session_hot_archived_and_in_the_trash(tmp_path: Path, kind: str) -> None:
    """``fsck`` checks archived and trashed sessions too, and counts the same on every store:
    four sessions (two hot, one archived, one in the trash), every segment and entry read."""
    from terrarium.stores.url import open_store

    where = str(tmp_path / "store") if kind == "fs" else f"sqlite:///{tmp_path / 'store.db'}"
    with open_store(where) as store:
        for name in ("a", "b", "old", "gone"):
            add_context(store, f"cli:{name}", "one", "two")
        states.archive_context(store, ContextId.parse("cli:old"))
        states.delete_context(store, ContextId.parse("cli:gone"))
    done = invoke("--storage-dir", where, "fsck", "--json")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert (report["contexts"], report["segments"], report["entries"]) == (4, 4, 8)


def test_a_damaged_session_can_be_deleted_to_the_trash_and_restored(tmp_path: Path) -> None:
    """A session whose log has a damaged line goes to the trash like any other (its figures
    there unknown: shown as "damaged"), not only for ever with ``--purge``; restored, it is
    the same damaged session, for ``fsck --repair --salvage`` to mend."""
    root = str(tmp_path / "store")
    with FsStore(root) as store:
        add_context(store, "cli:bad", "one", "two")
        folder = store.folder_of(ContextId.parse("cli:bad"))
    assert folder is not None
    [segment] = folder.glob("*.jsonl")
    lines = segment.read_bytes().split(b"\n")
    segment.write_bytes(b"\n".join([lines[0], b'{"v": 1, oops', *lines[2:]]))
    deleted = invoke("--storage-dir", root, "delete", "cli:bad")
    assert deleted.exit_code == 0, deleted.output
    trash = invoke("--storage-dir", root, "trash", "list")
    assert "cli:bad" in trash.stdout and "damaged" in trash.stdout
    [entry] = json.loads(invoke("--storage-dir", root, "trash", "list", "--json").stdout)["trash"]
    assert (entry["message_count"], entry["bytes"]) == (None, None)
    with FsStore(root) as store:
        page = TestClient(create_app(store), base_url="http://127.0.0.1").get("/trash")
    assert page.status_code == 200 and "cli:bad" in page.text and "damaged" in page.text
    assert invoke("--storage-dir", root, "trash", "restore", "cli:bad").exit_code == 0
    assert invoke("--storage-dir", root, "fsck", "--repair", "--salvage").exit_code == 0
    assert "two" in invoke("--storage-dir", root, "show", "cli:bad").stdout  # line 2 was "one"
