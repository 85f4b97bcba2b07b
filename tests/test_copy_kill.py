"""SIGKILL (or a full disk) at every step of ``terrarium copy`` and ``terrarium import``.

Each command runs in a forked child (``tests/helpers/copy_child.py``) that dies just before its
n-th write to the destination: a file change of a filesystem destination, a call of a writing
method (one transaction) of a SQLite or PostgreSQL one. Then the command is run again, as a
user would: it must exit 0 and leave the destination equal to the source (every session, its
segments, lines, traces, head, archived state and pin), and a third run must find every
session already there. The default run kills at a few points per destination; the ``slow``
run at every one. A full disk (every write failing with ENOSPC from some point on) is the
same test on a filesystem destination, whose writes can fail one by one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from helpers.copies import fill, snapshot
from pg import empty_default_schema, own_database, pg_database  # noqa: F401  (a fixture)
from terrarium import FsStore, SqliteStore, states
from terrarium.cli import cli
from terrarium.errors import StoreNotFound
from terrarium.formats import jsonl
from terrarium.stores.url import open_store

CHILD = Path(__file__).parent / "helpers" / "copy_child.py"
SQLITE = "terrarium.stores.sqlite:SqliteStore"
POSTGRES = "terrarium.stores.postgres:PostgresStore"


class Server:
    """``copy_child.py``: one forked, killable ``terrarium`` command per request."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def run(self, **request: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        answer: dict[str, Any] = json.loads(self.proc.stdout.readline())
        return answer

    def close(self) -> None:
        self.proc.communicate(timeout=30)


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    child = Server()
    try:
        yield child
    finally:
        child.close()


#: The sources: 8 sessions of every shape, 2 archived, a blob (a few kill points each); and
#: the smallest that still has every step (a kill at every one of its points).
MANY: dict[str, Any] = {"count": 8, "archived": 2, "big": True}
FEW: dict[str, Any] = {"count": 4, "archived": 1, "big": True, "shapes": (2, 4, 3, 0)}


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], str]:
    """Each source in a folder (for database destinations) and in SQLite (for a folder
    destination, so that only the destination writes files), by (size, backend)."""
    base = tmp_path_factory.mktemp("sources")
    found = {}
    for size, shape in (("many", MANY), ("few", FEW)):
        with FsStore(base / size) as store:
            fill(store, **shape)
        with SqliteStore(base / f"{size}.db") as store:
            fill(store, **shape)
        found[size, "fs"] = str(base / size)
        found[size, "sqlite"] = f"sqlite:///{base / f'{size}.db'}"
    return found


@pytest.fixture(scope="module")
def exports(
    sources: dict[tuple[str, str], str], tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[str]]:
    """Every context of each source exported to a ``.jsonl`` file, by size: what the import
    tests import (a forked session exports its head's lineage: the parents' prefixes, then
    the head)."""
    files: dict[str, list[str]] = {}
    for size in ("many", "few"):
        folder = tmp_path_factory.mktemp(f"exports-{size}")
        store = open_store(sources[size, "sqlite"], create=False)
        try:
            archived = [a.context for a in states.archived_contexts(store)]
            for number, ctx in enumerate([*(h.context for h in store.list_contexts()), *archived]):
                path = folder / f"{number:02}.jsonl"
                path.write_text(jsonl.export_context(store, ctx), encoding="utf-8")
                files.setdefault(size, []).append(str(path))
        finally:
            store.close()
    return files


@pytest.fixture(scope="module")
def pg_server(pg_database: str) -> Iterator[str]:  # noqa: F811
    """A database of this module's own: the CLI's PostgreSQL store uses the default schema."""
    yield from own_database(pg_database)


Destination = Callable[[str], str]
"""Makes an empty destination named after a round; returns its URL."""


