"""The figures the derived index keeps per session (``index/_figures.py``): folded by the
replay rule, incrementally while a head only grows, afresh when it moved; the overview's sums
are aggregates of them; archived contexts and legacy files are rows of the index.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers.web import turn
from terrarium import (
    ContextId,
    FsStore,
    contexts,
    create_segment,
    fork_context,
    index,
    legacy,
    restore,
    states,
)
from terrarium.contexts import clear_context, listing_index, rewind_context
from terrarium.index import _build, _figures
from terrarium.index._listing import ListingQuery
from terrarium.sessions import create_compacted_segment
from terrarium.stores.base import Store
from terrarium.stores.memory import MemoryStore
from terrarium.stores.sqlite import SqliteStore
from test_web_paging import _legacy

TABLES = {
    "sessions": "SELECT context, turns, tokens, fork_source FROM sessions",
    "usage": "SELECT s.context, model, prompt, completion, cached, calls, estimated "
    "FROM usage u JOIN sessions s ON s.id = u.session",
    "days": "SELECT s.context, day, messages FROM days d JOIN sessions s ON s.id = d.session",
    "copies": "SELECT s.context, origin, segment, seq, position, day "
    "FROM copies c JOIN sessions s ON s.id = c.session",
    "held": "SELECT s.context, origin, segment, seq, position "
    "FROM held h JOIN sessions s ON s.id = h.session",
    "ranges": "SELECT s.context, segment, lo, hi FROM ranges r JOIN sessions s ON s.id = r.session",
}


@pytest.fixture(params=["memory", "fs", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store
    if request.param == "memory":
        made = MemoryStore()
    elif request.param == "fs":
        made = FsStore(tmp_path / "sessions")
    else:
        made = SqliteStore(tmp_path / "s.db")
    yield made
    made.close()


def figures(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every figure row the index holds, by table, sorted (after a refresh)."""
    found = listing_index(store)
    found.refresh()
    with sqlite3.connect(found.path) as conn:
        return {name: sorted(conn.execute(query).fetchall()) for name, query in TABLES.items()}


