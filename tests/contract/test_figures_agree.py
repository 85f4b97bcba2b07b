"""Every surface gives the same figures, and search finds each live message once (issue 27).

Hypothesis draws a sequence of turns (a user and an assistant message, their usage for one of
two models, the turn's end, on a day of its choosing), forks into new contexts, compactions,
clears, rewinds, archives, unarchives and deletes (to the trash), runs it on a fresh store of
each backend, and then holds these to one another:

* a recount: ``restore`` of each hot context (messages, turns, tokens per model), and a model
  kept beside the store of which message each context holds (each a unique word, with its
  day), which says what every figure should be;
* ``terrarium stats --json`` (each context, and the totals), ``terrarium list --json``;
* the dashboard's ``/api/contexts`` and ``/api/stats`` (totals, tokens per model, messages
  per day: each message counted once, on the day it was first logged);
* ``search``: each word of a live message is found exactly once, in a context that holds it;
  a word no hot context holds is not found.

The command line runs in-process (click's runner), on the store's location where the backend
has one (a second instance, as another process would open), else on the same instance.
"""

from __future__ import annotations

import datetime
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from contract.conftest import BACKENDS
from terrarium import (
    ContextId,
    FsStore,
    contexts,
    create_compacted_segment,
    create_segment,
    lifecycle,
    states,
)
from terrarium import restore as restore_context
from terrarium.cli import cli
from terrarium.index._query import SearchQuery
from terrarium.search import search
from terrarium.stores.base import Lifecycle, NewEntry, Store
from terrarium.web import create_app

NAMES = ("cli:a", "cli:b", "irc:c", "irc:d")
MODELS = ("m1", "m2")
START = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

Op = tuple[Any, ...]

ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("turn"),
            st.sampled_from(NAMES),
            st.integers(0, 40),  # hours since the previous turn
            st.sampled_from(MODELS),
            st.integers(0, 900),
            st.integers(0, 900),
        ),
        st.tuples(st.just("fork"), st.sampled_from(NAMES), st.sampled_from(NAMES)),
        st.tuples(st.just("compact"), st.sampled_from(NAMES), st.integers(0, 3)),
        st.tuples(st.just("clear"), st.sampled_from(NAMES)),
        st.tuples(st.just("rewind"), st.sampled_from(NAMES), st.integers(1, 3)),
        st.tuples(st.just("archive"), st.sampled_from(NAMES)),
        st.tuples(st.just("unarchive"), st.sampled_from(NAMES)),
        st.tuples(st.just("delete"), st.sampled_from(NAMES)),
    ),
    min_size=1,
    max_size=14,
)


