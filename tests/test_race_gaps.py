"""The data-moving entry points ``test_lifecycle_race.py`` does not race, racing each other and
the lifecycle commands in other processes, with no fault injected.

* ``migrate`` (flat legacy files into date folders; ``--to-log``) against itself, ``import`` of
  the same legacy files, deletes, archives, unarchives and the first write of a turn (which
  imports a context's legacy file) on a filesystem store, the only one with legacy files.
* The Agents SDK and LangGraph adapters and ``terrarium gateway`` (its item, response and
  conversation deletes too), each in a process of its own, while another process archives,
  deletes, restores and purges their contexts.
* ``terrarium copy`` of one session as a context's and, from another store, as a detached
  session, at once (``tests/helpers/copy_race_child.py``: their trace writes meet): one lock.

Each worker is ``tests/helpers/gaps_child.py``. Afterwards no call failed (but for a context,
file or trash entry another worker had just moved or deleted), a context whose delete was
acknowledged never comes back, every other context is in one place with its whole history and
every item a worker was told was added, once, and ``fsck`` finds nothing. Deterministic tests
pin what the races found. The default run is a few calls a worker; ``slow`` runs 200, the
adapters and the gateway on every backend.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner

from fakeserver import FakeServer
from helpers.gateway import GatewayProcess
from helpers.legacy_tree import legacy_texts, outside_trash, write_legacy
from helpers.procs import records_of
from helpers.race_child import fsck, open_spec
from pg import empty_default_schema, own_database, pg_database  # noqa: F401  (a fixture)
from terrarium import ContextId, FsStore, contexts, legacy, lifecycle, sessions, states
from terrarium.cli import cli
from terrarium.formats import terrarium_json as tj
from terrarium.migrate import migrate
from terrarium.model import SessionId, item_text
from terrarium.stores.base import Lifecycle, Store
from terrarium.stores.url import open_store

CHILD = Path(__file__).with_name("helpers") / "gaps_child.py"


def run_workers(
    spec: dict[str, Any], tmp_path: Path, weights: list[dict[str, int]], ops: int
) -> list[dict[str, Any]]:
    """Run one worker per entry of ``weights`` to the end; every record they wrote."""
    procs = []
    for worker, mine in enumerate(weights):
        out = tmp_path / f"worker-{worker}.jsonl"
        args = {**spec, "seed": worker, "ops": ops, "weights": mine, "out": str(out)}
        procs.append((subprocess.Popen([sys.executable, str(CHILD), json.dumps(args)]), out))
    return records_of(procs)


def failed(records: list[dict[str, Any]]) -> dict[str, str]:
    """Every failed call: its error, and where it was raised."""
    return {
        f"{r['op']} {r.get('context')}: {r['error'][:300]}": r["where"]
        for r in records
        if not r["ok"]
    }


# ----------------------------------------------------------------------------- legacy files

KEPT = [f"cli:k{i}" for i in range(9)]
DOOMED = [f"cli:d{i}" for i in range(9)]


def check_legacy(root: Path, records: list[dict[str, Any]]) -> None:
    deleted = {r["context"] for r in records if r["ok"] and r.get("deleted")}
    appended = Counter((r["context"], r["text"]) for r in records if r["ok"] and r.get("appended"))
    with FsStore(root) as store:
        assert fsck(store, repair=False) == []
        files = outside_trash(root)
        archived = {a.context for a in states.archived_contexts(store)}
        listed = Counter(row.context for row in contexts.list_contexts(store).rows)
        for name in KEPT + DOOMED:
            live = store.get_head(ContextId.parse(name)) is not None
            if name in deleted:
                assert not live and not files[name], f"{name} came back after its delete"
                continue
            assert live or files[name], f"{name} lost"
            assert listed[name] == (name not in archived), (name, listed[name])
            if name in archived:
                assert not files[name], f"{name} archived, and a legacy file of it is out"
        for entry in states.trashed_contexts(store):
            assert entry.context in deleted, entry
        for name in archived:
            states.unarchive_context(store, ContextId.parse(name))
    report = migrate(root, to_log=True, out=io.StringIO())
    assert report.failures == []
    with FsStore(root) as store:
        files = outside_trash(root)
        for name in set(KEPT + DOOMED) - deleted:
            context = ContextId.parse(name)
            history = [str(i["content"]) for i in sessions.restore(store, context).history]
            assert history[:3] == legacy_texts(name), name
            sent = sorted(t for (c, t), n in appended.items() if c == name for _ in range(n))
            assert sorted(history[3:]) == sent, name
            assert files[name] == 1, (name, files[name])
            place = legacy.find(store, context)
            assert place is not None and len(place.relative_to(root).parts) == 3, place


class DeletingOut(io.StringIO):
    """Progress output that deletes ``names`` (as another process would) at its first line."""

    def __init__(self, root: Path, names: list[str]) -> None:
        super().__init__()
        self.root, self.names = root, names

    def write(self, text: str) -> int:
        names, self.names = self.names, []
        with FsStore(self.root) as other:
            for name in names:
                assert lifecycle.delete_context(other, ContextId.parse(name), why="test")
        return super().write(text)


def test_a_context_deleted_while_migrate_runs_is_neither_moved_nor_imported_back(
    tmp_path: Path,
) -> None:
    """``migrate --to-log`` plans every file first: a context deleted after the plan (its legacy
    file moved into the trash) is skipped, not brought back into the log from the plan's copy
    nor written back into its date folder, and the run does not fail."""
    root = tmp_path / "sessions"
    write_legacy(root, KEPT + DOOMED)  # k0 flat, k1 top-level, k2 dated, ...
    out = DeletingOut(root, ["cli:k3", "cli:k4", "cli:k5"])  # flat, top-level, dated
    report = migrate(root, to_log=True, out=out)
    files = outside_trash(root)
    with FsStore(root) as store:
        for name in ("cli:k3", "cli:k4", "cli:k5"):
            assert store.get_head(ContextId.parse(name)) is None, f"{name} came back"
            assert not files[name], name
        assert store.get_head(ContextId.parse("cli:k6")) is not None
    assert report.failures == []
    assert out.getvalue().count("gone meanwhile") == 3


def test_an_archive_keeps_a_migration_of_its_legacy_file_waiting(tmp_path: Path) -> None:
    """An archive takes a context's legacy files with it under the context's lock, which a
    migration moves each file under: one that comes while the archive runs waits for it, and
    finds the file gone with its context (before, the archive failed on the moved file, or
    left the moved copy out beside the archived context)."""
    root = tmp_path / "sessions"
    write_legacy(root, KEPT + DOOMED)
    context = ContextId.parse("cli:k0")  # a flat file, in the log too
    with FsStore(root) as store:
        legacy.resume(store, context)
        real = legacy.files
        migrating: list[threading.Thread] = []

        def files_then_migrate(store: Any, context: ContextId) -> list[Path]:
            found = real(store, context)
            thread = threading.Thread(target=migrate, args=(root,), kwargs={"out": io.StringIO()})
            thread.start()
            thread.join(0.3)  # the migration moves the file now, unless it waits
            migrating.append(thread)
            return found

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(legacy, "files", files_then_migrate)
            assert lifecycle.archive_context(store, context) is not None
        migrating[0].join()
        assert states.is_archived(store, context)
        assert not outside_trash(root)["cli:k0"]
        assert states.unarchive_context(store, context)
    assert outside_trash(root)["cli:k0"] == 1
    assert not migrate(root, out=io.StringIO()).failures


def test_an_import_of_a_legacy_file_deleted_meanwhile_brings_nothing_back(
    tmp_path: Path,
) -> None:
    """``terrarium import FILE`` of a store's own legacy file reads it, then creates its
    context under the context's lock if the file is still there: a delete between the two
    leaves the context deleted (the import fails, naming the file gone)."""
    from terrarium.cli import cli

    root = tmp_path / "sessions"
    write_legacy(root, KEPT + DOOMED)
    real = tj.load

    def load_then_delete(path: Any, **kwargs: Any) -> Any:
        session = real(path, **kwargs)
        patch.setattr(tj, "load", real)  # once: the delete reads the file too
        with FsStore(root) as other:
            assert lifecycle.delete_context(other, ContextId.parse("cli:k0"), why="test")
        return session

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tj, "load", load_then_delete)
        result = CliRunner().invoke(
            cli, ["import", str(root / "cli" / "k0.json"), "--storage-dir", str(root)]
        )
    assert result.exit_code == 1, result.output
    assert "k0.json: deleted or moved meanwhile" in result.output
    with FsStore(root) as store:
        assert store.get_head(ContextId.parse("cli:k0")) is None


LEGACY_WEIGHTS = [
    {"migrate": 3, "migrate_log": 3, "resume": 4, "delete": 1},
    {"migrate_log": 3, "import": 4, "archive": 2, "delete": 1},
    {"delete": 3, "archive": 3, "unarchive": 3, "resume": 3},
    {"migrate": 2, "import": 3, "resume": 3, "unarchive": 2, "delete": 1},
]


def legacy_race(tmp_path: Path, ops: int) -> None:
    root = tmp_path / "sessions"
    write_legacy(root, KEPT + DOOMED)
    spec = {"kind": "fs", "where": str(root), "kept": KEPT, "doomed": DOOMED}
    records = run_workers(spec, tmp_path, LEGACY_WEIGHTS, ops)
    check_legacy(root, records)
    assert failed(records) == {}


def test_migrate_racing_itself_imports_deletes_and_archives_loses_nothing(tmp_path: Path) -> None:
    """Four processes migrating a store's legacy files (into date folders, into the log),
    importing them, deleting, archiving, unarchiving and writing to their contexts at once: no
    call fails, no deleted context comes back, every other one is whole, once."""
    legacy_race(tmp_path, ops=12)


@pytest.mark.slow
def test_migrate_racing_long(tmp_path: Path) -> None:
    """The same race, 200 calls a worker."""
    legacy_race(tmp_path, ops=200)


# ------------------------------------------------------------- the adapters and the gateway

AGENTS = [f"agents:a{i}" for i in range(4)]
GRAPH = [f"langgraph:t{i}" for i in range(4)]
EDGE_WEIGHTS = [  # each adapter in a process of its own: the SDKs take long to import
    {"agents_add": 6, "agents_pop": 2, "agents_clear": 1, "agents_get": 2},
    {"graph_put": 5, "graph_writes": 3, "graph_get": 2, "graph_delete": 1},
    {"gw_add": 5, "gw_get": 1, "gw_drop": 2, "gw_respond": 3, "gw_unrespond": 1, "gw_delete": 1},
    {"archive": 3, "unarchive": 3, "delete": 3, "restore": 4, "purge": 1, "purge_context": 1},
]


def seed_edges(store: Store, client: httpx.Client) -> list[str]:
    """A first item in each Agents SDK session (as the adapter writes it: no framework imported
    here), and four conversations through the gateway; the conversations' contexts. The
    LangGraph worker makes its threads."""
    for name in AGENTS:
        head = sessions.create_or_join(store, ContextId.parse(name))
        sessions.save_delta(store, head, [{"role": "user", "content": f"first of {name}"}])
    convs = []
    for number in range(4):
        item = {"type": "message", "role": "user", "content": f"first of {number}"}
        answer = client.post("/conversations", json={"items": [item]})
        convs.append(f"conv:{answer.json()['id']}")
    return convs


def trees(store: Store, name: str) -> list[SessionId]:
    """The sessions that hold or held ``name``: its live one, and those in the trash."""
    assert isinstance(store, Lifecycle)
    head = store.get_head(ContextId.parse(name))
    found = [head.session_id] if head is not None else []
    for record in store.session_records():
        if record.owner is None and (record.state.get("trashed") or {}).get("context") == name:
            found.append(record.session_id)
    return found


def item_texts(store: Store, session_id: SessionId) -> Counter[str]:
    """The text of every item logged in an entry anywhere in the session's tree."""
    found: Counter[str] = Counter()
    for segment in store.list_segments(session_id):
        for line in store.read_segment(session_id, segment).entries:
            if isinstance(line.get("item"), dict):
                found[item_text(line["item"])] += 1
    return found


