"""The dashboard app (terrarium.web) through Starlette's test client: API, pages, 404s, the
OpenAPI document, the token guard, writes behind --allow-writes and CSRF, hostile content."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from helpers.web import HOSTILE_NAME, HOSTILE_TEXTS, head, seed, seed_hostile, turn
from pg import fresh_schema, pg_database  # noqa: F401  (a fixture)
from terrarium import FsStore, SegmentStartState, create_segment, states
from terrarium.model import ContextId, UsageRecord
from terrarium.sessions import (
    append_entry,
    clear_segment,
    create_compacted_segment,
    fork_context,
    restore,
    save_delta,
    save_turn_end,
    save_usage,
    save_user_input,
)
from terrarium.web import create_app
from terrarium.web.data import signature

LOCAL = "http://127.0.0.1:8765"


@pytest.fixture
def seeded(store: FsStore) -> FsStore:
    seed(store)
    return store


def client(store: FsStore, **options: Any) -> TestClient:
    return TestClient(create_app(store, **options), base_url=LOCAL)


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text of each <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.scripts.append(data)


def parse(html: str) -> Tags:
    tags = Tags()
    tags.feed(html)
    return tags


def assert_inert(html: str) -> None:
    """No injected element, event handler, inline script or javascript: URL in ``html``."""
    tags = parse(html)
    assert not tags.scripts, tags.scripts[:1]
    for tag, attrs in tags.tags:
        chart = tag == "svg" and attrs.get("class") == "chart"
        assert chart or tag not in ("img", "svg", "iframe", "textarea", "object"), (tag, attrs)
        if tag == "script":
            assert attrs.get("src") == "/static/live.js"
        for name, value in attrs.items():
            assert not name.startswith("on"), (tag, name)
            if name in ("href", "src", "action"):
                assert not (value or "").strip().lower().startswith("javascript:"), value


# --------------------------------------------------------------------------- API


def test_stats_count_what_the_store_holds(seeded: FsStore) -> None:
    c = client(seeded)
    stats = c.get("/api/stats").json()
    totals = stats["totals"]
    expected = sum(
        len(restore(seeded, ContextId.parse(h.context)).history) for h in seeded.list_contexts()
    )
    assert totals["contexts"] == 3
    assert totals["messages"] == expected
    # a compaction carries its context's turns on, as `stats` counts them
    turns = [restore(seeded, ContextId.parse(h.context)).turns for h in seeded.list_contexts()]
    assert totals["turns"] == sum(turns) == 5
    assert stats["per_type"] == {
        "cli": {"contexts": 2, "messages": expected - 2},
        "irc": {"contexts": 1, "messages": 2},
    }
    assert stats["tokens_per_model"]["llama"] == {
        "prompt_tokens": 50,
        "completion_tokens": 5,
        "cached_tokens": 0,
        "calls": 1,
        "estimated_calls": 0,
    }
    assert stats["tokens_per_model"]["qwen"]["calls"] == 4  # the compacted turn's, carried
    day = stats["messages_per_day"][-1]
    assert sum(day["by_type"].values()) >= expected
    assert stats["most_active"][0]["context_id"] == "cli:main"
    for _ in range(200):  # measured in the background: a guard against hanging, not a timing
        if totals["bytes_on_disk"] is not None:
            break
        time.sleep(0.05)
        totals = c.get("/api/stats").json()["totals"]
    assert totals["bytes_on_disk"] > 0


def test_stats_follow_a_new_write(seeded: FsStore) -> None:
    c = client(seeded)
    before = c.get("/api/stats").json()["totals"]
    turn(seeded, "irc:#python", "more", "answers")
    after = c.get("/api/stats").json()["totals"]
    assert after["messages"] == before["messages"] + 2
    assert after["turns"] == before["turns"] + 1


def test_contexts_filter_sort_and_cursor(seeded: FsStore) -> None:
    c = client(seeded)
    by_messages = c.get("/api/contexts", params={"sort": "messages"}).json()["contexts"]
    counts = [row["message_count"] for row in by_messages]
    assert counts == sorted(counts, reverse=True)
    assert [r["type"] for r in c.get("/api/contexts?type=irc").json()["contexts"]] == ["irc"]
    assert [r["name"] for r in c.get("/api/contexts?q=COMPACT").json()["contexts"]] == ["compacted"]
    assert c.get("/api/contexts?since=2999-01-01").json()["contexts"] == []
    seen, cursor = [], None
    while True:
        params = {"limit": "1", "sort": "created", **({"cursor": cursor} if cursor else {})}
        page = c.get("/api/contexts", params=params).json()
        seen += [row["context_id"] for row in page["contexts"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(h.context for h in seeded.list_contexts())
    assert len(seen) == 3


@pytest.mark.parametrize(
    "query", ["sort=size", "cursor=%%%", "since=yesterday", "limit=0", "limit=x"]
)
def test_bad_list_parameters_are_400_with_one_line(seeded: FsStore, query: str) -> None:
    response = client(seeded).get(f"/api/contexts?{query}")
    assert response.status_code == 400
    assert "\n" not in response.json()["error"]


def test_one_context_pages_and_segments(seeded: FsStore) -> None:
    c = client(seeded)
    view = c.get("/api/context", params={"c": "cli:main"}).json()
    texts = [m["text"] for m in view["messages"]]
    assert texts[:2] == ["What is a fork tree?", "A tree of **segments**."]
    assert view["total_messages"] == len(restore(seeded, ContextId.parse("cli:main")).history)
    assert view["messages"][1]["usage"]["model"] == "qwen"
    call = next(m for m in view["messages"] if m["tool_calls"])
    assert call["tool_calls"][0]["name"] == "weather"
    assert call["reasoning"] == "I should call the weather tool."
    page = c.get("/api/context", params={"c": "cli:main", "offset": 1, "limit": 1}).json()
    assert [m["text"] for m in page["messages"]] == ["A tree of **segments**."]
    tree = view["tree"]["segments"]
    assert [s["origin"] for s in tree] == ["root", "fork"]
    assert tree[1]["at_seq"] == 3 and tree[1]["depth"] == 1
    fork = c.get("/api/context", params={"c": "cli:main", "segment": tree[1]["segment_id"]})
    assert [m["text"] for m in fork.json()["messages"]] == texts[:2]
    compacted = c.get("/api/context", params={"c": "cli:compacted"}).json()
    assert compacted["messages"][0]["summary"] is True


def test_a_failed_turn_is_marked_in_the_transcript(store: FsStore) -> None:
    """The failed turn's message is marked with its error in the API and on the page, the
    partial reply of an interrupted one shown after it; the others are not marked."""
    create_segment(store, SegmentStartState(), context="cli:f")
    turn(store, "cli:f", "first question", "first answer")
    ref = head(store, "cli:f")
    save_user_input(store, ref, "too long a paste")
    errored = {"error": "the request does not fit", "error_type": None, "partial": "Once up"}
    append_entry(store, head(store, "cli:f"), "run_errored", errored)
    turn(store, "cli:f", "short one", "short answer")
    c = client(store)
    view = c.get("/api/context", params={"c": "cli:f"}).json()
    marks = [(m["text"], m["failed"]) for m in view["messages"]]
    mark = {"error": "the request does not fit", "partial": "Once up"}
    assert marks[2] == ("too long a paste", mark)
    assert [failed for text, failed in marks if text != "too long a paste"] == [None] * 4
    page = c.get("/session", params={"c": "cli:f"}).text
    assert "failed: the request does not fit · not sent again" in page
    assert "interrupted reply" in page and "Once up" in page
    assert page.count("tag bad") == 1


@pytest.mark.parametrize(
    "url",
    [
        "/api/context?c=cli:nope",
        "/api/context?c=cli:main&segment=0190aaaa-0000-7000-8000-000000000000",
        "/api/context?c=cli:main&segment=garbage",
        "/api/export?c=cli:nope",
    ],
)
def test_unknown_context_or_segment_is_404_json(seeded: FsStore, url: str) -> None:
    response = client(seeded).get(url)
    assert response.status_code == 404
    assert response.json()["error"]


@pytest.mark.parametrize(
    "url", ["/session?c=cli:nope", "/session?c=cli:main&segment=x", "/no/such/page"]
)
def test_unknown_pages_are_a_404_page_not_a_traceback(seeded: FsStore, url: str) -> None:
    response = client(seeded).get(url)
    assert response.status_code == 404
    assert "<h1>404</h1>" in response.text
    assert "Traceback" not in response.text


def test_search_api_and_page_highlight(seeded: FsStore) -> None:
    c = client(seeded)
    hits = c.get("/api/search", params={"q": "decorator"}).json()["hits"]
    assert [h["context"] for h in hits] == ["irc:#python"]
    start, end = hits[0]["highlights"][0]
    assert hits[0]["snippet"][start:end].lower().startswith("decorator")
    assert c.get("/api/search", params={"q": "decorator", "type": "cli"}).json()["hits"] == []
    assert c.get("/api/search", params={"q": "decorator", "role": "assistant"}).json()["hits"]
    assert c.get("/api/search", params={"q": "decorator", "role": "user"}).json()["hits"] == []
    assert c.get("/api/search", params={"q": "!!!"}).status_code == 400
    page = c.get("/search", params={"q": "decorator"}).text
    assert "<mark>" in page and "irc:#python" in page


def test_a_search_that_finds_nothing_says_what_a_wider_one_would(store: FsStore) -> None:
    """As ``terrarium search`` does (``search.wider``): the hits off the current branches,
    linked; else the archived sessions the search did not read."""
    create_segment(store, context="cli:gone")
    save_user_input(store, head(store, "cli:gone"), "an old walrus")
    clear_segment(store, restore(store, "cli:gone"), context="cli:gone")
    c = client(store)
    found = c.get("/api/search", params={"q": "walrus"}).json()
    assert (found["hits"], found["wider"]) == ([], {"all_branches": 1})
    page = c.get("/search", params={"q": "walrus", "type": "cli"}).text
    link = '<a href="/search?q=walrus&amp;type=cli&amp;all_branches=1">1 on other branches</a>'
    assert link in page
    assert c.get("/api/search", params={"q": "walrus", "all_branches": "1"}).json()["wider"] is None
    assert c.get("/api/search", params={"q": "nowhere"}).json()["wider"] is None
    states.archive_context(store, ContextId.parse("cli:gone"))
    assert c.get("/api/search", params={"q": "nowhere"}).json()["wider"] == {"archived": 1}
    assert "1 archived session not searched" in c.get("/search", params={"q": "nowhere"}).text


def test_a_transcript_numbers_messages_as_search_does(seeded: FsStore) -> None:
    """Each message's number is its place in the conversation (``#2``, as ``search`` and its
    anchor ``m2`` say), a link to itself; its log entry (which ``fork --at`` takes) is the
    number's title. Before, the number shown was the entry's seq: ``#5`` for message 2."""
    page = client(seeded).get("/session", params={"c": "cli:main"}).text
    numbers = re.findall(
        r'<a class="muted" href="#m(\d+)"(?: title="entry (\d+) of its segment")?>#(\d+)</a>', page
    )
    assert [(int(a), int(c)) for a, _, c in numbers] == [(n, n) for n in range(len(numbers))]
    assert [int(entry) for _, entry, _ in numbers][:3] == [1, 2, 5]


