"""The overview chart's date range (7d/30d/90d/all, or from-to) and the sessions list sorted
by tokens (from the activity tallies, with cursor pagination)."""

from __future__ import annotations

import datetime

import pytest
from starlette.testclient import TestClient

from helpers.web import seed, turn
from terrarium import FsStore
from terrarium.model import SegmentStartState
from terrarium.sessions import create_segment
from terrarium.web import create_app
from terrarium.web.data import BadRequest, chart_range
from test_web_app import LOCAL, parse

TODAY = "2026-11-25"


def test_ranges_end_today_and_fill_empty_days() -> None:
    active = ["2026-11-20", "2026-10-01", "2025-01-01"]
    week = chart_range("7d", None, None, active, TODAY)
    assert (week["from"], week["to"], week["range"]) == ("2026-11-19", TODAY, "7d")
    assert week["days"] == [f"2026-11-{d}" for d in range(19, 26)]
    assert len(chart_range(None, None, None, active, TODAY)["days"]) == 30  # 30d by default
    assert len(chart_range("90d", None, None, active, TODAY)["days"]) == 90


def test_all_spans_the_active_days_and_a_long_span_shows_only_those() -> None:
    every = chart_range("all", None, None, ["2026-11-20", "2025-01-01", "", "bad"], TODAY)
    assert (every["from"], every["to"]) == ("2025-01-01", "2026-11-20")
    assert every["days"] == ["2025-01-01", "2026-11-20"]  # 689 days: too long to fill
    short = chart_range("all", None, None, ["2026-11-20", "2026-11-18"], TODAY)
    assert short["days"] == ["2026-11-18", "2026-11-19", "2026-11-20"]
    assert chart_range("all", None, None, [], TODAY)["days"] == [TODAY]


def test_from_to_wins_over_the_range() -> None:
    chosen = chart_range("7d", "2026-01-30", "2026-02-02", [], TODAY)
    assert chosen["range"] == "custom"
    assert chosen["days"] == ["2026-01-30", "2026-01-31", "2026-02-01", "2026-02-02"]
    assert chart_range(None, "2026-11-24", None, [], TODAY)["days"] == ["2026-11-24", TODAY]


@pytest.mark.parametrize(
    ("range_", "start", "end", "message"),
    [
        ("1y", None, None, "range must be one of"),
        (None, "2026-13", None, "from must be a date"),
        (None, "2026-11-02", "2026-11-01", "is after to"),
    ],
)
def test_bad_ranges_are_refused(
    range_: str | None, start: str | None, end: str | None, message: str
) -> None:
    with pytest.raises(BadRequest, match=message):
        chart_range(range_, start, end, [], TODAY)


def test_the_overview_page_offers_the_ranges_and_draws_the_chosen_days(store: FsStore) -> None:
    seed(store)
    c = TestClient(create_app(store), base_url=LOCAL)
    today = datetime.datetime.now(datetime.UTC).date()
    stats = c.get("/api/stats", params={"range": "7d"}).json()
    assert stats["range"] == {
        "range": "7d",
        "from": (today - datetime.timedelta(6)).isoformat(),
        "to": today.isoformat(),
    }
    days = stats["messages_per_day"]
    assert len(days) == 7 and days[-1]["date"] == today.isoformat()
    assert sum(sum(d["by_type"].values()) for d in days) > 0  # the seed wrote today
    html = c.get("/", params={"range": "90d"}).text
    links = [
        a["href"] for t, a in parse(html).tags if t == "a" and a.get("href", "").startswith("/?")
    ]
    assert links == ["/?range=7d", "/?range=30d", "/?range=90d", "/?range=all"]
    assert 'href="/?range=90d" class="current"' in html
    first = (today - datetime.timedelta(89)).isoformat()
    assert f'fill="currentColor">{first}</text>' in html  # the axis starts 89 days ago
    old = c.get("/", params={"from": "2020-01-01", "to": "2020-01-03"}).text
    assert 'id="range-shown">2020-01-01 to 2020-01-03<' in old
    assert c.get("/api/stats", params={"range": "1y"}).status_code == 400


def test_sessions_sort_by_tokens_with_a_cursor(store: FsStore) -> None:
    seed(store)
    for i, rounds in enumerate((1, 3, 2)):
        context = f"cli:tok{i}"
        create_segment(store, SegmentStartState(), context=context)
        for _ in range(rounds):
            turn(store, context, "q", "a")  # 120 tokens a turn
    c = TestClient(create_app(store), base_url=LOCAL)
    first = c.get("/api/contexts", params={"sort": "tokens", "limit": 2}).json()
    assert [(r["context_id"], r["tokens"]) for r in first["contexts"]] == [
        ("cli:tok1", 360),
        ("cli:main", 295),
    ]
    rest = c.get(
        "/api/contexts", params={"sort": "tokens", "limit": 2, "cursor": first["next_cursor"]}
    ).json()
    assert [r["context_id"] for r in rest["contexts"]] == ["cli:tok2", "irc:#python"]  # 240, 120
    page = c.get("/sessions", params={"sort": "tokens"}).text
    assert "<option selected>tokens</option>" in page
    assert '<td class="num">360</td>' in page
