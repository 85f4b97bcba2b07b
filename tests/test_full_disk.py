"""A full disk (a real one: a small tmpfs filled to the last byte) under the commands and
routes around the log: what was acknowledged stays whole and readable, nothing is left half
written, and the same command or request succeeds once there is room again."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from click.testing import CliRunner

from fakeserver import FakeServer
from helpers.disk import fill, small_tmpfs
from helpers.gateway import GatewayProcess
from helpers.history import add_context
from pg import as_url, pg_database  # noqa: F401  (a fixture)
from terrarium import (
    FsStore,
    PodActiveSegmentRef,
    SqliteStore,
    create_segment,
    index,
    restore,
    save_user_input,
)
from terrarium.cli import cli
from terrarium.errors import StoreError
from terrarium.stores.url import open_store


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "disk") as folder:
        yield folder


@pytest.fixture
def pg_disk(pg_database: str) -> Iterator[tuple[str, Path]]:  # noqa: F811
    """A PostgreSQL database whose tables lie on a small tmpfs (a tablespace there), and that
    tmpfs: the server must run on this machine, as its own user, for the folder to be its.
    While it is full, no backend can write out its dirty pages, other databases' included: a
    test fills it only for a moment, and nothing else uses the server meanwhile."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    name = f"terrarium_full_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_database, autocommit=True) as admin:
        data = admin.execute("SELECT current_setting('data_directory')").fetchone()
        if data is None or not os.path.isdir(data[0]):
            pytest.skip("the PostgreSQL server is not on this machine: no tablespace here")
        owner = os.stat(data[0])
        with (
            tempfile.TemporaryDirectory(dir="/tmp") as place,  # not under tmp_path: 0700
            small_tmpfs(Path(place) / "disk") as folder,
        ):
            os.chmod(place, 0o711)  # the server reaches the tablespace through it
            os.chown(folder, owner.st_uid, owner.st_gid)
            admin.execute(f"CREATE TABLESPACE {name} LOCATION '{folder}'")
            try:
                admin.execute(f'CREATE DATABASE "{name}" TABLESPACE {name}')
                yield as_url(make_conninfo(pg_database, dbname=name)), folder
            finally:  # room first: the server cannot drop it while its dirty pages cannot land
                (folder / "filler").unlink(missing_ok=True)
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                admin.execute(f"DROP TABLESPACE IF EXISTS {name}")


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.output


def test_an_export_to_a_full_disk_leaves_the_old_file_whole(tmp_path: Path, disk: Path) -> None:
    """``export -o FILE`` on a full disk fails in one line naming the file, and leaves the
    file it would replace as it was (not truncated), and no new file half written."""
    storage = tmp_path / "sessions"
    with FsStore(storage) as store:
        add_context(store, "cli:a", *[f"line {n} " + "x" * 200 for n in range(40)])
    old = disk / "a.jsonl"
    assert _run("--storage-dir", str(storage), "export", "cli:a", "-o", str(old))[0] == 0
    before = old.read_bytes()
    with FsStore(storage) as store:
        add_context(store, "cli:b", *[f"more {n} " + "y" * 400 for n in range(40)])
    filler = fill(disk)
    for target, kept in ((old, before), (disk / "new.jsonl", None)):
        code, output = _run("--storage-dir", str(storage), "export", "cli:b", "-o", str(target))
        assert code == 1 and "No space left on device" in output and target.name in output
        assert len(output.strip().splitlines()) == 1
        assert (target.read_bytes() if target.exists() else None) == kept
    assert sorted(p.name for p in disk.iterdir()) == ["a.jsonl", "filler"]
    filler.unlink()
    assert _run("--storage-dir", str(storage), "export", "cli:b", "-o", str(old))[0] == 0
    assert old.read_bytes().count(b"more") == 40