def test_search_hits_link_to_their_message_anchor(store: FsStore) -> None:
    """Each transcript message has an anchor ``m{place}``; a hit links to the page holding
    it, at that anchor; a cleared message is found only with all_branches, linking to its
    segment."""
    create_segment(store, context="cli:long")
    for n in range(205):  # more than one transcript page (200 messages)
        save_user_input(
            store, head(store, "cli:long"), f"line {n}" + (" walrus" if n == 203 else "")
        )
    create_segment(store, context="cli:gone")
    save_user_input(store, head(store, "cli:gone"), "an old walrus")
    clear_segment(store, restore(store, "cli:gone"), context="cli:gone")
    c = client(store)
    hits = c.get("/api/search", params={"q": "walrus"}).json()["hits"]
    assert [(h["context"], h["message"], h["branch"]) for h in hits] == [("cli:long", 203, "head")]
    assert hits[0]["url"] == "/session?c=cli%3Along&offset=200#m203"
    page = c.get(hits[0]["url"].split("#")[0]).text
    assert re.search(r'<li id="m203" class="msg[^>]*>(?:(?!</li>).)*line 203 walrus', page, re.S)
    assert 'id="m0"' in c.get("/session", params={"c": "cli:long"}).text
    found = c.get("/search", params={"q": "walrus", "all_branches": "1"}).text
    assert 'href="/session?c=cli%3Along&amp;offset=200#m203"' in found
    off = [
        h
        for h in c.get("/api/search", params={"q": "walrus", "all_branches": "1"}).json()["hits"]
        if h["branch"] == "off"
    ]
    assert (
        len(off) == 1 and off[0]["url"] == f"/session?c=cli%3Agone&segment={off[0]['segment_id']}"
    )
    assert "not on the current branch" in found