def check_added(store: Store, records: list[dict[str, Any]], kept: list[str]) -> None:
    """Every acknowledged ``add_items`` and gateway item once in its context's trees (live
    and in the trash: nothing purges these contexts)."""
    for name in kept:
        found: Counter[str] = Counter()
        for session_id in trees(store, name):
            found.update(item_texts(store, session_id))
        for sent in records:
            added = sent["op"] == "agents_add" or (sent["op"] == "gw_add" and not sent["gone"])
            if sent["ok"] and added and sent["context"] == name:
                assert found[sent["text"]] == 1, sent


def check_reads(client: httpx.Client, store: Store, records: list[dict[str, Any]]) -> None:
    """Each conversation's items through the gateway are its restored history; every Agents
    SDK session and LangGraph thread reads; every deleted response stays deleted."""
    from terrarium.integrations.langgraph import TerrariumSaver

    for name in AGENTS:
        if (head := store.get_head(ContextId.parse(name))) is not None:
            assert sessions.restore(store, name).segment_id == head.segment_id, name
    saver = TerrariumSaver(store)
    for name in GRAPH:
        thread: Any = {"configurable": {"thread_id": name.partition(":")[2], "checkpoint_ns": ""}}
        found = saver.get_tuple(thread)
        assert (found is None) == (store.get_head(ContextId.parse(name)) is None), name
    for head in store.list_contexts("conv"):
        context = ContextId.parse(head.context)
        query = {"limit": 100, "order": "asc"}
        answer = client.get(f"/conversations/{context.name}/items", params=query)
        assert answer.status_code == 200, answer.text
        shown = [item_text(item) for item in answer.json()["data"]]
        assert shown == [item_text(i) for i in sessions.restore(store, context).model_history]
    for gone in (r for r in records if r["ok"] and r["op"] == "gw_unrespond"):
        if gone.get("status") == 200:
            assert client.get(f"/responses/{gone['response']}").status_code == 404, gone


