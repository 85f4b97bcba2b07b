"""Retention policies, ``Maintenance`` runs, the maintenance log and the manager's background
maintenance (:mod:`terrarium.lifecycle`), on the reference store (other backends: the contract
suite, ``tests/contract/test_lifecycle.py``)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import stat
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest

from fakeserver import FakeServer
from helpers.history import add_context
from terrarium import FsStore, MemoryStore, states
from terrarium.agent.multi_context_manager import MultiContextManager
from terrarium.errors import ContextNotFound, InvalidRetention
from terrarium.lifecycle import (
    Maintenance,
    MaintenanceLog,
    RetentionPolicy,
    RetentionRule,
    config_path,
    load_policy,
    log_path,
    parse_age,
    plan_archive,
    plan_trash_purge,
    read_policy,
    run_archive,
)
from terrarium.llm.vllm_client import VLLMClient
from terrarium.model import ContextId
from terrarium.stores.base import Store
from terrarium.stores.sqlite import SqliteStore

LATER = datetime.now(UTC) + timedelta(days=40)


def clock(moment: datetime) -> Callable[[], datetime]:
    return lambda: moment


# --------------------------------------------------------------------------- ages


@pytest.mark.parametrize(
    ("text", "age"),
    [
        ("30d", timedelta(days=30)),
        ("12h", timedelta(hours=12)),
        ("2w", timedelta(weeks=2)),
        (" 7D ", timedelta(days=7)),
        (5, timedelta(days=5)),
    ],
)
def test_ages_parse(text: str | int, age: timedelta) -> None:
    assert parse_age(text) == age


TOO_LONG = ["1000000000d", "142857143w", 10**12, "9" * 400 + "d"]  # past timedelta's days


@pytest.mark.parametrize(
    "text", ["", "30", "30 days", "d", "-1d", "0d", "1.5d", "30m", True, *TOO_LONG]
)
def test_bad_ages_are_one_line_errors(text: str | bool) -> None:
    """Malformed, not positive, or too long to count (an OverflowError before)."""
    with pytest.raises(InvalidRetention) as info:
        parse_age(text)  # type: ignore[arg-type]
    assert "\n" not in str(info.value) and "age" in str(info.value)


# --------------------------------------------------------------------------- policy files


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_a_policy_with_per_type_overrides(tmp_path: Path) -> None:
    path = write(
        tmp_path / "terrarium.toml",
        '[retention]\narchive_after = "30d"\npurge_trash_after = 60\n'
        '[retention.types.irc]\narchive_after = "1w"\n'
        '[retention.types.game]\narchive_after = "never"\n',
    )
    policy = read_policy(path, whole_file=True)
    assert policy is not None
    assert policy.archive_after("cli") == timedelta(days=30)
    assert policy.archive_after("irc") == timedelta(weeks=1)
    assert policy.archive_after("game") is None
    assert policy.purge_trash_after("irc") == timedelta(days=60)  # inherited
    assert policy.source == str(path)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('[retention]\narchive_afer = "30d"\n', "retention.archive_afer"),
        ('[retention]\narchive_after = "soon"\n', "retention.archive_after"),
        ("[retention]\narchive_after = true\n", "retention.archive_after"),
        ('[retention.types.irc]\npurge = "1d"\n', "retention.types.irc.purge"),
        ("[retention]\ntypes = 3\n", "retention.types"),
        ('[other]\nx = "1"\n', "'other'"),
        ("[retention\n", "not valid TOML"),
    ],
)
def test_bad_policy_files_name_the_file_and_key(tmp_path: Path, text: str, needle: str) -> None:
    path = write(tmp_path / "terrarium.toml", text)
    with pytest.raises(InvalidRetention) as info:
        read_policy(path, whole_file=True)
    message = str(info.value)
    assert str(path) in message and needle in message and "\n" not in message


def test_the_store_root_file_wins_over_the_user_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """terrarium.toml beside the store wins; else [retention] of
    $XDG_CONFIG_HOME/terrarium/config.toml; else no policy. Other sections of the user's
    config are not the policy's business."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert config_path() == tmp_path / "xdg" / "terrarium" / "config.toml"
    with FsStore(tmp_path / "sessions") as fs, SqliteStore(tmp_path / "db" / "s.db") as sql:
        assert load_policy(fs) is None and load_policy(sql) is None
        write(config_path(), '[ui]\ntheme = "dark"\n[retention]\narchive_after = "10d"\n')
        for store in (fs, sql):
            policy = load_policy(store)
            assert policy is not None and policy.archive_after("cli") == timedelta(days=10)
        write(tmp_path / "sessions" / "terrarium.toml", '[retention]\narchive_after = "3d"\n')
        write(tmp_path / "db" / "terrarium.toml", '[retention]\npurge_trash_after = "2d"\n')
        fs_policy, sql_policy = load_policy(fs), load_policy(sql)
        assert fs_policy is not None and fs_policy.archive_after("cli") == timedelta(days=3)
        assert sql_policy is not None and sql_policy.archive_after("cli") is None
        assert sql_policy.purge_trash_after("cli") == timedelta(days=2)
        assert load_policy(MemoryStore()) is not None  # the user's config only


