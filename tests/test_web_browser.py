"""The dashboard in a real headless Chromium (Debian's ``chromium``, driven by Playwright's
Python package with ``executable_path``; never a browser download).

``make test`` installs chromium when it can (scripts/ensure_chromium.sh). Without it these
tests skip with one line saying how to enable them; under ``CI=true`` they fail instead.
Screenshots go to the test's tmp folder; set ``TERRARIUM_DASHBOARD_PNG=docs/dashboard.png`` to
write the README's picture of the overview.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from fakeserver import FakeServer
from helpers.web import HOSTILE_NAME, head, long_turns, seed, seed_hostile
from terrarium import FsStore, states
from terrarium.model import ContextId, UsageRecord
from terrarium.sessions import fork_context, restore, save_usage
from terrarium.web import create_app
from test_web_app import damage
from test_web_compact import compacting_app

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
ENABLE = "browser tests need Debian's chromium: run 'apt-get install -y chromium' as root"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"chromium is missing under CI=true; {ENABLE}")
        pytest.skip(ENABLE)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        instance = p.chromium.launch(executable_path=CHROMIUM, headless=True)
        yield instance
        instance.close()


def _listen() -> socket.socket:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)  # connections queue here until uvicorn accepts them: no wait needed
    return sock


@contextmanager
def serving(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on a free port, in a thread; yields its URL."""
    import uvicorn

    sock = _listen()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        server.force_exit = True
        thread.join(10)
        sock.close()


@contextmanager
def leaving(page: Any) -> Iterator[None]:
    """Leave for a blank page at the end, so the server stops with no live event stream."""
    try:
        yield
    finally:
        page.goto("about:blank")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, FsStore]]:
    """A seeded store (hostile content included) served by uvicorn on a free port."""
    store = FsStore(tmp_path / "sessions")
    seed(store)
    seed_hostile(store)
    try:
        with serving(create_app(store)) as url:
            yield url, store
    finally:
        store.close()


@pytest.fixture
def page(browser: Any, tmp_path: Path) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    tab = context.new_page()
    tab.dialogs = []
    tab.on("dialog", lambda d: (tab.dialogs.append(d.message), d.dismiss()))
    yield tab
    context.close()


def test_overview_counts_match_the_store(
    served: tuple[str, FsStore], page: Any, tmp_path: Path
) -> None:
    url, store = served
    page.goto(url + "/")
    heads = store.list_contexts()
    messages = sum(len(restore(store, ContextId.parse(h.context)).history) for h in heads)
    assert page.text_content("#total-contexts") == str(len(heads))
    assert page.text_content("#total-messages") == str(messages)
    assert page.locator("svg.chart rect").count() > 0
    page.screenshot(path=str(tmp_path / "overview.png"), full_page=True)
    target = os.environ.get("TERRARIUM_DASHBOARD_PNG")
    if target:  # the README's picture
        page.screenshot(path=target)


def test_a_transcript_shows_its_messages_in_order(
    served: tuple[str, FsStore], page: Any, tmp_path: Path
) -> None:
    url, store = served
    page.goto(url + "/session?c=cli:main")
    history = restore(store, ContextId.parse("cli:main")).history
    shown = [t.strip() for t in page.locator("#transcript .body").all_inner_texts()]
    expected = [
        item["content"]
        for item in history
        if isinstance(item.get("content"), str) and item["role"] != "tool"
    ]
    assert shown[0] == expected[0]
    assert len(shown) == len(expected)
    assert shown[1] == "A tree of segments."  # Markdown rendered, not shown raw
    assert page.locator("details.tool-call").count() == 1
    assert not page.locator("details.tool-call").get_attribute("open")
    page.screenshot(path=str(tmp_path / "session.png"), full_page=True)


def test_hostile_content_stays_inert(
    served: tuple[str, FsStore], page: Any, tmp_path: Path
) -> None:
    url, _ = served
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    for path in ("/", "/sessions", "/search?q=click", "/search?q=override"):
        page.goto(url + path)
    page.goto(
        url
        + "/session?c="
        + ContextId("cli", HOSTILE_NAME)
        .__str__()
        .replace("#", "%23")
        .replace("&", "%26")
        .replace('"', "%22")
    )
    assert page.locator("h1").inner_text().startswith("cli:<img src=x onerror=alert(1)>")
    assert page.dialogs == []
    assert page.evaluate("window.__pwned") is None
    assert page.locator("#live img, #live iframe, #live textarea, #live svg[onload]").count() == 0
    assert page.locator("a[href^='javascript']").count() == 0
    assert page.locator("a[href='https://example.org/ok']").count() == 1
    assert page.locator("pre.plain").count() == 1  # the 1 MB message, as text
    page.screenshot(path=str(tmp_path / "hostile.png"))


