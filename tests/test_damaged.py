"""What a user can do with a damaged session, on every backend, and what it does to the others.

A session is damaged here by a line in the middle of its head segment that is not JSON (on a
database, the row's line). Each command that reads many sessions goes on past it: ``list``,
``search`` and ``stats`` answer with the others and name it; ``export --all``, ``copy`` and an
archive by age or policy write the others, skip it with a warning naming the place, and exit 1.
A command about it alone fails in one line naming the place and ``terrarium fsck``; nothing is
written. On the filesystem, a fork whose parent segment is lost is damaged the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

import terrarium.lifecycle
from fakeserver import FakeServer
from pg import own_database, pg_database, store_url  # noqa: F401  (a fixture)
from terrarium import ContextId, FsStore, PodActiveSegmentRef, fork_at
from terrarium.cli import cli
from terrarium.lifecycle import config_path
from terrarium.sessions import create_segment, save_delta
from terrarium.stores.url import open_store

BACKENDS = ["fs", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
HINT = "terrarium fsck"


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


@pytest.fixture(scope="module")
def pg_own(pg_database: str) -> Iterator[str]:  # noqa: F811
    """A database of this module's own (the command line's store is its default schema)."""
    yield from own_database(pg_database)


def _add(store: object, context: str, *texts: str) -> None:
    create_segment(store, None, context=context)  # type: ignore[arg-type]
    head = store.get_head(ContextId.parse(context))  # type: ignore[attr-defined]
    save_delta(store, head, [{"role": "user", "content": text} for text in texts])  # type: ignore[arg-type]


def _damaged(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, *, context: str = "cli:bad"
) -> tuple[str, str]:
    """A store holding cli:good (2 messages), cli:other (1) and ``context`` (3, its second
    line of entries unreadable); its URL, and how errors name the damaged line."""
    url = store_url(kind, tmp_path, "sessions", request)
    with open_store(url) as store:
        _add(store, "cli:good", "good walrus one", "good two")
        _add(store, "cli:other", "other walrus")
        _add(store, context, "bad walrus one", "bad two", "bad three")
    return url, _damage(kind, tmp_path, request, url, context)


def _damage(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, url: str, context: str
) -> str:
    """Make the second line of entries of ``context``'s head segment unreadable; how errors
    name that line."""
    with open_store(url) as store:
        head = store.get_head(ContextId.parse(context))
        assert head is not None
        folder = store.folder_of(ContextId.parse(context)) if isinstance(store, FsStore) else None
    segment = head.segment_id
    if folder is not None:
        path = folder / f"{segment}.jsonl"
        lines = path.read_bytes().splitlines(keepends=True)
        path.write_bytes(b"".join([*lines[:2], b"{not json\n", *lines[3:]]))
        return f"{path}:3"
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / "sessions.db") as conn:
            conn.execute(
                "UPDATE entries SET line = '{not json' WHERE seq = 2 AND seg = "
                "(SELECT id FROM segments WHERE segment_id = ?)",
                (str(segment),),
            )
        return f"segment {segment}:2"
    import psycopg

    with psycopg.connect(request.getfixturevalue("pg_own"), autocommit=True) as conn:
        conn.execute(
            "UPDATE terrarium.entries SET line = '{not json' WHERE segment_id = %s AND seq = 2",
            (segment,),
        )
    return f"segment {segment}:2"


def _one_line_error(result: Result, place: str) -> None:
    """Exit 1 with one line on stderr naming ``place`` and the command that checks it."""
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1, result.stderr
    assert place in result.stderr and HINT in result.stderr, result.stderr


@pytest.mark.parametrize("kind", BACKENDS)
def test_list_search_and_stats_answer_around_a_damaged_session(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``list`` lists every session, the damaged one with its problem naming the line;
    ``search`` finds the others' messages; ``stats`` counts what can be read of it, as the
    dashboard does, and names it. Each exits 0, as ``list`` always did on the filesystem."""
    url, place = _damaged(kind, tmp_path, request)
    listed = invoke("list", "--json", "--storage-dir", url)
    assert listed.exit_code == 0, listed.output
    rows = {row["context_id"]: row for row in json.loads(listed.stdout)["contexts"]}
    assert set(rows) == {"cli:good", "cli:other", "cli:bad"}
    assert rows["cli:good"]["message_count"] == 2 and rows["cli:good"]["problem"] is None
    assert place in rows["cli:bad"]["problem"]
    found = invoke("search", "walrus", "--json", "--storage-dir", url)
    assert found.exit_code == 0, found.output
    hits = {hit["context_id"] for hit in json.loads(found.stdout)["hits"]}
    assert {"cli:good", "cli:other"} <= hits
    stats = invoke("stats", "--json", "--storage-dir", url)
    assert stats.exit_code == 0, stats.output
    totals = json.loads(stats.stdout)
    # The damaged session counts what of it can be read: its type's sessions include it.
    cli = totals["by_type"]["cli"]
    assert (totals["contexts"], totals["damaged"], cli["contexts"]) == (3, 1, 3)
    assert totals["messages"] == sum(row["message_count"] for row in rows.values())
    warned = [line for line in stats.stderr.splitlines() if place in line]
    assert len(warned) == 1 and "cli:bad partly counted" in warned[0], stats.stderr


