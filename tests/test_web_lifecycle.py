"""The dashboard over a store with lifecycle states (the ``Lifecycle`` protocol; MemoryStore
is its reference implementation): counts on the overview, the archived filter and pin marks
in the sessions list, a session's state, the archive/pin/trash writes behind confirmation and
CSRF, and the trash page with its restore."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from helpers.plain_store import PlainStore
from helpers.web import seed
from terrarium import FsStore, states
from terrarium.model import ContextId
from terrarium.sessions import create_segment
from terrarium.stores.base import Lifecycle
from terrarium.stores.fs import _states
from terrarium.stores.memory import MemoryStore
from terrarium.web import create_app
from test_web_app import LOCAL, parse

MAIN = ContextId.parse("cli:main")


@pytest.fixture
def memory() -> MemoryStore:
    store = MemoryStore()
    seed(store)
    assert isinstance(store, Lifecycle)
    return store


def _client(store: Any, **options: Any) -> TestClient:
    return TestClient(create_app(store, **options), base_url=LOCAL)


def _csrf(client: TestClient, **params: str) -> str:
    page = client.get("/confirm", params=params)
    assert page.status_code == 200, page.text
    form = parse(page.text)
    return next(a["value"] or "" for t, a in form.tags if t == "input" and a["name"] == "csrf")


def test_the_overview_counts_archived_trashed_and_pinned(memory: MemoryStore) -> None:
    states.archive_context(memory, ContextId.parse("irc:#python"))
    states.pin_context(memory, MAIN)
    states.delete_context(memory, ContextId.parse("cli:compacted"))
    c = _client(memory)
    stats = c.get("/api/stats").json()
    assert stats["lifecycle"] == {"archived": 1, "trashed": 1, "pinned": 1}
    assert stats["totals"]["contexts"] == 1  # only cli:main is hot
    page = parse(c.get("/").text)
    ids = {a.get("id") for _, a in page.tags}
    assert {"total-archived", "total-trashed", "total-pinned"} <= ids
    html = c.get("/").text
    assert '<span class="n" id="total-archived">1</span>' in html


def test_a_store_without_lifecycle_shows_no_counts() -> None:
    store: Any = PlainStore()
    seed(store)
    assert not isinstance(store, Lifecycle)
    c = _client(store)
    assert c.get("/api/stats").json()["lifecycle"] is None
    assert "total-archived" not in c.get("/").text
    assert c.get("/api/trash").json() == {"lifecycle": False, "trash": []}


def test_sessions_mark_pins_and_filter_archived(memory: MemoryStore) -> None:
    states.archive_context(memory, ContextId.parse("irc:#python"))
    states.pin_context(memory, MAIN)
    c = _client(memory)
    hot = c.get("/api/contexts").json()
    shown = {r["context_id"]: (r["state"], r["pinned"]) for r in hot["contexts"]}
    assert shown == {"cli:compacted": ("hot", False), "cli:main": ("hot", True)}
    archived = c.get("/api/contexts", params={"state": "archived"}).json()["contexts"]
    assert [(r["context_id"], r["state"]) for r in archived] == [("irc:#python", "archived")]
    every = c.get("/api/contexts", params={"state": "all", "sort": "messages"}).json()
    assert {r["context_id"] for r in every["contexts"]} == {
        "cli:main",
        "cli:compacted",
        "irc:#python",
    }
    assert "irc" in every["types"]
    page = c.get("/sessions", params={"state": "all"}).text
    assert '<span class="tag pinned">pinned</span>' in page
    assert '<span class="tag archived">archived</span>' in page
    assert c.get("/api/contexts", params={"state": "frozen"}).status_code == 400


def test_a_session_page_shows_its_state(memory: MemoryStore) -> None:
    c = _client(memory)
    assert c.get("/api/context", params={"c": "cli:main"}).json()["lifecycle"] == {
        "state": "hot",
        "pinned": False,
    }
    states.archive_context(memory, MAIN)
    states.pin_context(memory, MAIN)
    view = c.get("/api/context", params={"c": "cli:main"}).json()
    assert view["lifecycle"] == {"state": "archived", "pinned": True}
    assert view["total_messages"] > 0  # an archived context still reads
    html = c.get("/session", params={"c": "cli:main"}).text
    assert 'id="state">archived</span>' in html and 'id="pinned">pinned</span>' in html


def test_archive_pin_and_back_behind_confirmation(memory: MemoryStore) -> None:
    c = _client(memory, allow_writes=True)
    links = c.get("/session", params={"c": "cli:main"}).text
    assert "action=archive&amp;c=cli%3Amain" in links and "action=pin&amp;" in links
    assert "delete to trash" in links
    csrf = _csrf(c, action="archive", c="cli:main")
    for action, check in (
        ("archive", lambda: states.is_archived(memory, MAIN)),
        ("pin", lambda: "cli:main" in states.pinned_contexts(memory)),
        ("unpin", lambda: "cli:main" not in states.pinned_contexts(memory)),
        ("unarchive", lambda: not states.is_archived(memory, MAIN)),
    ):
        done = c.post(
            "/action",
            data={"action": action, "c": "cli:main", "csrf": csrf},
            follow_redirects=False,
        )
        assert done.status_code == 303 and done.headers["location"] == "/session?c=cli%3Amain"
        assert check(), action
    again = c.post("/action", data={"action": "unarchive", "c": "cli:main", "csrf": csrf})
    assert again.status_code == 404 and "cli:main is not archived" in again.text


def test_lifecycle_writes_need_allow_writes_and_csrf(memory: MemoryStore) -> None:
    read_only = _client(memory)
    assert "action=archive" not in read_only.get("/session", params={"c": "cli:main"}).text
    csrf = create_app(memory).app.state.dashboard.csrf
    refused = read_only.post("/action", data={"action": "archive", "c": "cli:main", "csrf": csrf})
    assert refused.status_code == 403
    writer = _client(memory, allow_writes=True)
    for token in ({}, {"csrf": "wrong"}):
        response = writer.post("/action", data={"action": "pin", "c": "cli:main", **token})
        assert response.status_code == 403
    assert not states.is_archived(memory, MAIN) and states.pinned_contexts(memory) == frozenset()


def test_delete_to_trash_and_restore_from_the_trash_page(memory: MemoryStore) -> None:
    states.pin_context(memory, MAIN)
    c = _client(memory, allow_writes=True)
    confirm = c.get("/confirm", params={"action": "delete", "c": "cli:main"}).text
    assert "moves to the trash" in confirm
    csrf = _csrf(c, action="delete", c="cli:main")
    c.post("/action", data={"action": "delete", "c": "cli:main", "csrf": csrf})
    assert memory.get_head(MAIN) is None
    trash = c.get("/api/trash").json()["trash"]
    assert [(t["context_id"], t["pinned"]) for t in trash] == [("cli:main", True)]
    page = c.get("/trash").text
    trash_id = trash[0]["trash_id"]
    assert f"action=restore&amp;trash={trash_id}" in page
    form = parse(c.get("/confirm", params={"action": "restore", "trash": trash_id}).text)
    hidden = {a["name"]: a["value"] for t, a in form.tags if t == "input"}
    assert hidden["trash"] == trash_id and hidden["csrf"] == csrf
    done = c.post(
        "/action",
        data={"action": "restore", "trash": trash_id, "csrf": csrf},
        follow_redirects=False,
    )
    assert done.status_code == 303 and done.headers["location"] == "/session?c=cli%3Amain"
    assert memory.get_head(MAIN) is not None and "cli:main" in states.pinned_contexts(memory)
    assert states.trashed_contexts(memory) == []
    assert "The trash is empty." in c.get("/trash").text
    gone = c.post("/action", data={"action": "restore", "trash": trash_id, "csrf": csrf})
    assert gone.status_code == 404
    assert c.get("/confirm", params={"action": "restore", "trash": "nope"}).status_code == 404


def test_restore_onto_a_taken_id_is_a_conflict(memory: MemoryStore) -> None:
    states.delete_context(memory, MAIN)
    create_segment(memory, None, context="cli:main")  # the id is taken again
    c = _client(memory, allow_writes=True)
    trash_id = states.trashed_contexts(memory)[0].trash_id
    csrf = _csrf(c, action="restore", trash=trash_id)
    response = c.post("/action", data={"action": "restore", "trash": trash_id, "csrf": csrf})
    assert response.status_code == 409
    assert len(states.trashed_contexts(memory)) == 1


def test_the_lifecycle_actions_on_a_store_without_them_are_400() -> None:
    store: Any = PlainStore()
    seed(store)
    assert not isinstance(store, Lifecycle)
    c = _client(store, allow_writes=True)
    csrf = _csrf(c, action="archive", c="cli:main")
    response = c.post("/action", data={"action": "archive", "c": "cli:main", "csrf": csrf})
    assert response.status_code == 400 and "no lifecycle states" in response.text
    assert "delete to trash" not in c.get("/session", params={"c": "cli:main"}).text
    assert "has no trash" in c.get("/trash").text


PAGES = (
    "/",
    "/api/stats",
    "/sessions",
    "/api/contexts?state=all",
    "/session?c=cli:main",
    "/api/context?c=cli:main",
    "/search?q=hello",
    "/trash",
)


@pytest.mark.parametrize("kind", ["memory", "fs"])
def test_a_page_reads_the_lifecycle_records_once(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page reads the store's lifecycle records (``session_records``: one file each on the
    filesystem) once at most, whatever it shows of them: archived rows, pins, counts and
    the frozen sessions' bytes; not once for each. A session's page reads its own record
    alone."""
    store: Any = MemoryStore() if kind == "memory" else FsStore(tmp_path / "s")
    seed(store)
    states.archive_context(store, ContextId.parse("irc:#python"))
    states.pin_context(store, MAIN)
    states.delete_context(store, ContextId.parse("cli:compacted"))
    c = _client(store)
    reads: list[str] = []  # the page of each read
    real = type(store).session_records

    def counted(self: Any) -> Any:
        reads.append(page)
        return real(self)

    monkeypatch.setattr(type(store), "session_records", counted)
    for page in PAGES:  # the index built, the archived rows in it
        assert c.get(page).status_code == 200
    reads.clear()
    for page in PAGES:
        assert c.get(page).status_code == 200
    most = {page: 0 if "c=cli:main" in page else 1 for page in PAGES}
    assert {page: reads.count(page) for page in PAGES if reads.count(page) > most[page]} == {}