def test_search_finds_and_highlights(served: tuple[str, FsStore], page: Any) -> None:
    url, _ = served
    page.goto(url + "/search")
    page.fill("input[name=q]", "decorator")
    page.click("form.filters button")
    page.wait_for_url(re.compile(r".*q=decorator.*"))
    assert page.locator("mark").first.inner_text().lower().startswith("decorator")
    assert "irc:#python" in page.locator(".hit a").first.inner_text()
    page.locator(".hit a").first.click()  # to the message itself, on its transcript page
    page.wait_for_url(re.compile(r".*/session\?c=irc.*#m\d+$"))
    assert "decorator" in page.locator("li.msg:target").inner_text().lower()
    page.goto(url + "/search?q=long")  # only in what cli:compacted's compaction summarised
    assert page.locator(".hit").count() == 0
    page.get_by_role("link", name="2 on other branches").click()
    page.wait_for_url(re.compile(r".*q=long.*all_branches=1"))
    assert page.locator(".hit .tag").all_inner_texts() == ["not on the current branch"] * 2


CHAT = """
import sys
from terrarium import FsStore
from terrarium.model import ContextId, UsageRecord
from terrarium.sessions import save_delta, save_turn_end, save_usage, save_user_input
with FsStore(sys.argv[1]) as store:
    head = store.get_head(ContextId.parse("cli:main"))
    save_user_input(store, head, "a live question")
    save_delta(store, head, [{"role": "assistant", "content": "a live answer"}])
    save_usage(store, head, UsageRecord("qwen", 1, 1))
    save_turn_end(store, head)
"""