def test_export_downloads_every_format(seeded: FsStore) -> None:
    from terrarium.export import FORMATS, export_context

    c = client(seeded)
    for name in FORMATS:
        response = c.get("/api/export", params={"c": "cli:main", "format": name})
        assert response.status_code == 200, name
        assert response.headers["content-disposition"].startswith("attachment;")
        expected = export_context(seeded, "cli:main", name)
        body = expected.encode() if isinstance(expected, str) else expected
        if name in ("html", "markdown"):  # they stamp the export time
            assert len(response.content) > 0
        else:
            assert response.content == body, name


def test_openapi_document_matches_the_routes(seeded: FsStore) -> None:
    app = create_app(seeded)
    doc = client(seeded).get("/api/openapi.json").json()
    routes = {r.path for r in app.app.routes if isinstance(r, Route) and r.path.startswith("/api/")}
    assert set(doc["paths"]) == routes
    params = {p["name"] for p in doc["paths"]["/api/contexts"]["get"]["parameters"]}
    assert params == {"type", "q", "since", "until", "sort", "cursor", "limit", "state"}
    assert doc["openapi"].startswith("3.")


# --------------------------------------------------------------------------- pages


def test_pages_render_what_the_store_holds(seeded: FsStore) -> None:
    c = client(seeded)
    overview = c.get("/").text
    assert 'id="total-contexts">3<' in overview
    assert "<svg" in overview and "qwen" in overview
    listing = c.get("/sessions?type=cli").text
    assert "cli:main" in listing and "irc:#python" not in listing
    page = c.get("/session", params={"c": "cli:main"}).text
    assert page.index("What is a fork tree?") < page.index("Show code")
    assert '<span class="k">def</span>' in page or 'class="k"' in page  # highlighted
    assert "<strong>segments</strong>" in page
    assert '<details class="tool-call">' in page and '<details class="reasoning">' in page
    assert '<details class="tool-result">' in page
    assert "fork at entry 3" in page
    assert page.count('download href="/api/export') == 6
    assert "compaction summary" in c.get("/session", params={"c": "cli:compacted"}).text