def test_an_fs_page_opens_no_file_per_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the filesystem store a page's cost does not grow with the lifecycle records: read
    once, they are kept (``.index/records.json``) while ``.states/`` and ``.detached/`` keep
    their mtime. Every page opens as many record files with 30 pinned contexts as with 3; a
    listing page opens none (a search reads its hits'); a new process reads the kept file."""
    monkeypatch.setattr(_states, "STILL_NS", 0)  # no mtime too young to trust: keep at once
    opened: list[Path] = []
    real = _states.read_record
    monkeypatch.setattr(_states, "read_record", lambda path: opened.append(path) or real(path))
    counts = []
    for n in (3, 30):
        store = FsStore(tmp_path / str(n))
        seed(store)
        for i in range(n - 3):
            create_segment(store, None, context=f"cli:c{i:02}")
        for head in store.list_contexts():
            states.pin_context(store, ContextId.parse(head.context))
        c = _client(store)
        for page in PAGES:  # the index built, the records read and kept
            assert c.get(page).status_code == 200
        opened.clear()
        for page in PAGES:
            assert c.get(page).status_code == 200
        assert len(c.get("/api/contexts").json()["contexts"]) == n
        assert c.get("/api/stats").json()["lifecycle"]["pinned"] == n
        counts.append(sum(p.parent.name == ".states" for p in opened))
        listing = [p for p in PAGES if "c=" not in p and "q=" not in p]  # no hit, no session
        opened.clear()
        for page in listing:
            assert c.get(page).status_code == 200
        assert opened == []
        fresh = store._read_records()
        opened.clear()
        assert FsStore(store.root).session_records() == fresh
        assert opened == []
    assert counts[0] == counts[1]


def test_fs_figures_follow_another_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The records a page keeps are read again after a pin, unpin, archive or delete made by
    another process: each changes ``.states/`` or ``.detached/``."""
    monkeypatch.setattr(_states, "STILL_NS", 0)
    store = FsStore(tmp_path / "s")
    seed(store)
    c = _client(store)

    def run(*args: str) -> tuple[dict[str, int], dict[str, tuple[str, bool]]]:
        if args:
            cli = [sys.executable, "-m", "terrarium.cli", "--storage-dir", str(store.root)]
            subprocess.run([*cli, *args], check=True, capture_output=True)
        rows = c.get("/api/contexts", params={"state": "all"}).json()["contexts"]
        shown = {r["context_id"]: (r["state"], r["pinned"]) for r in rows}
        return c.get("/api/stats").json()["lifecycle"], shown

    hot = {"cli:main": ("hot", False), "cli:compacted": ("hot", False)}
    none = {"archived": 0, "trashed": 0, "pinned": 0}
    assert run() == (none, {**hot, "irc:#python": ("hot", False)})
    pinned = {**hot, "cli:main": ("hot", True)}
    assert run("pin", "cli:main") == (
        {**none, "pinned": 1},
        {**pinned, "irc:#python": ("hot", False)},
    )
    assert run("unpin", "cli:main") == (none, {**hot, "irc:#python": ("hot", False)})
    assert run("pin", "cli:main")[0]["pinned"] == 1
    archived = {**pinned, "irc:#python": ("archived", False)}
    assert run("archive", "irc:#python") == ({**none, "archived": 1, "pinned": 1}, archived)
    del archived["cli:main"]
    assert run("delete", "cli:main") == ({**none, "archived": 1, "trashed": 1}, archived)
    assert c.get("/api/trash").json()["trash"][0]["context_id"] == "cli:main"
