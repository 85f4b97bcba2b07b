"""The dashboard's compact action (``terrarium serve --allow-writes``): offered beside fork and
clear on a context's head, behind a confirmation naming the model server and the CSRF token;
it moves the head to a compaction segment, answers 409 when the summary would not make the
context smaller, 502 naming the URL when the model server fails, and writes nothing then."""

from __future__ import annotations

import html
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from fakeserver import FakeServer
from helpers.web import long_turns, seed, turn
from terrarium import FsStore, states
from terrarium.contexts import get_stats
from terrarium.model import ContextId
from terrarium.sessions import create_segment, restore
from terrarium.web import ModelAccess, create_app
from terrarium.web.data import fork_tree
from test_web_app import LOCAL, parse

LONG = ContextId.parse("cli:long")
SUMMARY = "SUMMARY: three long questions about words were answered"


@pytest.fixture
def seeded(store: FsStore) -> FsStore:
    """The web tests' store, and ``cli:long``: three long turns, so a summary shrinks it."""
    seed(store)
    create_segment(store, None, context=str(LONG))
    long_turns(store, str(LONG))
    return store


def closed_port_url() -> str:
    """A model server URL on 127.0.0.1 where nothing listens."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def compacting_app(store: Any, url: str, **options: Any) -> Any:
    """The app with writes, a model at ``url`` (no retries) and, for compactions, another
    instance of the store (an ``FsStore`` of its folder, unless ``reopen`` says otherwise)."""
    options.setdefault("allow_writes", True)
    options.setdefault("reopen", lambda: FsStore(store.root))
    return create_app(store, model=ModelAccess(url, retries=0), **options)


def client(store: Any, url: str, **options: Any) -> TestClient:
    """A test client of :func:`compacting_app`."""
    return TestClient(compacting_app(store, url, **options), base_url=LOCAL)


def csrf_of(c: TestClient, context: ContextId) -> str:
    page = c.get("/confirm", params={"action": "compact", "c": str(context)})
    assert page.status_code == 200, page.text
    form = parse(page.text)
    return next(a["value"] or "" for t, a in form.tags if t == "input" and a["name"] == "csrf")


def post(c: TestClient, context: ContextId, csrf: str | None) -> Any:
    form = {"action": "compact", "c": str(context)}
    if csrf is not None:
        form["csrf"] = csrf
    return c.post("/action", data=form, follow_redirects=False)


def snapshot(store: FsStore, context: ContextId) -> tuple[Any, ...]:
    """What a write to the context would change: its head and every segment's next seq."""
    head = store.get_head(context)
    assert head is not None
    segments = store.list_segments(head.session_id)
    return head, tuple((s, store.next_seq(head.session_id, s)) for s in segments)


def error_line(page: str) -> str:
    """The one line of an error page."""
    found = re.findall(r'<p class="error"[^>]*>(.*?)</p>', page, re.S)
    assert len(found) == 1, page
    return html.unescape(found[0])


def compact_links(page: str) -> list[str]:
    return [a["href"] or "" for t, a in parse(page).tags if "action=compact" in a.get("href", "")]


# --------------------------------------------------------------------------- success


def test_compaction_moves_the_head_to_a_compaction_segment(
    seeded: FsStore, fake_server: FakeServer
) -> None:
    fake_server.reply = SUMMARY
    c = client(seeded, fake_server.base_url)
    old = seeded.get_head(LONG)
    assert old is not None
    before = restore(seeded, LONG).history
    assert compact_links(c.get("/session", params={"c": str(LONG)}).text) == [
        "/confirm?action=compact&c=cli%3Along"
    ]
    confirm = c.get("/confirm", params={"action": "compact", "c": str(LONG)}).text
    assert f"Asks the model at <code>{fake_server.base_url}</code>" in confirm
    assert "the old history stays in the fork tree" in confirm
    assert fake_server.requests == []  # asking to confirm asks no model

    done = post(c, LONG, csrf_of(c, LONG))
    assert done.status_code == 303, done.text
    assert done.headers["location"] == "/session?c=cli%3Along"
    assert len(fake_server.requests) == 1

    head = seeded.get_head(LONG)
    assert head is not None and head.segment_id != old.segment_id
    history = restore(seeded, LONG).history
    assert history[0]["content"] == f"[Summary of the conversation so far]\n{SUMMARY}"
    assert history[2:] == before[-4:]  # the summary, its acknowledgement, the last 4 kept
    tree = {s["segment_id"]: s for s in fork_tree(seeded, LONG)["segments"]}
    assert tree[str(head.segment_id)]["origin"] == "compaction"
    assert tree[str(head.segment_id)]["head"] is True
    assert str(old.segment_id) in tree  # the old history stays in the tree

    view = c.get("/api/context", params={"c": str(LONG)}).json()
    assert view["messages"][0]["text"].endswith(SUMMARY)
    # the summary and its acknowledgement are the summary; the kept turns are not
    assert [m["summary"] for m in view["messages"]] == [True, True] + [False] * 4
    page = c.get("/session", params={"c": str(LONG)}).text
    assert page.count("compaction summary") == 2 and SUMMARY in page