def test_estimated_usage_is_shown_as_such(seeded: FsStore) -> None:
    """Usage a server did not report (estimated by terrarium) is marked on every page."""
    ref = head(seeded, "irc:#python")
    save_user_input(seeded, ref, "streamed question")
    save_delta(seeded, ref, [{"role": "assistant", "content": "streamed answer"}])
    save_usage(seeded, ref, UsageRecord("qwen", 40, 9, 0, estimated="chars"))
    save_turn_end(seeded, ref)
    c = client(seeded)
    stats = c.get("/api/stats").json()
    assert stats["totals"]["estimated_calls"] == 1
    assert stats["tokens_per_model"]["qwen"]["estimated_calls"] == 1
    assert stats["tokens_per_model"]["llama"]["estimated_calls"] == 0
    overview = c.get("/").text
    assert 'id="estimated-calls">(1 of the calls estimated' in overview
    assert "(1 estimated)" in overview
    page = c.get("/session", params={"c": "irc:#python"}).text
    assert "~9 completion" in page and "estimated (chars)" in page
    assert "1 estimated)" in page  # the context's stats
    assert "estimated" not in c.get("/session", params={"c": "cli:compacted"}).text


def test_responses_items_show_as_their_chat_form(seeded: FsStore) -> None:
    """A Responses history (typed parts, a function call and its output, reasoning, a kind
    with no Chat form) renders as messages, tool calls, tool results and folded reasoning."""
    ref = head(seeded, "irc:#python")
    save_delta(
        seeded,
        ref,
        [
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "typed question"}],
            },
            {
                "type": "reasoning",
                "id": "rs_1",
                "summary": [{"type": "summary_text", "text": "thinking it over"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "looked up value"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "typed answer"}],
            },
        ],
    )
    page = client(seeded).get("/session", params={"c": "irc:#python"}).text
    assert (
        page.index("typed question") < page.index("tool result for c1") < page.index("typed answer")
    )
    assert '<details class="reasoning">' in page and "thinking it over" in page
    assert "lookup" in page and '<details class="tool-result">' in page
    assert "web_search_call" in page