def test_where_each_backend_keeps_its_maintenance_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    with FsStore(tmp_path / "sessions") as fs, SqliteStore(tmp_path / "s.db") as sql:
        assert log_path(fs) == tmp_path / "sessions" / "maintenance.log"
        assert log_path(sql) == tmp_path / "s.db.maintenance.log"
    assert log_path(MemoryStore()) is None
    pg = cast(Store, SimpleNamespace(_dsn="postgresql://u@h/chats", schema="public"))
    assert log_path(pg) == tmp_path / "state" / "terrarium" / "maintenance-chats.log"
    other = cast(Store, SimpleNamespace(_dsn="dbname=chats host=x", schema="t 1"))
    assert log_path(other) == tmp_path / "state" / "terrarium" / "maintenance-chats-t_1.log"


def test_the_log_file_is_private_json_lines(tmp_path: Path) -> None:
    journal = MaintenanceLog(tmp_path / "deep" / "maintenance.log")
    journal.record("archive", "test", context="cli:a", hot_bytes=10)
    journal.record("maintain", "policy x")
    assert stat.S_IMODE(os.stat(tmp_path / "deep" / "maintenance.log").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "deep").st_mode) == 0o700
    records = journal.records()
    assert [r["action"] for r in records] == ["archive", "maintain"]
    assert records[0]["context"] == "cli:a" and records[0]["why"] == "test"
    last = journal.last_run()
    assert last is not None and abs(datetime.now(UTC) - last) < timedelta(hours=1)


# --------------------------------------------------------------------------- maintenance runs


def old_store() -> MemoryStore:
    """cli:a, cli:b (pinned), irc:c, all 'inactive' at LATER; cli:gone in the trash."""
    store = MemoryStore()
    for name in ("cli:a", "cli:b", "irc:c", "cli:gone"):
        add_context(store, name, f"hello from {name}")
    states.pin_context(store, ContextId.parse("cli:b"))
    states.delete_context(store, ContextId.parse("cli:gone"))
    return store


POLICY = RetentionPolicy(
    RetentionRule(archive_after=timedelta(days=30), purge_trash_after=timedelta(days=30)),
    {"irc": RetentionRule(archive_after=None, purge_trash_after=timedelta(days=30))},
    source="test-policy",
)


def test_without_a_policy_nothing_moves() -> None:
    store = old_store()
    report = Maintenance(store, clock=clock(LATER)).run()
    assert report.policy is None and not report.changed
    assert states.archived_contexts(store) == [] and len(states.trashed_contexts(store)) == 1
    assert MaintenanceLog.of(store).records() == []


def test_a_dry_run_says_what_would_move_and_moves_nothing() -> None:
    store = old_store()
    report = Maintenance(store, policy=POLICY, clock=clock(LATER)).run(dry_run=True)
    assert [c.context for c in report.to_archive.candidates] == ["cli:a"]
    assert report.to_archive.skipped_pinned == ["cli:b"]
    assert [e.context for e in report.to_purge] == ["cli:gone"]
    assert report.changed and report.bytes_saved > 0
    assert states.archived_contexts(store) == [] and len(states.trashed_contexts(store)) == 1
    assert MaintenanceLog.of(store).records() == []