def test_a_stream_the_gateway_cannot_store_ends_in_an_error_event(disk: Path) -> None:
    """A streamed turn that a full disk keeps from being stored ends in ``response.failed``
    (a Chat Completions stream: an error line), not in a cut connection; nothing was
    acknowledged, what was stays readable, and the next request on it works once there is
    room."""
    with FakeServer() as fake, GatewayProcess(disk / "sessions", fake.base_url) as gateway:
        with openai.OpenAI(base_url=gateway.url, api_key="x", max_retries=0) as client:
            first = client.responses.create(model="fake-model", input="kept")
            filler = fill(disk)
            big = "z" * 20_000
            with client.responses.create(
                model="fake-model", input=big, previous_response_id=first.id, stream=True
            ) as stream:
                last = list(stream)[-1]
            assert last.type == "response.failed" and last.response.error is not None
            assert "disk is full" in last.response.error.message
            chat = {
                "model": "fake-model",
                "stream": True,
                "messages": [{"role": "user", "content": big}],
            }
            with httpx.stream(
                "POST", f"{gateway.url}/chat/completions", json=chat, headers={"X-Session-Id": "s"}
            ) as answer:
                lines = [line for line in answer.iter_lines() if line]
            error = json.loads(lines[-1][6:])["error"]["message"]
            assert error.startswith("the turn could not be stored") and "space" in error
            filler.unlink()
            assert client.responses.retrieve(first.id).output_text == "echo: kept"
            after = client.responses.create(
                model="fake-model", input="room", previous_response_id=first.id
            )
            assert after.output_text == "echo: room"
            assert [m["content"] for m in fake.last_request["messages"]] == [
                "kept",
                "echo: kept",
                "room",
            ]


@pytest.mark.parametrize("store", ["sessions", "sqlite://{disk}/s.db", "postgres"])
def test_a_turn_the_gateway_cannot_store_is_a_507(
    request: pytest.FixtureRequest, tmp_path: Path, store: str
) -> None:
    """A turn that a full disk keeps from being stored, not streamed, is answered 507
    Insufficient Storage (not 500) with an OpenAI-shaped error body, on a folder store (an
    OSError), a SQLite one (a StoreError) and a PostgreSQL one (the server's disk full); the
    same request works once there is room."""
    if store == "postgres":
        where, disk = request.getfixturevalue("pg_disk")
    else:
        disk = request.getfixturevalue("disk")
        where = store.format(disk=disk) if "://" in store else str(disk / store)
    with FakeServer() as fake, GatewayProcess(where, fake.base_url) as gateway:
        big, headers = secrets.token_hex(10_000), {"X-Session-Id": "s"}  # no compression
        chat = {"model": "fake-model", "messages": [{"role": "user", "content": big}]}
        turn = {"model": "fake-model", "input": big}
        requests = [("responses", turn), ("chat/completions", chat)]
        first = httpx.post(f"{gateway.url}/responses", json={"model": "fake-model", "input": "hi"})
        assert first.status_code == 200
        filler = fill(disk)
        for path, body in requests:
            answer = httpx.post(f"{gateway.url}/{path}", json=body, headers=headers, timeout=30)
            assert answer.status_code == 507, (path, answer.text)
            error = answer.json()["error"]
            assert set(error) == {"message", "type", "param", "code"}
            assert error["type"] == "server_error" and "disk is full" in error["message"], error
        filler.unlink()
        for path, body in requests:
            answer = httpx.post(f"{gateway.url}/{path}", json=body, headers=headers, timeout=30)
            assert answer.status_code == 200, (path, answer.text)


def test_a_reindex_stopped_by_a_full_disk_leaves_nothing_behind(disk: Path) -> None:
    """``reindex`` on a full disk fails and leaves no half-built index folder; the index in
    use is untouched, and the rerun with room rebuilds it."""
    storage = disk / "sessions"
    with FsStore(storage) as store:
        for n in range(30):
            add_context(store, f"cli:s{n}", f"hello {n}")
    filler = fill(disk)
    code, _ = _run("--storage-dir", str(storage), "reindex")
    assert code == 1
    assert sorted(p.name for p in (storage / ".index").iterdir() if p.name.startswith("new-")) == []
    filler.unlink()
    assert _run("--storage-dir", str(storage), "reindex")[0] == 0
    with FsStore(storage) as store:
        assert len(store.list_contexts()) == 30