def test_every_response_carries_the_csp(seeded: FsStore) -> None:
    c = client(seeded)
    for url in ("/", "/api/stats", "/static/app.css", "/session?c=cli:nope"):
        csp = c.get(url).headers["content-security-policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp


def test_static_assets_are_served_from_the_package(seeded: FsStore) -> None:
    c = client(seeded)
    for url in ("/static/app.css", "/static/live.js", "/static/pygments.css"):
        assert c.get(url).status_code == 200, url
    assert "http" not in "".join(
        a.get("src") or a.get("href") or "" for _, a in parse(c.get("/").text).tags
    )


# --------------------------------------------------------------------------- hostile content


@pytest.fixture
def hostile(seeded: FsStore) -> FsStore:
    seed_hostile(seeded)
    return seeded


def test_hostile_content_is_escaped_everywhere(hostile: FsStore) -> None:
    c = client(hostile)
    name = f"cli:{HOSTILE_NAME}"
    pages = [
        c.get("/").text,
        c.get("/sessions").text,
        c.get("/session", params={"c": name}).text,
        c.get("/search", params={"q": "override"}).text,
        c.get("/search", params={"q": "click"}).text,
        c.get("/confirm", params={"action": "delete", "c": name}).text,  # 403 page, escaped too
    ]
    for html in pages:
        assert_inert(html)
    page = pages[2]
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert '<a href="https://example.org/ok">fine</a>' in page
    assert "javascript:" not in page.split("<main", 1)[1].replace("[click me](javascript:", "")
    assert "\u202e" not in page or 'dir="auto"' in page  # message bodies are isolated
    assert '<pre class="plain">' in page  # the 1 MB message, shown as escaped text


def test_hostile_name_in_api_is_data(hostile: FsStore) -> None:
    rows = client(hostile).get("/api/contexts", params={"q": "onerror"}).json()["contexts"]
    assert [row["name"] for row in rows] == [HOSTILE_NAME]
    for text in HOSTILE_TEXTS:
        assert text  # stored as given; only the HTML views transform them


# --------------------------------------------------------------------------- token, host


def test_token_is_required_on_every_request(seeded: FsStore) -> None:
    c = TestClient(create_app(seeded, token="s3cret"), base_url="http://192.0.2.10:8765")
    for url in ("/", "/api/stats", "/static/app.css", "/api/openapi.json", "/nope"):
        assert c.get(url).status_code == 401, url
    assert c.get("/?token=wrong").status_code == 401
    assert c.get("/", headers={"authorization": "Bearer s3cret"}).status_code == 200
    login = c.get("/sessions?token=s3cret&type=cli", follow_redirects=False)
    assert login.status_code == 303 and login.headers["location"] == "/sessions?type=cli"
    assert "httponly" in login.headers["set-cookie"].lower()
    assert c.get("/api/stats").status_code == 200  # the cookie now


@pytest.mark.parametrize(
    "path",
    ["//evil.example/x", "///evil.example/x", "/\\evil.example/x", "/%2F%2Fevil.example/x"],
)
def test_the_token_redirect_never_leaves_the_site(seeded: FsStore, path: str) -> None:
    """The login redirect names a path on this site: never a scheme-relative ``//host``
    (nor ``/\\host``, which browsers read alike), whatever the request's path."""
    site = "http://192.0.2.10:8765"
    c = TestClient(create_app(seeded, token="s3cret"), base_url=site)
    login = c.get(f"{site}{path}?token=s3cret&a=1", follow_redirects=False)
    assert login.status_code == 303
    location = login.headers["location"]
    assert location.startswith("/") and location[1:2] not in ("/", "\\"), location
    assert urlsplit(urljoin(site + "/", location)).netloc == "192.0.2.10:8765"
    assert location.endswith("evil.example/x?a=1")


def test_without_a_token_only_loopback_hosts_are_served(seeded: FsStore) -> None:
    rebound = TestClient(create_app(seeded), base_url="http://evil.example:8765")
    assert rebound.get("/api/stats").status_code == 403
    assert client(seeded).get("/api/stats").status_code == 200
    assert TestClient(create_app(seeded), base_url="http://localhost:1").get("/").is_success


# --------------------------------------------------------------------------- writes


def test_writes_are_refused_without_allow_writes(seeded: FsStore) -> None:
    c = client(seeded)
    assert c.get("/confirm", params={"action": "delete", "c": "cli:main"}).status_code == 403
    csrf = create_app(seeded).app.state.dashboard.csrf
    response = c.post("/action", data={"action": "delete", "c": "cli:main", "csrf": csrf})
    assert response.status_code == 403
    assert seeded.get_head(ContextId.parse("cli:main")) is not None
    assert "/confirm" not in c.get("/session", params={"c": "cli:main"}).text


def _csrf(c: TestClient, action: str, context: str) -> str:
    form = parse(c.get("/confirm", params={"action": action, "c": context}).text)
    return next(a["value"] or "" for t, a in form.tags if t == "input" and a["name"] == "csrf")


def test_writes_need_the_csrf_token(seeded: FsStore) -> None:
    c = client(seeded, allow_writes=True)
    for token in ({}, {"csrf": "wrong"}):
        response = c.post("/action", data={"action": "delete", "c": "cli:main", **token})
        assert response.status_code == 403
    assert seeded.get_head(ContextId.parse("cli:main")) is not None


def test_fork_clear_and_delete_with_confirmation(seeded: FsStore) -> None:
    c = client(seeded, allow_writes=True)
    csrf = _csrf(c, "fork", "cli:main")
    done = c.post(
        "/action",
        data={"action": "fork", "c": "cli:main", "target": "cli:copy", "csrf": csrf},
        follow_redirects=False,
    )
    assert done.status_code == 303
    copy = restore(seeded, ContextId.parse("cli:copy"))
    assert len(copy.history) == len(restore(seeded, ContextId.parse("cli:main")).history)
    c.post("/action", data={"action": "clear", "c": "cli:copy", "csrf": csrf})
    assert restore(seeded, ContextId.parse("cli:copy")).history == []
    c.post("/action", data={"action": "delete", "c": "cli:copy", "csrf": csrf})
    assert seeded.get_head(ContextId.parse("cli:copy")) is None
    again = c.post("/action", data={"action": "delete", "c": "cli:copy", "csrf": csrf})
    assert again.status_code == 404


# --------------------------------------------------------------------------- live


def test_live_signature_changes_on_a_write(seeded: FsStore) -> None:
    main = ContextId.parse("cli:main")
    before, whole = signature(seeded, main), signature(seeded, None)
    assert signature(seeded, main) == before  # reading changes nothing
    turn(seeded, "cli:main", "again", "yes")
    assert signature(seeded, main) != before
    assert signature(seeded, None) != whole
    assert signature(seeded, ContextId.parse("cli:gone")) == "gone"


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Any]:
    from terrarium.stores.url import open_store

    with open_store(f"sqlite:///{tmp_path / 's.db'}") as s:
        yield s