def test_a_live_update_arrives(served: tuple[str, FsStore], page: Any, browser: Any) -> None:
    from playwright.sync_api import expect

    url, store = served
    page.goto(url + "/session?c=cli:main")
    overview = page.context.new_page()
    overview.goto(url + "/")
    before = int(overview.text_content("#total-messages") or "0")
    page.wait_for_function("document.body.hasAttribute('data-live')")
    subprocess.run([sys.executable, "-c", CHAT, str(store.root)], check=True, timeout=60)
    expect(page.locator("#transcript .body").last).to_have_text("a live answer", timeout=5000)
    expect(overview.locator("#total-messages")).to_have_text(str(before + 2), timeout=5000)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_token_is_enforced_off_loopback(tmp_path: Path, page: Any) -> None:
    store = FsStore(tmp_path / "sessions")
    seed(store)
    store.close()
    port = _free_port()
    command = [
        sys.executable,
        "-m",
        "terrarium",
        "serve",
        "--storage-dir",
        str(tmp_path / "sessions"),
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            first = proc.stdout.readline()
            token = proc.stdout.readline().strip().removeprefix("token: ")
            assert "?token=" in first and token
            base = f"http://127.0.0.1:{port}"
            response = None
            for _ in range(100):  # the server binds after printing: retry a refused connection
                try:
                    response = page.goto(base + "/")
                    break
                except Exception as exc:
                    refused = ("ERR_CONNECTION_REFUSED", "chrome-error://")  # not bound yet
                    if not any(sign in str(exc) for sign in refused):
                        raise
                    page.wait_for_timeout(100)
            assert response is not None and response.status == 401
            assert page.request.get(base + "/api/stats").status == 401
            page.goto(f"{base}/?token={token}")
            assert page.url == base + "/"
            assert page.text_content("#total-contexts") == "3"
            assert page.request.get(base + "/api/stats").status == 200  # the cookie
        finally:
            page.goto("about:blank")  # closes the live page's event stream
            proc.terminate()
            try:
                assert proc.wait(20) in (0, -15)  # it stops on SIGTERM (uvicorn re-raises it)
            finally:
                proc.kill()


def test_the_chart_range_is_picked_by_a_link(served: tuple[str, FsStore], page: Any) -> None:
    import datetime

    url, _ = served
    page.goto(url + "/")
    page.click("#ranges a[href='/?range=7d']")
    page.wait_for_url(re.compile(r".*range=7d$"))
    first = (datetime.datetime.now(datetime.UTC).date() - datetime.timedelta(6)).isoformat()
    assert page.locator("#range-shown").inner_text().startswith(first)
    assert page.locator("#ranges a.current").inner_text() == "last 7 days"
    assert page.locator("svg.chart rect").count() > 0  # today's messages


def test_archive_and_trash_from_the_browser(browser: Any, page: Any) -> None:
    """On a store with lifecycle states (MemoryStore): archive behind the confirmation, see
    the state, delete to the trash, restore from the trash page."""
    from terrarium.stores.memory import MemoryStore

    store = MemoryStore()
    seed(store)
    with serving(create_app(store, allow_writes=True)) as url, leaving(page):
        page.goto(url + "/session?c=cli:main")
        page.click("text=archive…")
        page.click("#confirm")
        page.wait_for_url(re.compile(r".*/session\?c=cli%3Amain$"))
        assert page.locator("#state").inner_text() == "archived"
        assert states.is_archived(store, ContextId.parse("cli:main"))
        page.click("text=delete to trash…")
        page.click("#confirm")
        page.wait_for_url(re.compile(r".*/sessions$"))
        page.goto(url + "/")
        assert page.text_content("#total-trashed") == "1"
        page.goto(url + "/trash")
        page.click("a.restore")
        page.click("#confirm")
        page.wait_for_url(re.compile(r".*/session\?c=cli%3Amain$"))
        assert page.locator("#state").inner_text() == "archived"  # restored as it was
        assert page.dialogs == []


def test_compact_from_the_browser(page: Any, tmp_path: Path, fake_server: FakeServer) -> None:
    """The compact link, its confirmation naming the model server, and the session page after:
    the head is a compaction segment whose summary is marked."""
    store = FsStore(tmp_path / "sessions")
    seed(store)
    long_turns(store, "cli:compacted")
    fake_server.reply = "SUMMARY: long questions, long answers"
    app = compacting_app(store, fake_server.base_url)
    try:
        with serving(app) as url, leaving(page):
            page.goto(url + "/session?c=cli:compacted")
            tree = page.locator("#tree li a").all_inner_texts()
            page.click("a[href^='/confirm?action=compact']")
            assert page.locator("form.confirm code").inner_text() == fake_server.base_url
            page.click("#confirm")
            page.wait_for_url(re.compile(r".*/session\?c=cli%3Acompacted$"))
            first = page.locator("#transcript li").first
            assert "compaction summary" in first.inner_text()
            tagged = [
                "compaction summary" in text
                for text in page.locator("#transcript li").all_inner_texts()
            ]
            assert tagged == [True, True] + [False] * (len(tagged) - 2) and len(tagged) > 2
            assert "SUMMARY: long questions" in first.inner_text()
            origin = page.locator("#tree li.current .origin").inner_text()
            assert origin.startswith("compaction at entry")
            after = page.locator("#tree li a").all_inner_texts()
            assert after[:-1] == tree and len(after) == len(tree) + 1  # the old ones stay
            assert page.dialogs == []
    finally:
        store.close()


def test_forks_into_other_contexts_link_both_ways(served: tuple[str, FsStore], page: Any) -> None:
    """The source's page lists its fork into another context; following it, the fork's
    "from cli:main" leads back."""
    url, store = served
    fork_context(store, "cli:main", "cli:main-experiment")
    with leaving(page):
        page.goto(url + "/session?c=cli:main")
        assert page.locator("#forks li").all_inner_texts() == ["cli:main-experiment"]
        page.click("#forks a")
        page.wait_for_url(re.compile(r".*/session\?c=cli%3Amain-experiment$"))
        origin = page.locator("#tree li .origin").first.inner_text()
        assert origin.endswith("from cli:main")
        page.click("#tree a.source")
        page.wait_for_url(re.compile(r".*/session\?c=cli%3Amain$"))


def test_the_polish_a_user_sees(served: tuple[str, FsStore], page: Any) -> None:
    """Titles, times as the CLI writes them (in UTC), figures with separators, whole 404
    text, an invalid id called invalid, a damaged session's page, the search type list."""
    url, store = served
    save_usage(store, head(store, "cli:main"), UsageRecord("big", 19794, 1234567, 0))
    with leaving(page):
        page.goto(url + "/")
        assert page.title() == "terrarium"
        assert re.fullmatch(r"\d{1,3}(,\d{3})+", page.locator(".card .n").nth(4).inner_text())
        page.goto(url + "/session?c=cli:main")
        assert page.title() == "cli:main · terrarium"
        stamps = page.locator("#transcript time").all_inner_texts()
        assert stamps and all(re.fullmatch(r"\S+ \d\d:\d\d UTC", t) for t in stamps)
        assert "1,234,567 completion" in page.locator("#transcript").inner_text()
        assert page.goto(url + "/session?c=cli:nope").status == 404
        assert page.locator("#error").inner_text() == "no session 'cli:nope'"
        assert page.goto(url + "/session?c=nope").status == 400
        assert page.locator("#error").inner_text().startswith("invalid session id 'nope'")
        page.goto(url + "/search?q=decorator")
        sessions_types = ["any", "cli", "irc"]
        assert page.locator("select[name=type] option").all_inner_texts() == sessions_types
        page.select_option("select[name=type]", "cli")
        page.click("form.filters button")
        page.wait_for_url(re.compile(r".*type=cli.*"))
        assert page.locator("ol.hits li").count() == 0  # the decorator talk is irc's
        path = damage(store, "Show code")
        assert page.goto(url + "/session?c=cli:main").status == 500
        assert page.locator("#error").inner_text().startswith(f"damaged session: {path}:3:")
        assert "terrarium fsck" in page.locator("#hint").inner_text()