def refolded(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """The figures of an index rebuilt from scratch."""
    index.reindex(store)
    return figures(store)


def test_an_incremental_fold_equals_a_full_one(store: Store) -> None:
    """Appends folded onto the kept figures, refresh after refresh, give the figures a
    rebuild folds from each lineage afresh; the lineage is read again for no append."""
    create_segment(store, context="cli:a")
    turn(store, "cli:a", "q0", "a0", model="m1")
    figures(store)
    calls = []
    real = _figures.of_lineage

    def counted(*args: Any) -> Any:
        calls.append(args)
        return real(*args)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(_figures, "of_lineage", counted)
        for n in range(3):
            turn(store, "cli:a", f"q{n + 1}", f"a{n + 1}", model=f"m{n % 2}")
            kept = figures(store)
        assert calls == []  # the head only grew: its new lines were folded, nothing re-read
    assert kept == refolded(store)
    (row,) = kept["sessions"]
    state = restore(store, "cli:a")
    assert row[1:3] == (state.turns, state.usage.total_tokens) == (4, 480)


@pytest.mark.parametrize("change", ["compaction", "rewind", "clear", "fork"])
def test_a_moved_head_is_folded_afresh(store: Store, change: str) -> None:
    """A compaction, a rewind, a clear or a fork into the same context moves the head: the
    figures are folded afresh from the new lineage, as a rebuild and ``restore`` give them."""
    create_segment(store, context="cli:a")
    for n in range(3):
        turn(store, "cli:a", f"q{n}", f"a{n}")
    figures(store)
    context = ContextId.parse("cli:a")
    if change == "compaction":
        state = restore(store, context)
        summary = [{"role": "system", "content": "s"}, *state.history[-2:]]
        create_compacted_segment(store, state, summary, context=context)
    elif change == "rewind":
        rewind_context(store, context, 2)
    elif change == "clear":
        clear_context(store, context)
    else:
        fork_context(store, "cli:a", "cli:b")
    turn(store, "cli:a", "after", "it")
    kept = figures(store)
    assert kept == refolded(store)
    state = restore(store, context)
    row = next(r for r in kept["sessions"] if r[0] == "cli:a")
    assert row[1:3] == (state.turns, state.usage.total_tokens)
    days = sum(n for c, _, n in kept["days"] if c == "cli:a")
    assert days == len(state.history)


def test_a_fork_copy_counts_once(store: Store) -> None:
    """Messages a fork copied from another context count in the source while it holds them,
    then in one fork, once, however many forks hold them."""
    create_segment(store, context="cli:b")
    turn(store, "cli:b", "q", "a")
    fork_context(store, "cli:b", "cli:a")
    fork_context(store, "cli:b", "cli:a2")

    def per_day() -> int:
        sums = listing_index(store).read(lambda r: r.sums())
        return sum(n for day in sums.per_day.values() for n in day.values())

    assert per_day() == 2
    assert listing_index(store).read(lambda r: r.forks_of("cli:b")) == ["cli:a", "cli:a2"]
    clear_context(store, ContextId.parse("cli:b"))
    assert per_day() == 2  # now counted in one of the forks


def test_archived_contexts_and_legacy_files_are_rows(tmp_path: Path) -> None:
    """An archived context and a legacy file beside the store are rows of the index (with
    their state), and a legacy file the log holds a context of is hidden."""
    store = FsStore(tmp_path / "sessions")
    create_segment(store, context="cli:hot")
    turn(store, "cli:hot", "q", "a")
    create_segment(store, context="cli:cold")
    turn(store, "cli:cold", "q", "a")
    assert states.archive_context(store, ContextId.parse("cli:cold")) is not None
    _legacy(store.root, "cli:old", "2026-01-02", 4)
    _legacy(store.root, "cli:hot", "2026-01-02", 9)  # hidden by the log's cli:hot
    query = ListingQuery(limit=10)

    def rows(state: str) -> dict[str, tuple[str, int, str | None]]:
        page = listing_index(store).read(lambda r: r.page(query, state))
        return {s.context: (s.state, s.message_count, s.legacy_path) for s in page}

    hot = rows("hot")
    assert hot["cli:hot"] == ("hot", 2, None)
    assert hot["cli:old"][:2] == ("legacy", 4) and hot["cli:old"][2]
    assert set(hot) == {"cli:hot", "cli:old"}
    assert rows("archived") == {"cli:cold": ("archived", 2, None)}
    assert set(rows("all")) == {"cli:hot", "cli:old", "cli:cold"}
    assert states.unarchive_context(store, ContextId.parse("cli:cold"))
    assert rows("archived") == {}
    assert rows("hot")["cli:cold"] == ("hot", 2, None)
    store.close()


def test_a_listing_row_is_one_record_from_every_source(tmp_path: Path) -> None:
    """A hot context's row, a legacy file's and an archived context's are one record wherever
    they are read (the index's pages, ``list_contexts``, the legacy scan, the archive), each
    made once, and a row gives the same JSON from each."""
    store = FsStore(tmp_path / "sessions")
    for name in ("hot", "cold"):
        create_segment(store, context=f"cli:{name}")
        turn(store, f"cli:{name}", "q", "a")
    assert states.archive_context(store, ContextId.parse("cli:cold")) is not None
    _legacy(store.root, "cli:old", "2026-01-02", 4)
    (old,) = legacy.listing(store).sessions
    cold = contexts.archived_row(states.archived_contexts(store)[0])
    assert contexts.other_rows(store) == [old, cold]
    listed = {row.context: row for row in contexts.list_contexts(store).rows}
    assert listed["cli:old"] == old and set(listed) == {"cli:hot", "cli:old"}
    page = listing_index(store).read(lambda r: r.page(ListingQuery(limit=10), "all"))
    shown = {row.context: row.to_json(frozenset()) for row in page}
    assert shown == {
        "cli:hot": listed["cli:hot"].to_json(frozenset()),
        "cli:old": old.to_json(frozenset()),
        "cli:cold": cold.to_json(frozenset()),
    }
    assert shown["cli:old"]["legacy"] and shown["cli:cold"]["state"] == "archived"
    store.close()


@pytest.mark.parametrize("kind", ["fs", "sqlite"])
def test_a_first_build_does_not_hold_a_page_for_long(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store whose index was never built: each dashboard page indexes sessions for about
    ``BUILD_STEP`` and shows what the index holds, saying how many are left and reloading;
    writes meanwhile are not lost, and the figures end as a rebuild's."""
    from starlette.testclient import TestClient

    from terrarium.index._refresh import IndexUpdate
    from terrarium.web import create_app, data

    made: Store = FsStore(tmp_path / "s") if kind == "fs" else SqliteStore(tmp_path / "s.db")
    for n in range(12):
        create_segment(made, context=f"cli:c{n}")
        turn(made, f"cli:c{n}", "q", "a")
    real = IndexUpdate.index_folder

    def slow(self: IndexUpdate, *args: Any, **kwargs: Any) -> Any:
        time.sleep(0.05)  # a step (BUILD_STEP) indexes one session
        return real(self, *args, **kwargs)

    monkeypatch.setattr(IndexUpdate, "index_folder", slow)
    monkeypatch.setattr(data, "BUILD_STEP", 0.01)
    monkeypatch.setattr(_build, "SMALL", 0)  # any build counts as big
    client = TestClient(create_app(made), base_url="http://127.0.0.1")
    began = time.monotonic()
    first = client.get("/api/stats").json()
    assert time.monotonic() - began < 2
    assert first["indexing"] > 0 and first["totals"]["contexts"] < 12
    page = client.get("/").text
    assert 'id="indexing"' in page and 'http-equiv="refresh"' in page
    turn(made, "cli:c0", "during", "the build")  # indexed already, or not yet
    create_segment(made, context="cli:late")
    for _ in range(200):
        stats = client.get("/api/stats").json()
        if not stats["indexing"]:
            break
    assert stats["totals"]["contexts"] == 13 and stats["totals"]["turns"] == 13
    assert 'id="indexing"' not in client.get("/").text
    monkeypatch.undo()
    assert figures(made) == refolded(made)
    made.close()
