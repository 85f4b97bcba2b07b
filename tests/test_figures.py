"""One conversation, one set of figures (issue: forks and compactions kept their copies' times
and usage; `stats` and the dashboard disagreed).

A message copied by ``fork_context`` or kept by a compaction keeps its original time, usage
and identity (``history_from`` in the new header); the dashboard's messages per day count each
message once, on the day it was logged; `stats`, the API's contexts and its totals give the
same tokens and turns, carried over compactions, not over forks into other contexts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from terrarium import (
    ContextId,
    FsStore,
    create_compacted_segment,
    create_segment,
    fork_context,
    restore,
    sessions,
    states,
)
from terrarium.contexts import clear_context, get_stats
from terrarium.lifecycle import delete_context
from terrarium.stores.base import NewEntry
from terrarium.web import create_app

OLD = "2026-01-05"


def _old_turn(store: FsStore, context: str, n: int) -> None:
    """A turn logged on 2026-01-05, with its usage (model m)."""
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    ts = f"{OLD}T10:0{n}:00.000000Z"
    store.append(
        head.session_id,
        head.segment_id,
        [
            NewEntry("user_input", ts, {"item": {"role": "user", "content": f"q{n}"}}),
            NewEntry("item", ts, {"item": {"role": "assistant", "content": f"a{n}"}}),
            NewEntry("usage", ts, {"model": "m", "prompt_tokens": 100 * (n + 1)}),
            NewEntry("turn_end", ts, {}),
        ],
    )


@pytest.fixture
def store(tmp_path: Path) -> FsStore:
    """cli:slow with three old turns; cli:f2 forked from it today; cli:packed compacted."""
    fs = FsStore(tmp_path / "sessions")
    for name in ("cli:slow", "cli:packed"):
        create_segment(fs, context=name)
        for n in range(3):
            _old_turn(fs, name, n)
    fork_context(fs, "cli:slow", "cli:f2")
    packed = restore(fs, "cli:packed")
    summary = [{"role": "system", "content": "Summary of q0 and q1."}]
    create_compacted_segment(fs, packed, [*summary, *packed.history[-2:]], context="cli:packed")
    return fs


def _messages(store: FsStore, context: str) -> list[sessions.Message]:
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    return sessions.messages(sessions.lineage(store, head.session_id, head.segment_id))


def test_a_fork_copy_keeps_its_time_usage_and_identity(store: FsStore) -> None:
    source, copy = _messages(store, "cli:slow"), _messages(store, "cli:f2")
    assert [m.item for m in copy] == [m.item for m in source]
    assert [m.ts for m in copy] == [m.ts for m in source]
    assert all(m.ts.startswith(OLD) for m in copy)
    assert [m.usage for m in copy] == [m.usage for m in source]
    assert copy[1].usage == {"model": "m", "prompt_tokens": 100}
    slow = store.get_head(ContextId.parse("cli:slow"))
    assert slow is not None
    assert {m.source["session_id"] for m in copy if m.source} == {str(slow.session_id)}
    assert [m.source["seq"] for m in copy if m.source] == [m.seq for m in source]


def test_a_compaction_keeps_the_kept_turns_times(store: FsStore) -> None:
    packed = _messages(store, "cli:packed")
    assert [m.summary for m in packed] == [True, False, False]
    assert packed[0].ts > OLD + "T23"  # the summary: written today
    assert [m.ts for m in packed[1:]] == [f"{OLD}T10:02:00.000000Z"] * 2
    assert packed[2].usage == {"model": "m", "prompt_tokens": 300}


def _api(store: FsStore, path: str) -> Any:
    with TestClient(create_app(store), base_url="http://127.0.0.1:8765") as client:
        response = client.get(path)
        assert response.status_code == 200, response.text
        return response.json()


def test_the_transcript_shows_a_copy_at_its_original_time(store: FsStore) -> None:
    page = _api(store, "/api/context?c=cli:f2")
    assert [m["ts"][:10] for m in page["messages"]] == [OLD] * 6
    assert page["messages"][1]["usage"]["prompt_tokens"] == 100


def test_messages_per_day_count_each_message_once(store: FsStore) -> None:
    stats = _api(store, f"/api/stats?from={OLD}&to={OLD}")
    (day,) = stats["messages_per_day"]
    # the conversations' messages, each on the day it was logged, once: cli:slow's 6 and the
    # two turns cli:packed's compaction kept; not the fork's copies (counted in cli:slow), not
    # the compaction's summary (written today)
    assert day == {"date": OLD, "by_type": {"cli": 8}}
    today = _api(store, "/api/stats?range=7d")["messages_per_day"][-1]
    assert today["by_type"] == {"cli": 1}


def test_stats_and_the_dashboard_give_the_same_figures(store: FsStore) -> None:
    listed = _api(store, "/api/contexts?sort=tokens")
    tokens = {row["context_id"]: row["tokens"] for row in listed["contexts"]}
    totals = _api(store, "/api/stats")["totals"]
    turns = 0
    for context in ("cli:slow", "cli:f2", "cli:packed"):
        stats = get_stats(store, ContextId.parse(context))
        usage = stats["usage"]
        assert tokens[context] == usage["prompt_tokens"] + usage["completion_tokens"], context
        turns += stats["turns"]
    assert (tokens["cli:slow"], tokens["cli:f2"], tokens["cli:packed"]) == (600, 0, 600)
    assert totals["turns"] == turns == 6
    assert totals["prompt_tokens"] == 1200


@pytest.mark.parametrize("fate", ["compacted away", "cleared", "deleted", "archived"])
def test_a_fork_copy_counts_once_its_source_no_longer_holds_it(tmp_path: Path, fate: str) -> None:
    """A fork's copies are counted in the source while its conversation holds them; once the
    source no longer does (compacted away, cleared, deleted, archived), in the fork, once,
    however many forks hold them (found by tests/contract/test_figures_agree.py)."""
    fs = FsStore(tmp_path / "sessions")
    create_segment(fs, context="cli:b")
    _old_turn(fs, "cli:b", 0)
    fork_context(fs, "cli:b", "cli:a")
    fork_context(fs, "cli:b", "cli:a2")
    source = ContextId.parse("cli:b")
    if fate == "compacted away":
        state = restore(fs, "cli:b")
        create_compacted_segment(fs, state, [{"role": "system", "content": "s"}], context=source)
    elif fate == "cleared":
        clear_context(fs, source)
    elif fate == "deleted":
        delete_context(fs, source)
    else:
        assert states.archive_context(fs, source) is not None
    (day,) = _api(fs, f"/api/stats?from={OLD}&to={OLD}")["messages_per_day"]
    assert day == {"date": OLD, "by_type": {"cli": 2}}


def test_stats_and_the_api_give_one_set_of_totals_with_a_legacy_file(store: FsStore) -> None:
    """``stats --json``'s totals and ``/api/stats`` are one definition: the per-context stats
    summed (estimated parts too), and a legacy file beside the store counted in contexts and
    messages only (the seed's format has no usage or turns; a ``usage`` key it does not know
    counts nowhere)."""
    import json

    from click.testing import CliRunner

    from terrarium.cli import cli

    head = store.get_head(ContextId.parse("cli:slow"))
    assert head is not None
    estimated = {"model": "m", "prompt_tokens": 7, "completion_tokens": 3, "estimated": "chars"}
    store.append(
        head.session_id, head.segment_id, [NewEntry("usage", f"{OLD}T11:00:00Z", estimated)]
    )
    seed = {
        "session_id": "chan",
        "context_type": "irc",
        "system_prompt": "",
        "messages": [
            {
                "role": "user",
                "content": "hi",
                "timestamp": "2025-11-06T14:30:00",
                "usage": estimated,
            },
            {"role": "assistant", "content": "yo", "timestamp": "2025-11-06T14:30:01"},
        ],
        "metadata": {"created_at": "2025-11-06T14:30:00", "last_active": "2025-11-06T14:30:01"},
    }
    folder = store.root / "irc" / "2025-11-06"
    folder.mkdir(parents=True)
    (folder / "chan.json").write_text(json.dumps(seed))
    result = CliRunner().invoke(cli, ["stats", "--json", "--storage-dir", str(store.root)])
    assert result.exit_code == 0, result.output
    totals = json.loads(result.stdout)
    hot = [get_stats(store, ContextId.parse(c)) for c in ("cli:slow", "cli:f2", "cli:packed")]
    assert totals["usage"] == {k: sum(s["usage"][k] for s in hot) for k in totals["usage"]}
    assert totals["usage"]["estimated_prompt_tokens"] == 7
    assert totals["turns"] == sum(s["turns"] for s in hot)
    assert (totals["contexts"], totals["legacy"], totals["damaged"]) == (4, 1, 0)
    assert totals["by_type"]["irc"] == {"contexts": 1, "messages": 2}
    api = _api(store, "/api/stats")
    assert api["per_type"] == totals["by_type"]
    figures = ("contexts", "messages", "turns", "damaged")
    assert {k: api["totals"][k] for k in figures} == {k: totals[k] for k in figures}
    tokens = ("prompt_tokens", "completion_tokens", "cached_tokens", "estimated_calls")
    assert {k: api["totals"][k] for k in tokens} == {k: totals["usage"][k] for k in tokens}