@dataclass
class World:
    """What the store should hold: each context's messages as (word, day), in order."""

    store: Store
    hot: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    archived: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    words: set[str] = field(default_factory=set)
    clock: datetime.datetime = START

    def word(self) -> str:
        """A new word no other message holds: letters only, one length, one token."""
        n = len(self.words)
        letters = "".join("abcdefghijklmnopqrstuvwxyz"[(n // 26**i) % 26] for i in range(4))
        found = f"kw{letters}"
        self.words.add(found)
        return found

    def free(self, name: str) -> bool:
        return name not in self.hot and name not in self.archived


def run(world: World, op: Op) -> None:
    """Apply ``op`` to the store and to the model, when it applies to the model's state."""
    store, kind, name = world.store, op[0], op[1]
    context = ContextId.parse(name)
    if kind == "turn" and name not in world.archived:
        turn(world, name, *op[2:])
    elif kind == "fork" and name in world.hot and world.free(op[2]):
        contexts.fork_context(store, context, ContextId.parse(op[2]))
        world.hot[op[2]] = list(world.hot[name])
    elif kind == "compact" and name in world.hot:
        compact(world, name, op[2])
    elif kind == "clear" and name in world.hot:
        contexts.clear_context(store, context)
        world.hot[name] = []
    elif kind == "rewind" and name in world.hot and 0 < op[2] <= len(world.hot[name]):
        contexts.rewind_context(store, context, op[2])
        del world.hot[name][-op[2] :]
    elif kind == "archive" and name in world.hot and isinstance(store, Lifecycle):
        assert states.archive_context(store, context) is not None
        world.archived[name] = world.hot.pop(name)
    elif kind == "unarchive" and name in world.archived and isinstance(store, Lifecycle):
        assert states.unarchive_context(store, context)
        world.hot[name] = world.archived.pop(name)
    elif kind == "delete" and name in world.hot:
        assert lifecycle.delete_context(store, context)
        del world.hot[name]


def turn(world: World, name: str, hours: int, model: str, prompt: int, completion: int) -> None:
    """One exchange logged ``hours`` after the last, with its usage and its end."""
    store = world.store
    if name not in world.hot:
        create_segment(store, context=name)
        world.hot[name] = []
    head = store.get_head(ContextId.parse(name))
    assert head is not None
    world.clock += datetime.timedelta(hours=hours, minutes=1)
    ts = world.clock.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    asked, answered = world.word(), world.word()
    usage = {"model": model, "prompt_tokens": prompt, "completion_tokens": completion}
    store.append(
        head.session_id,
        head.segment_id,
        [
            NewEntry("user_input", ts, {"item": {"role": "user", "content": asked}}),
            NewEntry("item", ts, {"item": {"role": "assistant", "content": answered}}),
            NewEntry("usage", ts, usage),
            NewEntry("turn_end", ts, {}),
        ],
    )
    world.hot[name] += [(asked, ts[:10]), (answered, ts[:10])]


def compact(world: World, name: str, keep: int) -> None:
    """A compaction into a summary (written now) and the last ``keep`` messages."""
    held = world.hot[name]
    keep = min(keep, len(held))
    state = restore_context(world.store, name)
    summary = world.word()
    kept = state.history[len(state.history) - keep :]
    create_compacted_segment(
        world.store, state, [{"role": "system", "content": summary}, *kept], context=name
    )
    today = datetime.datetime.now(datetime.UTC).date().isoformat()
    world.hot[name] = [(summary, today), *held[len(held) - keep :]]


# --------------------------------------------------------------------------- the surfaces

LOCAL = "http://127.0.0.1:8765"
INJECTED = "injected-store"


def location(store: Store) -> str:
    """Where the command line opens the store: a second instance on its files, or (memory,
    PostgreSQL in its own schema) this instance, handed over by :func:`opened`."""
    if isinstance(store, FsStore):
        return str(store.root)
    path = getattr(store, "path", None)
    return f"sqlite:///{path}" if isinstance(path, Path) else INJECTED


def cli_json(store: Store, *args: str) -> Any:
    """A command's ``--json`` output."""
    runner = CliRunner()
    result = runner.invoke(cli, [*args, "--json", "--storage-dir", location(store)])
    assert result.exit_code == 0, (args, result.output, result.exception)
    return json.loads(result.stdout)


def dashboard(store: Store) -> tuple[dict[str, Any], dict[str, Any]]:
    """``/api/stats`` and the first page of ``/api/contexts``."""
    with TestClient(create_app(store), base_url=LOCAL) as client:
        stats = client.get("/api/stats?range=all").json()
        listed = client.get("/api/contexts?limit=1000").json()
    return stats, listed


@dataclass
class Recount:
    """The figures of the hot contexts by ``restore`` and by the model."""

    messages: dict[str, int]
    turns: dict[str, int]
    tokens: dict[str, tuple[int, int]]
    """Per context: prompt and completion tokens."""
    per_model: dict[str, tuple[int, int]]
    per_day: dict[str, int]
    """Messages per day, each message once, on the day it was first logged."""


def recount(world: World) -> Recount:
    """The figures by ``restore`` of each hot context, checked against the model first."""
    messages, turns, tokens = {}, {}, {}
    per_model: Counter[tuple[str, int]] = Counter()
    days: dict[str, str] = {}
    for name, held in world.hot.items():
        state = restore_context(world.store, name)
        assert [item["content"] for item in state.history] == [w for w, _ in held], name
        messages[name], turns[name] = len(state.history), state.turns
        tokens[name] = (state.usage.prompt_tokens, state.usage.completion_tokens)
        for model, usage in state.usage_by_model.items():
            per_model[(model, 0)] += usage.prompt_tokens
            per_model[(model, 1)] += usage.completion_tokens
        days.update(held)
    models = {m: (per_model[(m, 0)], per_model[(m, 1)]) for m, _ in per_model}
    return Recount(messages, turns, tokens, models, dict(Counter(days.values())))


def check_cli(world: World, want: Recount) -> None:
    listed = cli_json(world.store, "list")["contexts"]
    assert {r["context_id"]: r["message_count"] for r in listed} == want.messages
    for name in world.hot:
        one = cli_json(world.store, "stats", name)
        usage = one["usage"]
        got = (
            one["message_count"],
            one["turns"],
            usage["prompt_tokens"],
            usage["completion_tokens"],
        )
        assert got == (want.messages[name], want.turns[name], *want.tokens[name]), name
    totals = cli_json(world.store, "stats")
    usage = totals["usage"]
    assert (totals["contexts"], totals["messages"], totals["turns"]) == (
        len(want.messages),
        sum(want.messages.values()),
        sum(want.turns.values()),
    )
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        sum(p for p, _ in want.tokens.values()),
        sum(c for _, c in want.tokens.values()),
    )


def check_dashboard(world: World, want: Recount) -> None:
    stats, listed = dashboard(world.store)
    rows = {r["context_id"]: (r["message_count"], r["tokens"]) for r in listed["contexts"]}
    assert rows == {n: (want.messages[n], sum(want.tokens[n])) for n in want.messages}
    totals = stats["totals"]
    assert (totals["contexts"], totals["messages"], totals["turns"]) == (
        len(want.messages),
        sum(want.messages.values()),
        sum(want.turns.values()),
    )
    per_model = {
        m: (t["prompt_tokens"], t["completion_tokens"])
        for m, t in stats["tokens_per_model"].items()
    }
    assert per_model == want.per_model
    per_day = {d["date"]: sum(d["by_type"].values()) for d in stats["messages_per_day"]}
    assert {d: n for d, n in per_day.items() if n} == want.per_day


def check_search(world: World) -> None:
    holders: dict[str, set[str]] = {}
    for name, held in world.hot.items():
        for word, _ in held:
            holders.setdefault(word, set()).add(name)
    for word in sorted(world.words):
        hits = search(world.store, SearchQuery(word))
        if word not in holders:
            assert hits == [], (word, hits)
            continue
        assert len(hits) == 1, (word, holders[word], hits)
        assert hits[0].context in holders[word], (word, hits)


# --------------------------------------------------------------------------- the property


@pytest.fixture
def fresh(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A maker of fresh, empty stores of ``backend`` (one per example), each closed when the
    next is made or the test ends (a PostgreSQL store holds a pool of connections); the
    command line opens the store :func:`location` names."""
    made: list[Store] = []

    def make() -> Store:
        if made:
            type(made[-1]).close(made[-1])
        store = BACKENDS[backend](tmp_path / f"example-{len(made)}", request)
        made.append(store)
        return store

    real = cli_module_open_store()
    patch = pytest.MonkeyPatch()
    patch.setattr(
        "terrarium.cli.app.open_store",
        lambda where, create=True: made[-1] if where == INJECTED else real(where, create=create),
    )
    try:
        yield make
    finally:
        patch.undo()
        if made:
            type(made[-1]).close(made[-1])


def cli_module_open_store() -> Any:
    from terrarium.cli import app

    return app.open_store


def check_every_surface(fresh: Any, sequence: list[Op]) -> None:
    """Run ``sequence`` on a fresh store; every surface must give the recount."""
    world = World(fresh())
    if location(world.store) == INJECTED:  # the command line must not close it
        world.store.close = lambda: None  # type: ignore[method-assign]
    for op in sequence:
        run(world, op)
    want = recount(world)
    check_cli(world, want)
    check_dashboard(world, want)
    check_search(world)


EXAMPLES = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


@settings(max_examples=8, **EXAMPLES)
@given(sequence=ops)
def test_every_surface_gives_the_recount(fresh: Any, sequence: list[Op]) -> None:
    """After any sequence of turns, forks, compactions, clears, rewinds, archives and deletes,
    ``stats``, ``list --json``, ``/api/stats`` and ``/api/contexts`` give the figures a recount
    from ``restore`` gives, and search finds each live message exactly once (8 sequences a
    backend; the long run is opt-in)."""
    check_every_surface(fresh, sequence)


@pytest.mark.slow
@settings(max_examples=25, **EXAMPLES)
@given(sequence=ops)
def test_every_surface_gives_the_recount_long(fresh: Any, sequence: list[Op]) -> None:
    """The same, 25 sequences a backend."""
    check_every_surface(fresh, sequence)