@pytest.mark.parametrize("built", [False, True])
def test_a_sqlite_reindex_on_a_full_disk_says_so_in_one_line(disk: Path, built: bool) -> None:
    """``reindex`` of a SQLite store on a full disk names the index file it could not write
    and the full disk, once: not the store's URL before it, not a schema version (an index a
    full disk kept from being built has none), not "read-only"; with room it rebuilds."""
    db = disk / "s.db"
    with SqliteStore(db) as store:
        for n in range(30):
            add_context(store, f"cli:s{n}", f"hello {n}")
        if built:
            index.reindex(store)
    filler = fill(disk)
    code, output = _run("--storage-dir", f"sqlite://{db}", "reindex")
    assert code == 1 and output.startswith(f"Error: {db}.search.db: disk full (")
    assert output.count("\n") == 1 and "schema" not in output and "read-only" not in output
    filler.unlink()
    assert _run("--storage-dir", f"sqlite://{db}", "reindex")[0] == 0


def test_a_full_disk_under_the_store_names_the_store(disk: Path, fake_server: FakeServer) -> None:
    """A command whose store write a full disk stops says so in one line naming the store
    (the kernel's error names no file), not a bare ``No space left on device``; a full disk
    under the command's output (stdout redirected into a file there) is not blamed on it."""
    storage = disk / "sessions"
    with FsStore(storage) as store:
        for n in range(4):
            add_context(store, f"cli:s{n}", *[f"line {k} " + "x" * 300 for k in range(8)])
    filler = fill(disk)
    fake_server.reply = "SUMMARY: short"
    url = ["--base-url", fake_server.base_url]
    for args in (
        ["reindex"],
        ["clear", "cli:s0"],
        ["rewind", "cli:s0"],
        ["fork", "cli:s0", "cli:new"],
        ["delete", "cli:s1"],
        ["pin", "cli:s2"],
        ["compact", "cli:s3", *url],
    ):
        code, output = _run("--storage-dir", str(storage), *args)
        assert (code, output) == (1, f"Error: {storage}: No space left on device\n"), args
    filler.unlink()
    with FsStore(storage) as store:
        add_context(store, "cli:big", "y" * 200_000)
    filler = fill(disk)
    with open(disk / "filler", "ab") as out:  # the shown session goes into the full file
        shown = subprocess.run(
            [sys.executable, "-m", "terrarium", "--storage-dir", str(storage), "show", "cli:big"],
            stdout=out,
            stderr=subprocess.PIPE,
            check=False,
            timeout=60,
        )
    assert shown.returncode == 1
    assert shown.stderr == b"Error: No space left on device\n"
    filler.unlink()
    assert _run("--storage-dir", str(storage), "pin", "cli:s2")[0] == 0


def test_appends_on_a_full_postgresql_disk_lose_nothing_acknowledged(
    pg_disk: tuple[str, Path],
) -> None:
    """On a PostgreSQL server whose disk fills, an append that cannot be stored is a one-line
    StoreError naming the store; every append acknowledged before it reads back whole, and
    the next append, once there is room, takes the next seq."""
    url, disk = pg_disk
    with open_store(url) as store:
        session_id, segment_id = create_segment(store, context="cli:full")
        ref = PodActiveSegmentRef(session_id, segment_id)
        kept = [secrets.token_hex(500) for _ in range(5)]
        for text in kept:
            save_user_input(store, ref, text)
        filler = fill(disk)
        with pytest.raises(StoreError) as refused:
            for _ in range(200):  # past what the last pages have room for
                save_user_input(store, ref, secrets.token_hex(2_000))
        assert "\n" not in str(refused.value) and "No space left" in str(refused.value)
        filler.unlink()
        save_user_input(store, ref, "after")
        history = [item["content"] for item in restore(store, "cli:full").history]
    assert history[:5] == kept and history[-1] == "after"
    assert all(len(text) == 4_000 for text in history[5:-1])  # whole, or not there at all