def test_a_run_applies_the_policy_per_type_and_logs_every_removal() -> None:
    """Inactive cli contexts are archived (not pinned ones, not irc: its rule says never), old
    trash is purged; each removal and the run's end are logged with the policy as the why."""
    store = old_store()
    report = Maintenance(store, policy=POLICY, clock=clock(LATER)).run()
    assert [a.context for a in report.archived] == ["cli:a"]
    assert [e.context for e in report.purged] == ["cli:gone"]
    assert [a.context for a in states.archived_contexts(store)] == ["cli:a"]
    assert states.trashed_contexts(store) == []
    records = MaintenanceLog.of(store).records()
    assert [(r["action"], r.get("context")) for r in records] == [
        ("archive", "cli:a"),
        ("purge_trash", "cli:gone"),
        ("maintain", None),
    ]
    assert all(r["why"] == "policy test-policy" for r in records)


def test_a_context_pinned_after_the_plan_stays_hot_unless_named() -> None:
    """A pin that lands between a run's plan and its archive step (another process's ``pin``)
    keeps the context hot: the step checks the pin in the compare-and-set of the freeze. A
    context named explicitly is archived pinned or not (the lifecycle race caught a policy run
    archiving a context pinned while it ran)."""
    store = old_store()
    aged = plan_archive(store, rules=POLICY.archive_after, now=LATER)
    named = plan_archive(store, names=[ContextId.parse("irc:c")], now=LATER)
    assert [c.context for c in aged.candidates] == ["cli:a"]
    states.pin_context(store, ContextId.parse("cli:a"))
    states.pin_context(store, ContextId.parse("irc:c"))
    assert run_archive(store, aged, why="test") == []
    assert not states.is_archived(store, ContextId.parse("cli:a"))
    assert [a.context for a in run_archive(store, named, why="test")] == ["irc:c"]


def test_a_young_context_and_a_pinned_trash_entry_stay() -> None:
    store = old_store()
    add_context(store, "cli:pinned-trash", "x")
    states.pin_context(store, ContextId.parse("cli:pinned-trash"))
    states.delete_context(store, ContextId.parse("cli:pinned-trash"))
    report = Maintenance(store, policy=POLICY).run()  # now: everything is young
    assert report.archived == [] and report.purged == []
    purged = Maintenance(store, policy=POLICY, clock=clock(LATER)).run().purged
    assert [e.context for e in purged] == ["cli:gone"]
    assert [e.context for e in states.trashed_contexts(store)] == ["cli:pinned-trash"]
    named = plan_trash_purge(store, targets=["cli:pinned-trash"])
    assert [e.context for e in named] == ["cli:pinned-trash"]


def test_a_run_is_due_once_a_day() -> None:
    store = old_store()
    first = Maintenance(store, policy=POLICY, clock=clock(LATER))
    assert first.run_if_due() is not None
    assert first.run_if_due() is None
    again = Maintenance(store, policy=POLICY, clock=clock(LATER + timedelta(hours=25)))
    assert again.run_if_due() is not None


