"""The sessions list pages from the store's index (``Listing``), with legacy files and
archived contexts merged in, and gives what a sort of the whole listing would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from terrarium import FsStore, contexts, states
from terrarium.index import listing as lister
from terrarium.model import ContextId
from terrarium.sessions import create_segment
from terrarium.stores.base import NewEntry, Store
from terrarium.stores.sqlite import SqliteStore
from terrarium.web import create_app
from terrarium.web.data import encode_cursor

#: (context, messages, day of its last message)
NATIVE = [
    ("cli:main", 3, "2026-11-01"),
    ("cli:b", 3, "2026-11-01"),
    ("irc:#python", 5, "2026-11-03"),
    ("irc:#Über", 1, "2026-11-02"),
    ("game:chess", 2, "2026-10-30"),
    ("web:abc", 4, "2026-11-04"),
    ("web:old", 6, "2026-09-01"),  # archived below
    ("cli:shadow", 1, "2026-11-05"),  # hides the legacy file of the same id
]

#: Prompt + completion tokens of the usage records some contexts get (the others: none).
TOKENS = {"cli:main": 30, "irc:#python": 30, "web:abc": 5, "game:chess": 100, "web:old": 7}


def _legacy(root: Path, context: str, day: str, messages: int) -> None:
    ctx = ContextId.parse(context)
    stamp = f"{day}T14:00:00.123456"
    data = {
        "session_id": ctx.name,
        "context_type": ctx.type,
        "system_prompt": "be brief",
        "messages": [
            {"role": "user", "content": f"old {i}", "timestamp": stamp} for i in range(messages)
        ],
        "metadata": {
            "created_at": stamp,
            "last_active": stamp,
            "message_count": messages,
            "session_id": ctx.name,
            "context_type": ctx.type,
            "session_date": day,
        },
    }
    path = root / ctx.type / day / f"{ctx.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def _fill(store: Store) -> None:
    for number, (context, messages, day) in enumerate(NATIVE):
        create_segment(store, None, context=context)
        head = store.get_head(ContextId.parse(context))
        assert head is not None
        line = {"item": {"role": "user", "content": context}}
        entries = [
            NewEntry("user_input", f"{day}T10:{number:02d}:{i:02d}.000000Z", line)
            for i in range(messages)
        ]
        if context in TOKENS:
            usage = {"model": "m", "prompt_tokens": TOKENS[context] - 1, "completion_tokens": 1}
            entries.append(NewEntry("usage", f"{day}T11:00:00.000000Z", usage))
        store.append(head.session_id, head.segment_id, entries)
    states.archive_context(store, ContextId.parse("web:old"))
    if isinstance(store, FsStore):
        _legacy(store.root, "cli:legacy", "2026-11-02", 7)
        _legacy(store.root, "cli:shadow", "2025-01-01", 9)


@pytest.fixture(params=["fs", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    made: Store = (
        FsStore(tmp_path / "sessions")
        if request.param == "fs"
        else SqliteStore(tmp_path / "sessions.db")
    )
    _fill(made)
    yield made
    made.close()


def _expected(store: Store, sort: str, state: str, **filters: str) -> list[str]:
    """The ids a sort of the whole listing (hot, legacy files included) and the archive
    gives, largest first, ties by id: what the pages must add up to."""
    rows = (
        [
            (row.context, row.type, row.last_active, row.created_at, row.message_count)
            for row in contexts.list_contexts(store).rows
        ]
        if state != "archived"
        else []
    )
    if state != "hot":
        for a in states.archived_contexts(store):
            rows.append(
                (a.context, a.context.split(":")[0], a.last_active, a.created_at, a.message_count)
            )
    if sort == "tokens":  # archived contexts are not read: they count 0, as unread ones do
        hot = {
            r[0] for r in rows if r[0] not in {a.context for a in states.archived_contexts(store)}
        }  # type: ignore[attr-defined]
        rows = [(*r, TOKENS.get(r[0], 0) if r[0] in hot else 0) for r in rows]
    value = {"last_active": 2, "created": 3, "messages": 4, "tokens": 5}[sort]
    picked = [
        r
        for r in rows
        if r[1] == filters.get("type", r[1])
        and filters.get("q", "").casefold() in r[0].casefold()
        and r[2][:10] >= filters.get("since", "")
    ]
    return [r[0] for r in sorted(picked, key=lambda r: (r[value], r[0]), reverse=True)]


def _walk(client: TestClient, **params: str) -> list[str]:
    seen: list[str] = []
    cursor = None
    while True:
        query = {**params, "limit": "2", **({"cursor": cursor} if cursor else {})}
        page = client.get("/api/contexts", params=query).json()
        seen += [row["context_id"] for row in page["contexts"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return seen


@pytest.mark.parametrize("sort", ["last_active", "created", "messages", "tokens"])
@pytest.mark.parametrize("state", ["hot", "archived", "all"])
def test_the_pages_add_up_to_the_whole_listing_sorted(store: Store, sort: str, state: str) -> None:
    """Walking the pages (two rows each) gives every context once, in the order a sort of the
    whole listing gives: native contexts from the index, legacy files the log does not hide,
    archived contexts when asked for, with and without filters."""
    client = TestClient(create_app(store), base_url="http://127.0.0.1")
    for filters in ({}, {"type": "cli"}, {"q": "ÜBER"}, {"since": "2026-11-02"}):
        assert _walk(client, sort=sort, state=state, **filters) == _expected(
            store, sort, state, **filters
        ), filters


def test_legacy_files_and_archived_contexts_are_marked(store: Store) -> None:
    """A legacy file shows as legacy (the one the log hides does not show), an archived
    context as archived, and the types offered include both."""
    client = TestClient(create_app(store), base_url="http://127.0.0.1")
    page = client.get("/api/contexts", params={"state": "all", "limit": "50"}).json()
    rows = {row["context_id"]: row for row in page["contexts"]}
    assert rows["web:old"]["state"] == "archived"
    assert rows["cli:shadow"]["message_count"] == 1 and not rows["cli:shadow"]["legacy"]
    if isinstance(store, FsStore):
        assert rows["cli:legacy"]["legacy"] and rows["cli:legacy"]["message_count"] == 7
    assert page["types"] == ["cli", "game", "irc", "web"]


def test_a_page_does_not_list_every_context(store: Store, monkeypatch: Any) -> None:
    """The sessions list and the overview read a page and the sums from the index, not
    a whole listing (which costs a third of a second at 100k contexts)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("listed every context")

    monkeypatch.setattr(contexts, "list_contexts", refuse)
    monkeypatch.setattr(type(lister(store)), "list_contexts_fast", refuse)
    client = TestClient(create_app(store), base_url="http://127.0.0.1")
    for url in ("/api/contexts?sort=messages", "/sessions?state=all&q=b", "/", "/api/stats"):
        assert client.get(url).status_code == 200, url