def test_an_archived_context_is_compacted_and_woken(
    seeded: FsStore, fake_server: FakeServer
) -> None:
    fake_server.reply = SUMMARY
    assert states.archive_context(seeded, LONG) is not None
    c = client(seeded, fake_server.base_url)
    assert compact_links(c.get("/session", params={"c": str(LONG)}).text)
    assert post(c, LONG, csrf_of(c, LONG)).status_code == 303
    assert restore(seeded, LONG).history[0]["content"].endswith(SUMMARY)
    assert not states.is_archived(seeded, LONG)  # a write brings an archived context back


# --------------------------------------------------------------------------- refusals


def test_nothing_to_compact_is_409_with_the_reason_and_nothing_written(
    seeded: FsStore, fake_server: FakeServer
) -> None:
    """Every message is one a compaction keeps: refused before the model is asked."""
    irc = ContextId.parse("irc:#python")
    c = client(seeded, fake_server.base_url)
    before = snapshot(seeded, irc)
    refused = post(c, irc, csrf_of(c, irc))
    assert refused.status_code == 409
    assert refused.headers["content-type"].startswith("text/html")
    assert error_line(refused.text) == (
        "irc:#python not compacted: all 2 of its messages are recent ones a compaction keeps "
        "as they are, so there is nothing to summarise"
    )
    assert fake_server.requests == []
    assert snapshot(seeded, irc) == before


def test_a_summary_that_would_not_shrink_is_409_and_the_history_unchanged(
    seeded: FsStore, fake_server: FakeServer
) -> None:
    """Refused after the model call: no new segment, the history as it was; only the call's
    usage is logged (as ``terrarium compact`` does)."""
    short = ContextId.parse("cli:short")
    create_segment(seeded, None, context=str(short))
    for q, a in (("a", "b"), ("c", "d"), ("e", "f")):
        turn(seeded, str(short), q, a)
    fake_server.reply = "a summary far longer than the two one-letter messages it would replace"
    c = client(seeded, fake_server.base_url)
    head, history = seeded.get_head(short), restore(seeded, short).history
    refused = post(c, short, csrf_of(c, short))
    assert refused.status_code == 409
    line = error_line(refused.text)
    assert line.startswith("cli:short not compacted: the summary (") and "\n" not in line
    assert len(fake_server.requests) == 1
    assert seeded.get_head(short) == head
    assert restore(seeded, short).history == history
    assert get_stats(seeded, short)["usage"]["calls"] == 1 + 3  # the summary's call, logged


def test_an_unreachable_model_server_is_502_naming_its_url(seeded: FsStore) -> None:
    url = closed_port_url()
    c = client(seeded, url)
    before = snapshot(seeded, LONG)
    failed = post(c, LONG, csrf_of(c, LONG))
    assert failed.status_code == 502
    line = error_line(failed.text)
    assert line.startswith(f"cannot reach the model server at {url}")
    assert "\n" not in line and "Traceback" not in failed.text
    assert snapshot(seeded, LONG) == before
    assert c.get("/session", params={"c": str(LONG)}).status_code == 200  # the rest still serves


def test_a_failing_model_server_is_502_naming_its_url(
    seeded: FsStore, fake_server: FakeServer
) -> None:
    fake_server.fail_next(500)
    c = client(seeded, fake_server.base_url)
    before = snapshot(seeded, LONG)
    failed = post(c, LONG, csrf_of(c, LONG))
    assert failed.status_code == 502
    assert fake_server.base_url in error_line(failed.text)
    assert snapshot(seeded, LONG) == before