def test_a_run_held_by_another_process_is_skipped(tmp_path: Path) -> None:
    """The run holds an flock on the log file: a second run while it is held does nothing."""
    store = old_store()
    path = tmp_path / "maintenance.log"
    path.touch()
    fd = os.open(path, os.O_WRONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        held = Maintenance(store, policy=POLICY, journal=MaintenanceLog(path), clock=clock(LATER))
        assert held.run_if_due() is None
    finally:
        os.close(fd)
    assert held.run_if_due() is not None
    assert [r["action"] for r in MaintenanceLog(path).records()][-1] == "maintain"


# --------------------------------------------------------------------------- the manager


def test_the_manager_maintains_in_the_background_and_stops_on_close(
    fake_server: FakeServer,
) -> None:
    """MultiContextManager(maintain=...) archives by the policy in a daemon thread while turns
    go on; a turn in an archived context brings it back; close() stops the thread."""
    store = old_store()
    journal = MaintenanceLog.of(store)
    ran = threading.Event()
    original = journal.record

    def record(action: str, why: str, **details: object) -> None:
        original(action, why, **details)
        if action == "maintain":
            ran.set()

    journal.record = record  # type: ignore[method-assign]
    maintenance = Maintenance(store, policy=POLICY, journal=journal, clock=clock(LATER))

    async def main() -> None:
        client = VLLMClient(base_url=fake_server.root_url, max_retries=0)
        manager = MultiContextManager(client, store=store, maintain=maintenance)
        try:
            reply = await manager.process_with_context("cli:new", "hi")
            assert reply == "echo: hi"
            assert await asyncio.to_thread(ran.wait, 60)
            assert states.is_archived(store, ContextId.parse("cli:a"))
            assert (await manager.process_with_context("cli:a", "back?")).endswith("back?")
            assert not states.is_archived(store, ContextId.parse("cli:a"))
            worker = manager._maintenance
            assert worker is not None and worker.runs == 1
        finally:
            await manager.aclose()
        assert not worker.alive

    asyncio.run(main())


def test_maintain_true_without_a_policy_moves_nothing(fake_server: FakeServer) -> None:
    store = old_store()

    async def main() -> None:
        client = VLLMClient(base_url=fake_server.root_url, max_retries=0)
        manager = MultiContextManager(client, store=store, maintain=True)
        worker = manager._maintenance
        assert worker is not None
        await manager.aclose()
        assert not worker.alive

    asyncio.run(main())
    assert states.archived_contexts(store) == [] and len(states.trashed_contexts(store)) == 1


def test_the_manager_delete_keeps_its_seed_meaning_and_goes_to_the_trash(
    fake_server: FakeServer,
) -> None:
    """MultiContextManager.delete_context: gone from list_all_contexts and get_stats, but in
    the trash (restorable), and logged with the manager as the why."""
    store = old_store()

    async def main() -> None:
        client = VLLMClient(base_url=fake_server.root_url, max_retries=0)
        manager = MultiContextManager(client, store=store)
        try:
            assert manager.delete_context("cli:a") is True
            rows = [row for group in manager.list_all_contexts().values() for row in group]
            assert rows and "cli:a" not in [row["context_id"] for row in rows]
            with pytest.raises(ContextNotFound):
                manager.get_stats("cli:a")
        finally:
            await manager.aclose()

    asyncio.run(main())
    entry = next(e for e in states.trashed_contexts(store) if e.context == "cli:a")
    states.restore_trashed(store, entry.trash_id)
    assert store.get_head(ContextId.parse("cli:a")) is not None
    (record,) = [r for r in MaintenanceLog.of(store).records() if r.get("context") == "cli:a"]
    assert record["why"] == "MultiContextManager.delete_context"


def test_a_linked_log_file_is_neither_written_nor_read_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A link where a store's maintenance log belongs leads nowhere: nothing outside the root
    is written or read through it; the write is a warning, the log reads as empty."""
    store = FsStore(tmp_path / "store")
    outside = tmp_path / "outside.log"
    outside.write_text('{"ts": "2026-01-01T00:00:00Z", "action": "maintain", "why": "x"}\n')
    (tmp_path / "store" / "maintenance.log").symlink_to(outside)
    journal = MaintenanceLog.of(store)
    journal.record("archive", "policy", context="cli:old")
    assert outside.read_text().count("\n") == 1
    assert "cannot write the maintenance log" in caplog.text
    assert journal.records() == [] and journal.last_run() is None
    with pytest.raises(OSError), journal.exclusive():
        pass  # a policy run does not take its lock on the linked file either
    store.close()


def test_a_linked_policy_file_in_the_store_is_refused(tmp_path: Path) -> None:
    """The store's ``terrarium.toml`` is read from the store only: a link there is a one-line
    error naming it, and the file it names is not read."""
    store = FsStore(tmp_path / "store")
    outside = tmp_path / "policy.toml"
    outside.write_text('[retention]\narchive_after = "1d"\n')
    (tmp_path / "store" / "terrarium.toml").symlink_to(outside)
    with pytest.raises(InvalidRetention, match=r"terrarium\.toml: a link"):
        load_policy(store)
    store.close()