def gateway_storage(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, Any]:
    """The gateway's ``--storage-dir`` and the workers' spec of the same store."""
    if kind == "fs":
        return str(tmp_path / "sessions"), {"kind": kind, "where": str(tmp_path / "sessions")}
    if kind == "sqlite":
        return f"sqlite:///{tmp_path / 'gw.db'}", {"kind": kind, "where": str(tmp_path / "gw.db")}
    url = empty_default_schema(request.getfixturevalue("pg_own"))
    return url, {"kind": kind, "where": url, "schema": "terrarium"}


@pytest.fixture(scope="module")
def pg_own(pg_database: str) -> Iterator[str]:  # noqa: F811
    """A database of this module's own (the gateway's store is its default schema)."""
    yield from own_database(pg_database)


def edges_race(kind: str, tmp_path: Path, request: pytest.FixtureRequest, ops: int) -> None:
    storage, spec = gateway_storage(kind, tmp_path, request)
    with (
        FakeServer() as fake,
        GatewayProcess(storage, fake.base_url) as gw,
        httpx.Client(base_url=gw.url, timeout=60) as client,
    ):
        with open_spec(spec) as store:
            convs = seed_edges(store, client)
        kept = [*AGENTS[:2], *GRAPH[:2], *convs[:2]]
        spec.update(url=gw.url, kept=kept, doomed=[*AGENTS[2:], *GRAPH[2:], *convs[2:]])
        records = run_workers(spec, tmp_path, EDGE_WEIGHTS, ops)
        assert failed(records) == {}
        with open_spec(spec) as store:
            assert fsck(store, repair=False) == []
            check_added(store, records, kept)
            check_reads(client, store, records)