def test_the_same_app_serves_sqlite(sqlite_store: Any) -> None:
    seed(sqlite_store)
    c = TestClient(create_app(sqlite_store), base_url=LOCAL)
    assert c.get("/api/stats").json()["totals"]["contexts"] == 3
    assert head(sqlite_store, "cli:main") is not None
    assert "What is a fork tree?" in c.get("/session?c=cli:main").text


def test_bytes_on_disk_count_archived_and_trashed_sessions(store: FsStore, root: Path) -> None:
    """A filesystem store's bytes on disk are its segment files, hot and frozen: an archived
    context's and a trashed one's compressed files still count (before, only the hot
    segments the index read did, so archiving a context took its bytes off the figure)."""
    for name in ("kept", "archived", "deleted"):
        context = ContextId.parse(f"cli:{name}")
        create_segment(store, SegmentStartState(history=[]), context=str(context))
        save_delta(store, head(store, str(context)), [{"role": "user", "content": name * 500}])
    assert states.archive_context(store, ContextId.parse("cli:archived")) is not None
    assert states.delete_context(store, ContextId.parse("cli:deleted"))
    segments = [p for p in root.rglob("*") if p.name.endswith((".jsonl", ".jsonl.zst"))]
    assert len(segments) == 3
    totals = client(store).get("/api/stats").json()["totals"]
    assert totals["bytes_on_disk"] == sum(p.stat().st_size for p in segments)


def test_bytes_on_disk_is_none_for_a_store_without_files(tmp_path: Path) -> None:
    from terrarium.stores.memory import MemoryStore

    memory = MemoryStore()
    seed(memory)
    totals = TestClient(create_app(memory), base_url=LOCAL).get("/api/stats").json()["totals"]
    assert totals["bytes_on_disk"] is None
    assert totals["contexts"] == 3