@pytest.mark.parametrize("kind", BACKENDS)
def test_a_command_about_a_damaged_session_names_the_line_and_fsck(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, fake_server: FakeServer
) -> None:
    """``show``, ``stats``, ``export``, ``fork`` and ``chat`` of the damaged session: one line
    naming the damaged line and ``terrarium fsck`` (``archive``: its warning names the line);
    no model call, nothing written (no export file, no fork target, still hot)."""
    url, place = _damaged(kind, tmp_path, request)
    for args in (
        ["show", "cli:bad"],
        ["stats", "cli:bad"],
        ["export", "cli:bad", "-o", str(tmp_path / "bad.md")],
        ["fork", "cli:bad", "cli:copy"],
    ):
        _one_line_error(invoke(*args, "--storage-dir", url), place)
    archived = invoke("archive", "cli:bad", "--storage-dir", url)  # a warning, then the error
    assert archived.exit_code == 1 and place in archived.stderr and HINT in archived.stderr
    chat = invoke(
        "chat", "cli:bad", "--base-url", fake_server.base_url, "--storage-dir", url, input="hi\n"
    )
    _one_line_error(chat, place)
    assert fake_server.requests == []
    assert not (tmp_path / "bad.md").exists()
    listed = json.loads(invoke("list", "--json", "--storage-dir", url).stdout)["contexts"]
    assert sorted(row["context_id"] for row in listed) == ["cli:bad", "cli:good", "cli:other"]
    assert {row["state"] for row in listed} == {"hot"}


