"""The filesystem store's listing index read as it stands (``IndexedListing``) and the
dashboard's background catch-up: after a bulk load an overview answers from what the index
holds and says how many sessions it is still indexing, instead of waiting for them."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from starlette.testclient import TestClient

from helpers.web import seed
from terrarium import FsStore, MemoryStore
from terrarium.index import listing as lister
from terrarium.model import SegmentStartState
from terrarium.sessions import create_segment
from terrarium.stores.base import IndexedListing
from terrarium.web import create_app, data
from test_web_app import LOCAL


def test_the_index_read_as_it_stands_and_its_backlog(store: FsStore) -> None:
    assert isinstance(lister(store), IndexedListing)
    seed(store)
    assert lister(store).list_contexts_as_indexed() == []  # never built: nothing read yet
    assert lister(store).index_backlog() == 3  # every session folder
    lister(store).catch_up_index()
    assert [s.context for s in lister(store).list_contexts_as_indexed()] == [
        s.context for s in lister(store).list_contexts_fast()
    ]
    create_segment(store, SegmentStartState(), context="cli:late")
    assert "cli:late" not in {s.context for s in lister(store).list_contexts_as_indexed()}
    assert lister(store).index_backlog() >= 1  # its marker (and the sessions still watched)
    assert "cli:late" in {s.context for s in lister(store).list_contexts_fast()}
    assert "cli:late" in {s.context for s in lister(store).list_contexts_as_indexed("cli")}


def test_the_backlog_of_a_store_with_a_change_cursor() -> None:
    store = MemoryStore()
    seed(store)
    assert lister(store).index_backlog() == 3  # never built: every context
    lister(store).catch_up_index()
    assert lister(store).index_backlog() == 0
    create_segment(store, SegmentStartState(), context="cli:late")
    assert lister(store).index_backlog() == 1  # the one session written since
    store.close()


def test_a_big_backlog_is_caught_up_in_the_background(store: FsStore, monkeypatch: Any) -> None:
    seed(store)
    lister(store).catch_up_index()
    for i in range(4):
        create_segment(store, SegmentStartState(), context=f"cli:bulk{i}")
    monkeypatch.setattr(data, "SMALL_BACKLOG", 0)  # any backlog counts as big
    release = threading.Event()
    real = lister(store).catch_up_index

    def slow_catch_up() -> None:
        release.wait(60)
        real()

    monkeypatch.setattr(lister(store), "catch_up_index", slow_catch_up)
    c = TestClient(create_app(store), base_url=LOCAL)
    stats = c.get("/api/stats").json()
    assert stats["totals"]["contexts"] == 3  # what the index holds: not the 4 new ones yet
    assert stats["indexing"] >= 4
    page = c.get("/").text
    assert 'id="indexing"' in page and 'http-equiv="refresh"' in page
    release.set()
    catch_up = c.app.app.state.dashboard.activity.catch_up  # type: ignore[attr-defined]
    assert catch_up._thread is not None
    catch_up._thread.join(60)
    monkeypatch.setattr(data, "SMALL_BACKLOG", 10**9)
    stats = c.get("/api/stats").json()
    assert stats["totals"]["contexts"] == 7 and stats["indexing"] == 0
    assert 'id="indexing"' not in c.get("/").text


def test_an_unreadable_index_falls_back_to_the_store_listing(
    store: FsStore, monkeypatch: Any
) -> None:
    from terrarium.errors import IndexUnavailable

    seed(store)
    monkeypatch.setattr(data, "SMALL_BACKLOG", -1)

    def broken(type: str | None = None) -> list[Any]:
        raise IndexUnavailable("index unreadable")

    monkeypatch.setattr(lister(store), "list_contexts_as_indexed", broken)
    rows, backlog = data.CatchUp().rows(store)
    assert len(rows) == 3 and backlog == 0


@pytest.mark.parametrize("sort", ["last_active", "tokens"])
def test_the_sessions_list_reads_the_index_as_the_overview_does(store: FsStore, sort: str) -> None:
    seed(store)
    c = TestClient(create_app(store), base_url=LOCAL)
    rows = c.get("/api/contexts", params={"sort": sort}).json()["contexts"]
    assert {r["context_id"] for r in rows} == {"cli:main", "irc:#python", "cli:compacted"}


def test_contexts_left_pending_are_read_in_the_background(store: FsStore, monkeypatch: Any) -> None:
    seed(store)
    monkeypatch.setattr(data, "ACTIVITY_BUDGET", 0.0)  # a page reads nothing itself
    c = TestClient(create_app(store), base_url=LOCAL)
    first = c.get("/api/stats").json()
    assert first["activity_pending"] == 3 and first["totals"]["turns"] == 0
    fill_in = c.app.app.state.dashboard.fill_in  # type: ignore[attr-defined]
    assert fill_in._thread is not None
    fill_in._thread.join(60)
    done = c.get("/api/stats").json()
    assert done["activity_pending"] == 0
    assert done["totals"]["turns"] == 5  # cli:main 3, irc:#python 1, cli:compacted 1 carried