def test_a_read_only_index_behind_the_log_gives_way_to_a_walked_one(
    root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """An index that cannot be written (its folder is read-only) and is behind the log (a
    session was written since it was built) is not served stale: the pages read a walked
    index of the store instead, which shows the new session."""
    from terrarium.stores import _db

    with FsStore(root) as store:
        seed(store)
        assert client(store).get("/api/contexts").status_code == 200  # the index is built
        create_segment(store, SegmentStartState(), context="web:latecomer")
        turn(store, "web:latecomer", "a late question", "a late answer")
    folder = root / ".index"
    files = [folder, *folder.rglob("*")]
    if os.geteuid() == 0:  # root writes whatever the modes say: the index is told what they say
        monkeypatch.setattr(_db, "writable", lambda path: not path.is_relative_to(folder))
    try:
        for item in files:
            item.chmod(0o500 if item.is_dir() else 0o400)
        with FsStore(root) as store:
            c = client(store)
            listed, page, stats = c.get("/api/contexts"), c.get("/sessions"), c.get("/api/stats")
    finally:
        for item in files:
            item.chmod(0o700 if item.is_dir() else 0o600)
    assert [r.status_code for r in (listed, page, stats)] == [200, 200, 200], listed.text
    assert "web:latecomer" in {row["context_id"] for row in listed.json()["contexts"]}
    assert "latecomer" in page.text
    assert stats.json()["totals"]["contexts"] == 4
    assert "reading an index of the store in a temporary folder instead" in caplog.text


@pytest.mark.postgres
def test_the_same_app_serves_postgres(pg_database: str) -> None:  # noqa: F811
    from terrarium.stores.postgres import PostgresStore

    with PostgresStore(pg_database, schema=fresh_schema(), pool_size=2) as pg:
        seed(pg)
        c = TestClient(create_app(pg), base_url=LOCAL)
        stats = c.get("/api/stats").json()
        assert stats["totals"]["contexts"] == 3 and stats["totals"]["bytes_on_disk"] is None
        assert "What is a fork tree?" in c.get("/session?c=cli:main").text
        assert c.get("/api/search", params={"q": "decorator"}).json()["hits"]
        before = signature(pg, None)
        turn(pg, "cli:main", "one more", "sure")
        assert signature(pg, None) != before


def test_the_overview_follows_writes_and_never_reloads_itself(seeded: FsStore) -> None:
    """The overview's figures are the index's sums, brought up to date by each read: a turn
    shows on the next overview, which is complete (no partial page that reloads)."""
    from terrarium.web.data import overview

    first = overview(seeded)
    assert first["totals"]["turns"] == 5 and first["totals"]["messages"] > 0
    assert "activity_pending" not in first and first["indexing"] == 0
    turn(seeded, "irc:#python", "q", "a")
    again = overview(seeded)
    assert again["totals"]["turns"] == 6
    assert again["totals"]["messages"] == first["totals"]["messages"] + 2
    assert 'http-equiv="refresh"' not in client(seeded).get("/").text


def test_kept_sums_equal_a_fresh_count_after_writes_and_deletes(seeded: FsStore) -> None:
    """The sums the index kept through writes and deletes equal those of a rebuilt index."""
    from terrarium import index
    from terrarium.lifecycle import delete_context
    from terrarium.web.data import overview

    overview(seeded)
    turn(seeded, "irc:#python", "q", "a", model="new-model")
    turn(seeded, "cli:main", "q", "a")
    delete_context(seeded, ContextId.parse("cli:compacted"))
    again = overview(seeded)
    index.reindex(seeded)
    assert again == overview(seeded)
    assert again["tokens_per_model"]["new-model"]["calls"] == 1
    delete_context(seeded, ContextId.parse("irc:#python"))
    assert "new-model" not in overview(seeded)["tokens_per_model"]


def test_forks_into_other_contexts_are_listed_on_the_source(seeded: FsStore) -> None:
    """``fork_context`` makes another session: the source's page lists it (also once the fork
    is compacted, its lineage no longer starting at the root), and the fork's origin links
    back to the source."""
    fork_context(seeded, "cli:main", "cli:main-experiment")
    fork_context(seeded, "cli:main", "cli:main-retry")
    fork_context(seeded, "irc:#python", "irc:#python-2")
    retry = restore(seeded, ContextId.parse("cli:main-retry"))
    create_compacted_segment(
        seeded, retry, [{"role": "user", "content": "Summary"}], context="cli:main-retry"
    )
    c = client(seeded)
    forks = c.get("/api/context", params={"c": "cli:main"}).json()["tree"]["forks"]
    assert forks == {"contexts": ["cli:main-experiment", "cli:main-retry"]}
    assert c.get("/api/context", params={"c": "cli:main-retry"}).json()["tree"]["forks"] == {
        "contexts": []
    }
    links = [a.get("href") for tag, a in parse(c.get("/session?c=cli:main").text).tags]
    assert "/session?c=cli%3Amain-experiment" in links
    assert "/session?c=cli%3Amain-retry" in links
    assert "/session?c=irc%3A%23python-2" not in links
    fork_page = parse(c.get("/session?c=cli:main-experiment").text)
    sources = [a for tag, a in fork_page.tags if tag == "a" and a.get("class") == "source"]
    assert [a["href"] for a in sources] == ["/session?c=cli%3Amain"]


def damage(store: FsStore, text: str) -> Path:
    """Make the third line of the segment file holding ``text`` unreadable; return the file."""
    (path,) = [p for p in store.root.rglob("*.jsonl") if text in p.read_text()]
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = "{not json\n"
    path.write_text("".join(lines))
    return path


def test_missing_invalid_and_damaged_sessions_say_which(seeded: FsStore) -> None:
    """A missing id is named whole (404), an invalid one is called invalid (400), a damaged
    session names its file and line and suggests fsck, as a page and in JSON."""
    c = client(seeded)
    missing = c.get("/api/context", params={"c": "cli:nope"})
    assert (missing.status_code, missing.json()["error"]) == (404, "no session 'cli:nope'")
    page = c.get("/session", params={"c": "cli:nope"})
    assert page.status_code == 404 and "no session &#39;cli:nope&#39;</p>" in page.text
    invalid = c.get("/api/context", params={"c": "not-an-id"})
    assert invalid.status_code == 400
    assert invalid.json()["error"].startswith("invalid session id 'not-an-id': expected")
    assert c.get("/session", params={"c": "cli:"}).status_code == 400
    assert "invalid session id cli:: the name is empty" in c.get("/session?c=cli:").text
    assert c.get("/api/context").json() == {"error": "c, the session id (type:name), is required"}

    path = damage(seeded, "Show code")
    broken = c.get("/api/context", params={"c": "cli:main"})
    assert broken.status_code == 500
    assert broken.json()["error"].startswith(f"damaged session: {path}:3: not valid JSON")
    assert "terrarium fsck" in broken.json()["hint"]
    shown = c.get("/session", params={"c": "cli:main"})
    assert shown.status_code == 500 and f"{path}:3: not valid JSON" in shown.text
    assert "terrarium fsck --repair --salvage" in shown.text and "CorruptLog" not in shown.text


def test_times_figures_sizes_and_titles_read_as_the_cli_writes_them(seeded: FsStore) -> None:
    ref = head(seeded, "cli:main")
    save_usage(seeded, ref, UsageRecord("big", 19794, 1234567, 0))
    c = client(seeded)
    overview = c.get("/").text
    assert "<title>terrarium</title>" in overview
    totals = c.get("/api/stats").json()["totals"]
    assert totals["completion_tokens"] > 1_000_000
    assert f'<span class="n">{totals["prompt_tokens"]:,}</span> prompt tokens' in overview
    assert f'<span class="n">{totals["completion_tokens"]:,}</span> completion' in overview
    page = c.get("/session", params={"c": "cli:main"}).text
    assert "<title>cli:main · terrarium</title>" in page
    usage = c.get("/api/context", params={"c": "cli:main"}).json()["stats"]["usage"]
    assert usage["completion_tokens"] > 1_000_000
    assert f"{usage['prompt_tokens']:,} prompt · {usage['completion_tokens']:,} completion" in page
    stamps = re.findall(r"<time>([^<]*)</time>", page)
    assert stamps and all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", t) for t in stamps)
    created = c.get("/api/context", params={"c": "cli:main"}).json()["stats"]["created_at"]
    assert f"<td>{created[:10]} {created[11:16]} UTC</td>" in page
    listed = c.get("/sessions").text
    assert not re.search(r"\d\d:\d\d:\d\d", listed)  # no ISO seconds left
    c = client(seeded, allow_writes=True)
    csrf = _csrf(c, "delete", "irc:#python")
    c.post("/action", data={"action": "delete", "c": "irc:#python", "csrf": csrf})
    trash = c.get("/trash").text
    assert re.search(r'<td class="num">(\d+ B|\d+\.\d KiB)</td>', trash), trash


def test_the_search_type_filter_is_the_sessions_list(seeded: FsStore) -> None:
    c = client(seeded)
    pick = re.compile(r'<select name="type">.*?</select>', re.S)
    sessions = pick.search(c.get("/sessions").text)
    search = pick.search(c.get("/search", params={"q": "decorator", "type": "irc"}).text)
    assert sessions is not None and search is not None
    assert "<option selected>irc</option>" in search[0]
    assert search[0].replace(" selected", "") == sessions[0]
    assert sessions[0].count("<option") == 3  # any, cli, irc