def test_a_cursor_of_another_order_is_a_400(store: Store) -> None:
    """A cursor made for one order, given with another, is refused in one line."""
    client = TestClient(create_app(store), base_url="http://127.0.0.1")
    cursor = encode_cursor(("2026-11-01T00:00:00Z", "cli:main"))
    response = client.get("/api/contexts", params={"sort": "messages", "cursor": cursor})
    assert response.status_code == 400
    assert "cursor" in response.json()["error"] and "\n" not in response.json()["error"]


def test_a_page_shows_its_tokens_without_the_overview(store: Store) -> None:
    """A fresh dashboard's sessions list reads the tallies of its own rows: their tokens show
    before anyone opens the overview (legacy files have none)."""
    client = TestClient(create_app(store), base_url="http://127.0.0.1")
    page = client.get("/api/contexts", params={"sort": "messages", "limit": "50"}).json()
    tokens = {row["context_id"]: row["tokens"] for row in page["contexts"]}
    assert tokens["game:chess"] == 100 and tokens["cli:main"] == 30
    assert tokens["cli:b"] == 0  # read: it has no usage
    if isinstance(store, FsStore):
        assert tokens["cli:legacy"] is None


WRITER = """
import sys
from terrarium.model import ContextId
from terrarium.sessions import create_segment, save_user_input
from terrarium.stores.url import open_store
with open_store(sys.argv[1], create=False) as store:
    save_user_input(store, store.get_head(ContextId.parse("game:chess")), "moves to the front")
    create_segment(store, None, context="cli:new")
"""


def test_writes_by_another_process_between_pages_skip_or_repeat_no_other_row(
    store: Store,
) -> None:
    """Keyset pages stay whole while another process writes: a context written between two
    pages moves ahead of the cursor (the walk goes on without it) and a new one starts ahead
    of it, but no other context is skipped and none is shown twice."""
    url = str(store.root) if isinstance(store, FsStore) else f"sqlite://{store.path}"  # type: ignore[attr-defined]
    client = TestClient(create_app(store), base_url="http://127.0.0.1")
    first = client.get("/api/contexts", params={"limit": "2"}).json()
    subprocess.run(
        [sys.executable, "-c", WRITER, url], check=True, timeout=120, capture_output=True
    )
    seen = [row["context_id"] for row in first["contexts"]]
    cursor = first["next_cursor"]
    while cursor is not None:
        page = client.get("/api/contexts", params={"limit": "2", "cursor": cursor}).json()
        seen += [row["context_id"] for row in page["contexts"]]
        cursor = page["next_cursor"]
    assert len(seen) == len(set(seen))
    untouched = set(_expected(store, "last_active", "hot")) - {"game:chess", "cli:new"}
    assert untouched <= set(seen) and "cli:new" not in seen