def test_compact_is_refused_without_allow_writes(seeded: FsStore, fake_server: FakeServer) -> None:
    c = client(seeded, fake_server.base_url, allow_writes=False)
    before = snapshot(seeded, LONG)
    assert c.get("/confirm", params={"action": "compact", "c": str(LONG)}).status_code == 403
    csrf = c.app.app.state.dashboard.csrf  # the right token: refused all the same
    assert post(c, LONG, csrf).status_code == 403
    assert compact_links(c.get("/session", params={"c": str(LONG)}).text) == []
    assert fake_server.requests == [] and snapshot(seeded, LONG) == before


@pytest.mark.parametrize("csrf", [None, "wrong"])
def test_compact_needs_the_csrf_token(
    seeded: FsStore, fake_server: FakeServer, csrf: str | None
) -> None:
    c = client(seeded, fake_server.base_url)
    before = snapshot(seeded, LONG)
    assert post(c, LONG, csrf).status_code == 403
    assert fake_server.requests == [] and snapshot(seeded, LONG) == before


def test_an_unknown_context_is_404(seeded: FsStore, fake_server: FakeServer) -> None:
    c = client(seeded, fake_server.base_url)
    ghost = ContextId.parse("cli:ghost")
    assert c.get("/confirm", params={"action": "compact", "c": str(ghost)}).status_code == 404
    missing = post(c, ghost, c.app.app.state.dashboard.csrf)
    assert missing.status_code == 404
    assert "cli:ghost" in error_line(missing.text)
    assert fake_server.requests == []
    assert seeded.get_head(ghost) is None


def test_compact_is_offered_only_on_the_head(seeded: FsStore, fake_server: FakeServer) -> None:
    main = ContextId.parse("cli:main")  # forked: a segment that is not the head
    c = client(seeded, fake_server.base_url)
    head = seeded.get_head(main)
    assert head is not None
    other = next(s for s in seeded.list_segments(head.session_id) if s != head.segment_id)
    assert compact_links(c.get("/session", params={"c": str(main)}).text)
    page = c.get("/session", params={"c": str(main), "segment": str(other)}).text
    assert "fork…" in page and compact_links(page) == []


def test_without_a_model_compact_is_not_offered(seeded: FsStore) -> None:
    c = TestClient(create_app(seeded, allow_writes=True), base_url=LOCAL)
    assert compact_links(c.get("/session", params={"c": str(LONG)}).text) == []
    assert c.get("/confirm", params={"action": "compact", "c": str(LONG)}).status_code == 400
    assert post(c, LONG, c.app.app.state.dashboard.csrf).status_code == 400
    with pytest.raises(ValueError, match="both model and reopen"):
        create_app(seeded, model=ModelAccess("http://127.0.0.1:1/v1"))


@pytest.fixture
def sqlite_long(tmp_path: Path) -> Iterator[Any]:
    from terrarium.stores.sqlite import SqliteStore

    with SqliteStore(tmp_path / "s.db") as store:
        create_segment(store, None, context=str(LONG))
        long_turns(store, str(LONG))
        yield store


def test_a_sqlite_store_is_compacted_through_a_second_connection(
    sqlite_long: Any, fake_server: FakeServer
) -> None:
    from terrarium.stores.sqlite import SqliteStore

    fake_server.reply = SUMMARY
    c = client(sqlite_long, fake_server.base_url, reopen=lambda: SqliteStore(sqlite_long.path))
    assert post(c, LONG, csrf_of(c, LONG)).status_code == 303
    view = c.get("/api/context", params={"c": str(LONG)}).json()  # the app's own connection
    assert view["messages"][0]["text"].endswith(SUMMARY)
    assert [s["origin"] for s in view["tree"]["segments"]] == ["root", "compaction"]


def test_the_dashboard_serves_while_the_model_summarises(
    seeded: FsStore, fake_server: FakeServer
) -> None:
    """The store lock is not held across the model call: during it the lock is free and a
    page of the same context is served (the compaction holds only the context's lock)."""
    c = client(seeded, fake_server.base_url)
    dashboard = c.app.app.state.dashboard
    during: list[tuple[bool, int]] = []

    def summarise(messages: list[dict[str, Any]]) -> str:
        held = dashboard.lock.locked()  # if it were, a page would wait for the reply: a hang
        page = None if held else c.get("/session", params={"c": str(LONG)})
        during.append((held, page.status_code if page is not None else 0))
        return SUMMARY

    fake_server.reply = summarise
    assert post(c, LONG, csrf_of(c, LONG)).status_code == 303
    assert during == [(False, 200)]