def test_the_adapters_and_the_gateway_racing_lifecycle_commands_lose_nothing(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The Agents SDK's add, pop, clear and get, LangGraph's put, writes, get and
    delete_thread, and the gateway's item adds, item deletes, responses, response deletes and
    conversation deletes, each in a process of its own, while a fourth archives, deletes,
    restores and purges the same contexts: no call fails (a request may find its conversation
    deleted: 404), no acknowledged item is lost or doubled, every read agrees with the log."""
    edges_race("fs", tmp_path, request, ops=8)


@pytest.mark.slow
@pytest.mark.parametrize(
    "kind", ["fs", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_the_adapters_and_the_gateway_racing_long(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same race on every backend, 200 calls a worker."""
    edges_race(kind, tmp_path, request, ops=200)


# ----------------------------------------------------------------------------- copies

COPY_CHILD = Path(__file__).with_name("helpers") / "copy_race_child.py"


def _copy_sources(tmp_path: Path) -> tuple[Path, Path, SessionId]:
    """A store where one session is ``cli:a``'s, with a trace, and one where the same session
    is detached (what an interrupted copy of it leaves, or a gateway's store)."""
    from terrarium import PodActiveSegmentRef, TraceEntry, create_segment, save_trace
    from terrarium.copy import SessionSource, complete_session, read_source

    owned, loose = tmp_path / "owned", tmp_path / "loose"
    with FsStore(owned) as src:
        session_id, root = create_segment(src, context="cli:a")
        ref = PodActiveSegmentRef(session_id, root)
        for n in range(3):
            sessions.save_user_input(src, ref, f"message {n}")
        stamp = "2026-01-01T00:00:00.000000Z"
        save_trace(src, ref, [TraceEntry(stamp, "chunk", {"n": n}) for n in range(5)])
        whole = read_source(src, "cli:a")
    with FsStore(loose) as other:
        complete_session(other, SessionSource(whole.segments, traces=whole.traces))
    return owned, loose, session_id


@pytest.mark.parametrize(
    "kind", ["fs", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_copy_of_a_session_as_a_context_and_as_a_detached_session_at_once_writes_it_once(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``terrarium copy -c cli:a`` from one store and ``terrarium copy`` of another, where the
    same session is detached, into one destination at once (two processes, their trace
    writes held to meet): the copies take turns under one lock, so the trace is written
    once, the session ends as ``cli:a``'s, and a rerun finds it all there (before, the two
    took different locks, both wrote the trace, and every later copy was a conflict). No lock
    file is made per session."""
    owned, loose, session_id = _copy_sources(tmp_path)
    if kind == "fs":
        dst = str(tmp_path / "dst")
    elif kind == "sqlite":
        dst = f"sqlite:///{tmp_path / 'dst.db'}"
    else:
        dst = empty_default_schema(request.getfixturevalue("pg_own"))
    meet = tmp_path / "meet"
    meet.mkdir()
    argvs = [["copy", str(owned), dst, "-c", "cli:a"], ["copy", str(loose), dst]]
    procs = [
        subprocess.Popen([sys.executable, str(COPY_CHILD), str(meet), *argv], text=True)
        for argv in argvs
    ]
    assert [proc.wait(timeout=120) for proc in procs] == [0, 0]
    again = CliRunner().invoke(cli, ["copy", str(owned), dst, "-c", "cli:a"])
    assert again.exit_code == 0 and "nothing to copy" in again.output, again.output
    with FsStore(owned) as src, open_store(dst, create=False) as store:
        head = store.get_head(ContextId("cli", "a"))
        assert head is not None and head.session_id == session_id
        for segment in src.list_segments(session_id):
            assert store.read_trace(session_id, segment) == src.read_trace(session_id, segment)
    if kind != "postgres":
        place = tmp_path / "dst" / ".locks" / "turn" if kind == "fs" else tmp_path / "dst.db-locks"
        assert str(session_id) not in {path.name for path in place.rglob("*")}