def _destination(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Destination:
    if kind == "fs":
        return lambda name: str(tmp_path / f"dst-{name}")
    if kind == "sqlite":
        return lambda name: f"sqlite:///{tmp_path / f'dst-{name}.db'}"
    dsn = request.getfixturevalue("pg_server")
    return lambda name: empty_default_schema(dsn)


#: destination kind -> (the source to copy from, what counts as one write)
CASES = {"fs": ("sqlite", "files"), "sqlite": ("fs", SQLITE), "postgres": ("fs", POSTGRES)}
KINDS = [
    pytest.param(kind, marks=[pytest.mark.postgres] if kind == "postgres" else []) for kind in CASES
]


def _open(url: str) -> Any:
    return open_store(url, create=False)


def _same(src: str, dst: str) -> None:
    """``dst`` holds what ``src`` holds: every session, segment, line, trace, head, state."""
    a, b = _open(src), _open(dst)
    try:
        expected, found = snapshot(a), snapshot(b)
    finally:
        a.close()
        b.close()
    assert sorted(found) == sorted(expected)
    for name in expected:
        assert found[name] == expected[name], name


def _imported(files: list[str], dst: str) -> None:
    """``dst`` holds each file's context, exporting the file's lines again, and nothing else."""
    store = _open(dst)
    try:
        wanted = {}
        for file in files:
            lines = jsonl.parse_lines(Path(file).read_bytes())
            headers = [line for line in lines if line["kind"] == "header" and line.get("context")]
            wanted[headers[-1]["context"]] = lines
        assert sorted(h.context for h in store.list_contexts()) == sorted(wanted)
        for context, lines in wanted.items():
            assert jsonl.lineage_lines(store, context) == lines, context
    finally:
        store.close()


def _run(*argv: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, list(argv))
    return result.exit_code, result.output


def _points(total: int, every: int) -> list[int]:
    """Every ``every``-th write (and the last); 0: five spread over the run."""
    if every:
        return sorted({*range(1, total + 1, every), total})
    return sorted({1, total // 3, total // 2, 2 * total // 3, total} - {0})


@dataclass
class Case:
    """One command against one kind of destination, and what "done" means for it."""

    argv: Callable[[str], list[str]]
    fresh: Destination
    count: str
    check: Callable[[str], None]
    already: str
    """How the output of a run that finds everything there begins."""


def _copy_case(kind: str, src: str, tmp_path: Path, request: Any) -> Case:
    count = CASES[kind][1]
    store = _open(src)
    try:
        sessions = len(snapshot(store))
    finally:
        store.close()
    return Case(
        lambda dst: ["copy", src, dst],
        _destination(kind, tmp_path, request),
        count,
        lambda dst: _same(src, dst),
        f"nothing to copy: {sessions} sessions already in ",
    )


def _import_case(kind: str, files: list[str], tmp_path: Path, request: Any) -> Case:
    return Case(
        lambda dst: ["import", *files, "--storage-dir", dst],
        _destination(kind, tmp_path, request),
        CASES[kind][1],
        lambda dst: _imported(files, dst),
        f"nothing to import: {len(files)} sessions already in ",
    )


def _rounds(server: Server, case: Case, *, every: int, full: bool = False) -> tuple[int, int]:
    """Stop the command at each chosen write, rerun it, check; return (rounds, completions:
    rounds whose stop left the destination incomplete, which the rerun completed)."""
    first = case.fresh(f"counted-{full}")
    done = server.run(argv=case.argv(first), kill=0, count=case.count)
    assert done["exit"] == 0 and not done["killed"], done
    case.check(first)
    total = done["writes"]
    assert total > 10, total
    rounds = completed = 0
    for point in _points(total, every):
        dst = case.fresh(f"{point}-{full}")
        answer = server.run(argv=case.argv(dst), kill=point, count=case.count, full=full)
        assert answer["killed"] != full and answer["exit"] in (None, 0, 1), (point, answer)
        rounds += 1
        try:
            case.check(dst)
        except (AssertionError, StoreNotFound):
            completed += 1  # the stop left it incomplete: the rerun must complete it
        code, output = _run(*case.argv(dst))
        assert code == 0, (point, output)
        case.check(dst)
        code, output = _run(*case.argv(dst))
        assert code == 0 and output.startswith(case.already), (point, output)
    return rounds, completed


def _figures(what: str, kind: str, rounds: int, completed: int) -> None:
    """The figures of a run, for ``pytest -s`` (docs/cli.md says which command)."""
    print(f"\n{what} into {kind}: {rounds} rounds, {completed} completed by the rerun")


def _source(sources: dict[tuple[str, str], str], size: str, kind: str) -> str:
    return sources[size, CASES[kind][0]]


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_killed_part_way_is_completed_by_the_rerun(
    kind: str, server: Server, sources: Any, tmp_path: Path, request: Any
) -> None:
    """SIGKILL `copy` at a few of its writes to each kind of destination; the rerun exits 0
    and leaves it equal to the source; a third run finds everything already there."""
    case = _copy_case(kind, _source(sources, "many", kind), tmp_path, request)
    rounds, completed = _rounds(server, case, every=0)
    assert completed >= 3, (rounds, completed)
    _figures("copy", kind, rounds, completed)


@pytest.mark.parametrize("kind", KINDS)
def test_an_import_killed_part_way_is_completed_by_the_rerun(
    kind: str, server: Server, exports: dict[str, list[str]], tmp_path: Path, request: Any
) -> None:
    """The same for `import` of .jsonl exports (forked sessions among them)."""
    case = _import_case(kind, exports["many"], tmp_path, request)
    rounds, completed = _rounds(server, case, every=0)
    assert completed >= 3, (rounds, completed)
    _figures("import", kind, rounds, completed)


@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_stopped_by_a_full_disk_is_completed_by_the_rerun(
    kind: str, server: Server, sources: Any, tmp_path: Path, request: Any
) -> None:
    """A destination whose disk fills up part way: on a folder, every write and new folder
    from then on fails with ENOSPC; on a database, every writing call. `copy` fails; once
    there is room, the rerun completes it."""
    case = _copy_case(kind, _source(sources, "many", kind), tmp_path, request)
    rounds, completed = _rounds(server, case, every=0, full=True)
    assert completed >= 3, (rounds, completed)
    _figures("copy, full disk,", kind, rounds, completed)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_a_copy_killed_at_any_write_is_completed_by_the_rerun(
    kind: str, server: Server, sources: Any, tmp_path: Path, request: Any
) -> None:
    """As above, at every write of `copy` (of the smallest source with every step), to each
    kind of destination; on a folder, a full disk at every third file change too."""
    case = _copy_case(kind, _source(sources, "few", kind), tmp_path, request)
    for full in (False, True) if kind == "fs" else (False,):
        rounds, completed = _rounds(server, case, every=3 if full else 1, full=full)
        assert completed >= rounds // 2, (rounds, completed)
        _figures("copy, full disk," if full else "copy", kind, rounds, completed)


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_an_import_killed_at_any_write_is_completed_by_the_rerun(
    kind: str, server: Server, exports: dict[str, list[str]], tmp_path: Path, request: Any
) -> None:
    """As above, at every write of `import`."""
    case = _import_case(kind, exports["few"], tmp_path, request)
    rounds, completed = _rounds(server, case, every=1)
    assert completed >= rounds // 2, (rounds, completed)
    _figures("import", kind, rounds, completed)