@pytest.mark.parametrize("kind", BACKENDS)
def test_fsck_names_the_context_session_and_line_of_a_damaged_session(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``fsck`` names the damaged conversation in the same words on every backend: its
    context, its session and the place (a file and line; on a database, the segment and the
    entry's seq), as ``list`` and a command about it do; ``--json`` gives each apart."""
    url, place = _damaged(kind, tmp_path, request)
    with open_store(url) as store:
        head = store.get_head(ContextId.parse("cli:bad"))
    assert head is not None
    checked = invoke("fsck", "--storage-dir", url)
    assert checked.exit_code == 1 and HINT not in checked.stdout
    [line] = [line for line in checked.stdout.splitlines() if place in line]
    assert line.startswith(f"cli:bad session {head.session_id}: {place}: "), line
    [problem] = json.loads(invoke("fsck", "--json", "--storage-dir", url).stdout)["problems"]
    assert (problem["context"], problem["session_id"]) == ("cli:bad", str(head.session_id))
    assert problem["segment_id"] == str(head.segment_id)
    assert problem["line"] == int(place.rsplit(":", 1)[1])
    assert "not valid JSON" in problem["message"] and place not in problem["message"]


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("target", ["folder", "bundle"])
def test_export_all_writes_the_others_and_names_the_damaged_one(
    kind: str, target: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``export --all`` (markdown into a folder, or a jsonl bundle): every other session is
    written; the damaged one is skipped with a warning naming its line, and the command ends
    with one error naming ``terrarium fsck`` and exit 1."""
    url, place = _damaged(kind, tmp_path, request)
    out = tmp_path / ("out" if target == "folder" else "out.tar.gz")
    fmt = "markdown" if target == "folder" else "jsonl"
    result = invoke("export", "--all", "-f", fmt, "-o", str(out), "--storage-dir", url)
    assert result.exit_code == 1, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "cli:bad" in warnings[0] and place in warnings[0]
    assert result.stderr.splitlines()[-1].startswith("Error: ") and HINT in result.stderr
    if target == "folder":
        assert sorted(p.name for p in (out / "cli").iterdir()) == ["good.md", "other.md"]
    else:
        imported = tmp_path / "imported"
        loaded = invoke("import", str(out), "--storage-dir", str(imported))
        assert loaded.exit_code == 0, loaded.output
        with FsStore(imported) as store:
            assert sorted(h.context for h in store.list_contexts()) == ["cli:good", "cli:other"]


@pytest.mark.parametrize("kind", BACKENDS)
def test_copy_copies_the_others_and_names_the_damaged_one(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``copy`` of a whole store: every other session lands in the destination; the damaged
    one is skipped with a warning naming its line, and the command ends with one error naming
    ``terrarium fsck`` and exit 1."""
    url, place = _damaged(kind, tmp_path, request)
    destination = tmp_path / "copy"
    result = invoke("copy", url, str(destination))
    assert result.exit_code == 1, result.output
    skipped = [line for line in result.stderr.splitlines() if "cli:bad" in line]
    assert len(skipped) == 1 and place in skipped[0], result.stderr
    assert HINT in result.stderr.splitlines()[-1], result.stderr
    with FsStore(destination) as store:
        assert sorted(h.context for h in store.list_contexts()) == ["cli:good", "cli:other"]


@pytest.mark.parametrize("kind", BACKENDS)
@pytest.mark.parametrize("how", ["age", "policy"])
def test_an_archive_by_age_or_policy_goes_on_past_a_damaged_session(
    kind: str,
    how: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``archive --older-than`` and ``maintain`` forty days on: the others are archived, the
    damaged one stays hot, named with its line and ``terrarium fsck``, and the exit status is 1
    (cron mails it)."""
    url, place = _damaged(kind, tmp_path, request)
    later = datetime.now(UTC) + timedelta(days=40)
    monkeypatch.setattr(terrarium.lifecycle, "_now", lambda: later)
    if how == "age":
        result = invoke("archive", "--older-than", "30d", "--storage-dir", url)
    else:
        config_path().parent.mkdir(parents=True, exist_ok=True)
        config_path().write_text('[retention]\narchive_after = "30d"\n')
        result = invoke("maintain", "--storage-dir", url)
    assert result.exit_code == 1, result.output
    named = [line for line in result.stderr.splitlines() if "cli:bad" in line]
    assert len(named) == 1 and place in named[0], result.stderr
    assert HINT in result.stderr
    listed = json.loads(invoke("list", "--all", "--json", "--storage-dir", url).stdout)
    assert {row["context_id"]: row["state"] for row in listed["contexts"]} == {
        "cli:good": "archived",
        "cli:other": "archived",
        "cli:bad": "hot",
    }


def test_a_fork_whose_parent_segment_is_lost_is_damaged_not_missing(tmp_path: Path) -> None:
    """A fork's parent segment deleted by hand: ``list`` names the lost segment, ``fsck``
    reports it (and leaves it: no repair brings it back), ``show`` fails in one line naming it
    and ``terrarium fsck``, ``search`` still finds the other sessions' messages, and ``delete``
    moves it to the trash like any damaged session."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        _add(store, "cli:good", "good walrus")
        _add(store, "cli:fork", "fork walrus one", "fork two")
        head = store.get_head(ContextId.parse("cli:fork"))
        assert head is not None
        fork = fork_at(store, PodActiveSegmentRef(head.session_id, head.segment_id), 2)
        store.set_head(ContextId.parse("cli:fork"), fork, expected=head.segment_id)
        save_delta(
            store,
            store.get_head(ContextId.parse("cli:fork")),
            [{"role": "user", "content": "fork walrus three"}],
        )  # type: ignore[arg-type]
        folder = store.folder_of(ContextId.parse("cli:fork"))
    assert folder is not None
    (folder / f"{head.segment_id}.jsonl").unlink()
    lost = str(head.segment_id)
    listed = invoke("list", "--json", "--storage-dir", str(root))
    assert listed.exit_code == 0, listed.output
    rows = {row["context_id"]: row for row in json.loads(listed.stdout)["contexts"]}
    assert rows["cli:good"]["problem"] is None
    assert lost in (rows["cli:fork"]["problem"] or "")
    _one_line_error(invoke("show", "cli:fork", "--storage-dir", str(root)), lost)
    found = invoke("search", "walrus", "--json", "--storage-dir", str(root))
    assert found.exit_code == 0, found.output
    assert "cli:good" in {hit["context_id"] for hit in json.loads(found.stdout)["hits"]}
    checked = invoke("fsck", "--json", "--storage-dir", str(root))
    assert checked.exit_code == 1
    problems = json.loads(checked.stdout)["problems"]
    assert [p["context"] for p in problems if lost in p["message"]] == ["cli:fork"]
    repaired = invoke("fsck", "--repair", "--json", "--storage-dir", str(root))
    assert repaired.exit_code == 1
    assert [p["repaired"] for p in json.loads(repaired.stdout)["problems"]] == [False]
    with FsStore(root) as store:  # the head stays where it was: at the fork
        now = store.get_head(ContextId.parse("cli:fork"))
        assert now is not None and now.segment_id == fork
    deleted = invoke("delete", "cli:fork", "--storage-dir", str(root))  # was: "kept changing"
    assert deleted.exit_code == 0, deleted.output
    assert invoke("trash", "restore", "cli:fork", "--storage-dir", str(root)).exit_code == 0


def _files(store: FsStore, context: str, segment: object = None) -> tuple[Path, Path]:
    """The file of ``segment`` of ``context`` (its head's by default), and its head record."""
    head = store.get_head(ContextId.parse(context))
    folder = store.folder_of(ContextId.parse(context))
    assert head is not None and folder is not None
    return folder / f"{segment or head.segment_id}.jsonl", folder / "head.json"


def test_a_moved_store_names_its_damage_where_the_store_is_now(tmp_path: Path) -> None:
    """The derived index keeps a session's problem; a sessions folder moved (or opened through
    another path) after ``list`` cached it is named at its new place by ``list`` and ``stats``:
    a torn header line, an unreadable ``head.json``, a fork's lost parent segment."""
    old = tmp_path / "old"
    with FsStore(old) as store:
        for name in ("torn", "head", "fork"):
            _add(store, f"cli:{name}", f"{name} one", f"{name} two")
        parent = store.get_head(ContextId.parse("cli:fork"))
        assert parent is not None
        fork = fork_at(store, PodActiveSegmentRef(parent.session_id, parent.segment_id), 1)
        store.set_head(ContextId.parse("cli:fork"), fork, expected=parent.segment_id)
        lost, _ = _files(store, "cli:fork", parent.segment_id)
        torn, _ = _files(store, "cli:torn")
        _, head_json = _files(store, "cli:head")
    torn.write_bytes(b'{"v": 1, ')
    lost.unlink()
    head_json.write_text("{nope")

    def problems(root: Path) -> tuple[dict[str, str], str]:
        listed = invoke("list", "--json", "--storage-dir", str(root))
        rows = json.loads(listed.stdout)["contexts"]
        stats = invoke("stats", "--json", "--storage-dir", str(root))
        return {row["context_id"]: row["problem"] for row in rows}, stats.stderr

    before, _ = problems(old)
    assert all(str(old) in problem for problem in before.values()), before
    new = tmp_path / "new"
    old.rename(new)
    (tmp_path / "link").symlink_to(tmp_path)
    for root in (new, tmp_path / "link" / "new"):
        after, warned = problems(root)
        assert set(after) == set(before)
        for context, problem in after.items():
            assert problem == before[context].replace(str(old), str(root)), problem
            assert problem in warned, warned


def test_a_moved_sqlite_store_names_its_damage_where_the_database_is_now(tmp_path: Path) -> None:
    """A SQLite database moved with its folder (its derived index beside it) after ``list``
    cached a damaged session's problem: ``list`` names the database where it is now."""
    old = tmp_path / "old"
    old.mkdir()
    with open_store(f"sqlite:///{old / 'store.db'}") as store:
        _add(store, "cli:bad", "bad one", "bad two", "bad three")
        head = store.get_head(ContextId.parse("cli:bad"))
    assert head is not None
    with sqlite3.connect(old / "store.db") as conn:
        conn.execute(
            "UPDATE entries SET line = '{not json' WHERE seq = 2 AND seg = "
            "(SELECT id FROM segments WHERE segment_id = ?)",
            (str(head.segment_id),),
        )

    def problem(folder: Path) -> str:
        listed = invoke("list", "--json", "--storage-dir", f"sqlite:///{folder / 'store.db'}")
        [row] = json.loads(listed.stdout)["contexts"]
        return str(row["problem"])

    assert str(old / "store.db") in problem(old)
    new = tmp_path / "new"
    old.rename(new)
    moved = problem(new)
    assert str(new / "store.db") in moved and str(old) not in moved, moved


CONVERSATION = "conv_" + "a" * 26
GATEWAY_ROUTES = ["chat", "chat-stream", "conversation", "previous-response"]


def _gateway_request(route: str, previous: str | None) -> tuple[str, dict[str, Any], str]:
    """The path, body and session header of a request continuing the damaged session."""
    if route.startswith("chat"):
        message = {"role": "user", "content": "bad walrus one"}
        body = {"model": "fake-model", "messages": [message], "stream": route == "chat-stream"}
        return "/v1/chat/completions", body, "bad"
    key = "conversation" if route == "conversation" else "previous_response_id"
    return "/v1/responses", {"model": "fake-model", "input": "hi", key: previous}, ""


@pytest.mark.parametrize("route", GATEWAY_ROUTES)
@pytest.mark.parametrize("kind", BACKENDS)
def test_the_gateway_refuses_to_continue_a_damaged_session_in_one_message(
    kind: str,
    route: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A request continuing a session whose log is damaged (Chat Completions, streamed or
    not, a conversation, a previous response): 500 with one message naming the damaged line
    and ``terrarium fsck`` (code ``damaged_log``), before the model is called; a warning logged
    without a traceback, and nothing stored."""
    from starlette.testclient import TestClient

    from terrarium.gateway.app import create_app
    from terrarium.gateway.ids import response_context

    context = {"conversation": f"conv:{CONVERSATION}"}.get(route, "chat:bad")
    url, place = _damaged(kind, tmp_path, request, context=context)
    previous = CONVERSATION if route == "conversation" else None
    with FakeServer() as fake:
        if route == "previous-response":
            with (
                open_store(url) as store,
                TestClient(create_app(store, fake.base_url), base_url="http://127.0.0.1") as gw,
            ):
                made = gw.post("/v1/responses", json={"model": "fake-model", "input": "one"})
                previous = made.json()["id"]
            context = str(response_context(previous))
            place = _damage(kind, tmp_path, request, url, context)
        calls = len(fake.requests)
        path, body, session = _gateway_request(route, previous)
        with (
            open_store(url) as store,
            TestClient(create_app(store, fake.base_url), base_url="http://127.0.0.1") as client,
        ):
            head = store.get_head(ContextId.parse(context))
            assert head is not None
            before = store.next_seq(head.session_id, head.segment_id)
            answer = client.post(path, json=body, headers={"X-Session-Id": session})
        assert len(fake.requests) == calls, "the model was called"
    assert answer.status_code == 500, answer.text
    error = answer.json()["error"]
    assert error["code"] == "damaged_log" and place in error["message"], error
    assert HINT in error["message"] and "\n" not in error["message"]
    assert all(record.exc_info is None for record in caplog.records)
    assert [r.levelname for r in caplog.records if place in r.getMessage()] == ["WARNING"]
    with open_store(url) as store:
        now = store.get_head(ContextId.parse(context))
        assert now == head and store.next_seq(head.session_id, head.segment_id) == before


UNNOTICED = "an append reads no old row: a row changed in place is found by its next read"
AFTER_READ = [
    "fs",
    pytest.param("sqlite", marks=pytest.mark.xfail(strict=True, reason=UNNOTICED)),
    pytest.param(
        "postgres", marks=[pytest.mark.postgres, pytest.mark.xfail(strict=True, reason=UNNOTICED)]
    ),
]


@contextlib.contextmanager
def _served_once(url: str, route: str) -> Iterator[tuple[Any, ...]]:
    """A gateway on ``url`` that served one turn of ``route``: (the fake model, the store, the
    client, the context, the route's path, its second request, its headers)."""
    from starlette.testclient import TestClient

    from terrarium.gateway.app import create_app

    with (
        FakeServer() as fake,
        open_store(url) as store,
        TestClient(create_app(store, fake.base_url), base_url="http://127.0.0.1") as client,
    ):
        yield (fake, store, client, *_first_turn(client, route))


def _first_turn(client: Any, route: str) -> tuple[str, str, dict[str, Any], dict[str, str]]:
    """Serve one turn of a new session through the gateway; its context, and the path, body
    and headers of the next turn's request."""
    if route.startswith("chat"):
        path, headers = "/v1/chat/completions", {"X-Session-Id": "later"}
        first = {"model": "fake-model", "messages": [{"role": "user", "content": "one"}]}
        answer = client.post(path, json=first, headers=headers)
        reply = answer.json()["choices"][0]["message"]
        messages = [*first["messages"], reply, {"role": "user", "content": "two"}]
        second: dict[str, Any] = {"model": "fake-model", "messages": messages}
        context = "chat:later"
    else:
        conv = client.post("/v1/conversations", json={}).json()["id"]
        path, headers, context = "/v1/responses", {}, f"conv:{conv}"
        second = {"model": "fake-model", "input": "two", "conversation": conv}
        answer = client.post(path, json={**second, "input": "one"})
    assert answer.status_code == 200, answer.text
    return context, path, {**second, "stream": route.endswith("stream")}, headers


@pytest.mark.parametrize("route", ["chat", "conversation"])
@pytest.mark.parametrize("kind", AFTER_READ)
def test_the_gateway_refuses_to_append_to_a_session_damaged_after_it_read_it(
    kind: str, route: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A session the gateway served a turn of (its state in the gateway's memory), damaged
    before the next turn: the next turn is refused (``damaged_log``), nothing written, the
    model not called; the store's check notices, as in the chat loop."""
    url = store_url(kind, tmp_path, "sessions", request)
    with _served_once(url, route) as (fake, store, client, context, path, second, headers):
        head = store.get_head(ContextId.parse(context))
        assert head is not None
        lines = store.next_seq(head.session_id, head.segment_id)
        place = _damage(kind, tmp_path, request, url, context)
        calls = len(fake.requests)
        refused = client.post(path, json=second, headers=headers)
        assert len(fake.requests) == calls, "the model was called"
    assert refused.status_code == 500, refused.text
    error = refused.json()["error"]
    assert error["code"] == "damaged_log" and place in error["message"], error
    with open_store(url) as store:
        assert store.get_head(ContextId.parse(context)) == head
        assert store.next_seq(head.session_id, head.segment_id) == lines


@pytest.mark.parametrize("route", ["chat", "chat-stream", "conversation", "conversation-stream"])
@pytest.mark.parametrize("kind", AFTER_READ)
def test_a_session_damaged_during_the_model_call_is_not_appended_to(
    kind: str, route: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Damaged while the model answers (between the gateway's read and its append): the
    append refuses, nothing is written, and the client gets the ``damaged_log`` error (a
    stream: its error line, or ``response.failed``) naming the line."""
    url = store_url(kind, tmp_path, "sessions", request)
    places: list[str] = []
    with _served_once(url, route) as (fake, store, client, context, path, second, headers):
        head = store.get_head(ContextId.parse(context))
        assert head is not None
        lines = store.next_seq(head.session_id, head.segment_id)

        def damaging(messages: list[dict[str, Any]]) -> str:
            places.append(_damage(kind, tmp_path, request, url, context))
            return "two, answered"

        fake.reply = damaging
        answer = client.post(path, json=second, headers=headers)
    [place] = places
    if not second["stream"]:
        assert answer.status_code == 500, answer.text
        error = answer.json()["error"]
        assert error["code"] == "damaged_log" and place in error["message"], error
    else:
        last = [line for line in answer.text.splitlines() if line.startswith("data: {")][-1]
        event = json.loads(last.removeprefix("data: "))
        error = event["error"] if route == "chat-stream" else event["response"]["error"]
        assert place in error["message"] and HINT in error["message"], event
        assert route != "chat-stream" or error["code"] == "damaged_log"
    with open_store(url) as store:
        assert store.get_head(ContextId.parse(context)) == head
        assert store.next_seq(head.session_id, head.segment_id) == lines


@pytest.mark.parametrize("kind", AFTER_READ)
def test_the_chat_loop_refuses_to_append_to_a_session_damaged_after_it_read_it(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, fake_server: FakeServer
) -> None:
    """The gateway's rule is the chat loop's: a session it holds in memory, damaged before its
    next turn, is refused (CorruptLog naming the line), nothing written, the model not called."""
    from terrarium.agent.multi_context_manager import MultiContextManager
    from terrarium.errors import CorruptLog
    from terrarium.llm.vllm_client import VLLMClient

    url = store_url(kind, tmp_path, "sessions", request)

    async def turns() -> None:
        client = VLLMClient(base_url=fake_server.root_url, max_retries=0)
        async with MultiContextManager(client, url) as manager:
            await manager.process_with_context("cli:later", "one")
            head = manager.store.get_head(ContextId.parse("cli:later"))
            assert head is not None
            lines = manager.store.next_seq(head.session_id, head.segment_id)
            place = _damage(kind, tmp_path, request, url, "cli:later")
            with pytest.raises(CorruptLog, match=re.escape(place)):
                await manager.process_with_context("cli:later", "two")
            assert len(fake_server.requests) == 1
        with open_store(url) as store:
            assert store.next_seq(head.session_id, head.segment_id) == lines

    asyncio.run(turns())


@pytest.mark.parametrize("kind", BACKENDS)
def test_the_dashboard_answers_around_a_damaged_session(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The overview, the sessions list (the damaged one marked), search and /api/stats
    answer with the other sessions, /api/stats with the totals ``stats`` gives; the damaged
    session's page and /api/context say what ``fsck`` would (the line, and the hint to run
    it)."""
    from starlette.testclient import TestClient

    from terrarium.web import create_app

    url, place = _damaged(kind, tmp_path, request)
    with (
        open_store(url) as store,
        TestClient(create_app(store), base_url="http://127.0.0.1") as web,
    ):
        overview = web.get("/")
        assert overview.status_code == 200 and "cli:good" in overview.text
        listed = web.get("/sessions")
        assert listed.status_code == 200 and "cli:other" in listed.text
        assert "damaged" in listed.text
        found = web.get("/api/search", params={"q": "walrus"})
        assert found.status_code == 200
        assert {"cli:good", "cli:other"} <= {hit["context_id"] for hit in found.json()["hits"]}
        api = web.get("/api/stats").json()
        totals = json.loads(invoke("stats", "--json", "--storage-dir", url).stdout)
        figures = ("contexts", "messages", "turns", "damaged", "prompt_tokens")
        assert {k: api["totals"][k] for k in figures} == {
            **{k: totals[k] for k in figures[:4]},
            "prompt_tokens": totals["usage"]["prompt_tokens"],
        }
        assert (api["totals"]["contexts"], api["totals"]["damaged"]) == (3, 1)
        assert api["per_type"] == totals["by_type"]
        page = web.get("/session", params={"c": "cli:bad"})
        assert page.status_code == 500 and place in page.text and HINT in page.text
        api = web.get("/api/context", params={"c": "cli:bad"}).json()
        assert place in api["error"] and HINT in api["hint"]
