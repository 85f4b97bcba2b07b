"""Property tests of the log layer: random operation sequences against an in-test model.

A hypothesis state machine drives a MemoryStore, an FsStore and a SqliteStore (fresh directory
per example) through the same random operations: user input, assistant items, system items,
usage, config changes, extensions, turn and run ends, unknown entry kinds, fork, fork_at,
compaction, clear, head moves, stale writers and fork_context, switching between branches as it
goes. Next to them it keeps its own model, plain lists and dicts of what each segment must
restore to after every entry. Every touched segment is checked after each step, every segment
ever created at the end, and the stores must agree with each other entry for entry. The
stores' fast listings (message counts and last activity kept by their derived indexes) must
match the model and a restore whenever they are checked, which is a rule of its own, so that
the indexes are also checked after falling several steps behind the log.
"""

from __future__ import annotations

import copy
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from terrarium import (
    ContextId,
    FsStore,
    MemoryStore,
    PodActiveSegmentRef,
    RestoredState,
    RunStatus,
    SegmentId,
    SegmentStartState,
    SessionId,
    SqliteStore,
    Store,
    SystemItem,
    UsageRecord,
    UsageTotals,
    append_entry,
    append_system_item,
    clear_segment,
    create_compacted_segment,
    create_segment,
    ensure_head_or_fork,
    fork,
    fork_at,
    fork_context,
    read_entries,
    render_pod_event,
    restore_by_segment,
    save_config_changed,
    save_delta,
    save_extension,
    save_run_completed,
    save_run_errored,
    save_turn_end,
    save_usage,
    save_user_input,
)
from terrarium.index import listing as lister
from terrarium.index._listing import Listing
from terrarium.model import item_role

# --------------------------------------------------------------------------- strategies

texts = st.text(max_size=12)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | texts
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
configs = st.dictionaries(st.text(max_size=6), json_values, max_size=3)
prompts = st.none() | texts
indexes = st.integers(min_value=0, max_value=1_000)
tokens = st.integers(min_value=0, max_value=100_000)


@st.composite
def history_items(draw: st.DrawFn) -> dict[str, Any]:
    """A logged item of any role and shape the log must keep verbatim."""
    shape = draw(
        st.sampled_from(["user", "assistant", "system", "call", "result", "parts", "responses"])
    )
    text = draw(texts)
    if shape == "call":
        call_id = draw(st.text("abc123", min_size=1, max_size=4))
        item: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": "f", "arguments": text}}
            ],
        }
    elif shape == "result":
        item = {"role": "tool", "tool_call_id": "c", "content": text}
    elif shape == "responses":  # a Responses API item, of a known type or not, any keys
        kinds = ["message", "reasoning", "function_call", "function_call_output", "x_new"]
        keys = st.text(max_size=6).filter(lambda key: key not in ("type", "role"))
        item = {"type": draw(st.sampled_from(kinds)), "text": text}
        item.update(draw(st.dictionaries(keys, json_values, max_size=3)))
    elif shape == "parts":
        item = {
            "role": draw(st.sampled_from(["user", "assistant"])),
            "content": [
                {"type": "text", "text": text},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}},
            ],
        }
    else:
        item = {"role": shape, "content": text}
    if draw(st.booleans()):
        item["audio"] = draw(json_values)  # a key this version does not know
    return item


# --------------------------------------------------------------------------- the model


@dataclass
class Snap:
    """What a segment must restore to after one of its entries."""

    history: list[dict[str, Any]]
    system_prompt: str | None
    config: dict[str, Any]
    usage: tuple[int, int, int, int] = (0, 0, 0, 0)
    """prompt, completion, cached tokens, calls."""
    turns: int = 0
    extensions: dict[str, Any] = field(default_factory=dict)
    last_run: tuple[Literal["completed", "errored"], int, str | None] | None = None
    failed: frozenset[int] = frozenset()
    """History indices of failed runs (docs/format.md §6)."""
    run_start: int = 0
    """Where the run under way began: the history's length at the last run's end."""

    def ended(self, errored: bool) -> dict[str, Any]:
        """The changes a run's end makes: ``run_errored`` fails the run's last block of user
        inputs and what follows it (found scanning forward, unlike the code's backward walk)."""
        failed = set(self.failed)
        if errored:
            block = None
            for i in range(self.run_start, len(self.history)):
                user = item_role(self.history[i]) == "user"
                if user and (block is None or item_role(self.history[i - 1]) != "user"):
                    block = i
            if block is not None:
                failed.update(range(block, len(self.history)))
        return {"failed": frozenset(failed), "run_start": len(self.history)}


@dataclass
class Seg:
    """One segment of the model: its snapshots (index = seq) and its ids in each store."""

    context: str
    origin: tuple[str, int | None, int | None]
    """(kind, parent segment index, at_seq)."""
    snaps: list[Snap]
    ids: dict[str, tuple[SessionId, SegmentId]] = field(default_factory=dict)

    @property
    def next_seq(self) -> int:
        return len(self.snaps)

    @property
    def last(self) -> Snap:
        return self.snaps[-1]

    def push(self, **changes: Any) -> None:
        """Record one entry that changes the state by ``changes``."""
        self.snaps.append(replace(copy.deepcopy(self.last), **changes))


class LogMachine(RuleBasedStateMachine):
    """MemoryStore, FsStore and SqliteStore against a model of every segment's expected state."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.stores: dict[str, Store] = {
            "memory": MemoryStore(),
            "fs": FsStore(f"{self.tmp.name}/fs"),
            "sqlite": SqliteStore(f"{self.tmp.name}/terrarium.db"),
        }
        self.segs: list[Seg] = []
        self.heads: dict[str, int] = {}
        self.current = 0
        self.copies = 0

    def teardown(self) -> None:
        try:
            if self.segs:
                for index in range(len(self.segs)):
                    self.check(index)
                    self.check_prefixes(index)
                self.check_tree()
                self.listings_match_the_model()
        finally:
            for store in self.stores.values():
                store.close()
            self.tmp.cleanup()

    # ------------------------------------------------------------------ helpers

    def ref(self, name: str, index: int) -> PodActiveSegmentRef:
        return PodActiveSegmentRef(*self.segs[index].ids[name])

    @property
    def seg(self) -> Seg:
        return self.segs[self.current]

    def write(self, action: Any) -> list[Any]:
        """Run ``action(store, ref)`` on the current segment of every store."""
        return [action(store, self.ref(name, self.current)) for name, store in self.stores.items()]

    def add_segment(self, seg: Seg, results: dict[str, SegmentId]) -> int:
        for name, segment_id in results.items():
            parent = self.segs[seg.origin[1]] if seg.origin[1] is not None else None
            session_id = parent.ids[name][0] if parent is not None else None
            assert session_id is not None
            seg.ids[name] = (session_id, segment_id)
        self.segs.append(seg)
        return len(self.segs) - 1

    def restored(self, name: str, index: int) -> RestoredState:
        session_id, segment_id = self.segs[index].ids[name]
        return restore_by_segment(self.stores[name], session_id, segment_id)

    def check(self, index: int) -> None:
        """Both stores restore segment ``index`` to the model's state, and agree entry by entry."""
        seg = self.segs[index]
        want = seg.last
        entries = {}
        for name in self.stores:
            got = self.restored(name, index)
            assert got.history == want.history
            assert set(got.failed) == want.failed
            assert got.system_prompt == want.system_prompt
            assert got.config == want.config
            assert got.usage == UsageTotals(*want.usage)
            assert got.turns == want.turns
            assert got.extensions == want.extensions
            assert got.last_run == (RunStatus(*want.last_run) if want.last_run else None)
            assert got.next_seq == seg.next_seq
            assert got.context == seg.context
            kind, parent, at_seq = seg.origin
            assert (got.origin.kind, got.origin.at_seq) == (kind.removesuffix("_context"), at_seq)
            if parent is not None:
                assert got.origin.parent == self.segs[parent].ids[name][1]
            store = self.stores[name]
            assert store.next_seq(*seg.ids[name]) == seg.next_seq
            lines = read_entries(store, self.ref(name, index))
            entries[name] = [(e.seq, e.kind, dict(e.data)) for e in lines[1:]]
        assert entries["memory"] == entries["fs"] == entries["sqlite"]

    def check_prefixes(self, index: int) -> None:
        """Restoring up to each entry of a segment yields the model's state after that entry."""
        seg = self.segs[index]
        for name, store in self.stores.items():
            for seq, want in enumerate(seg.snaps):
                got = restore_by_segment(store, *seg.ids[name], stop_seq=seq)
                assert (got.history, got.system_prompt, got.config) == (
                    want.history,
                    want.system_prompt,
                    want.config,
                )
                assert (got.usage, got.turns, got.extensions) == (
                    UsageTotals(*want.usage),
                    want.turns,
                    want.extensions,
                )
                assert got.last_run == (RunStatus(*want.last_run) if want.last_run else None)
                assert set(got.failed) == want.failed
                assert got.next_seq == seq + 1

    def check_tree(self) -> None:
        """Each session lists exactly the segments made in it, oldest first."""
        for name, store in self.stores.items():
            sessions: dict[SessionId, list[SegmentId]] = {}
            for seg in self.segs:
                session_id, segment_id = seg.ids[name]
                sessions.setdefault(session_id, []).append(segment_id)
            for session_id, segment_ids in sessions.items():
                assert store.list_segments(session_id) == segment_ids

    # ------------------------------------------------------------------ start

    @initialize(prompt=prompts, config=configs, history=st.lists(history_items(), max_size=3))
    def start(self, prompt: str | None, config: dict[str, Any], history: list[Any]) -> None:
        start = SegmentStartState(system_prompt=prompt, config=config, history=history)
        seg = Seg("cli:main", ("root", None, None), [Snap(list(history), prompt, dict(config))])
        for name, store in self.stores.items():
            seg.ids[name] = create_segment(store, start, context="cli:main")
        self.segs.append(seg)
        self.heads["cli:main"] = 0

    # ------------------------------------------------------------------ writes

    @rule(text=texts)
    def user_input(self, text: str) -> None:
        self.write(lambda store, ref: save_user_input(store, ref, text))
        self.seg.push(history=[*self.seg.last.history, {"role": "user", "content": text}])

    @rule(items=st.lists(history_items(), min_size=1, max_size=4))
    def delta(self, items: list[dict[str, Any]]) -> None:
        self.write(lambda store, ref: save_delta(store, ref, items))
        for n in range(len(items)):
            self.seg.push(history=[*self.seg.last.history, *items[n : n + 1]])

    @rule(event=st.sampled_from(["resumed", "tool_denied"]), detail=configs)
    def system_item(self, event: str, detail: dict[str, Any]) -> None:
        item = SystemItem(event, detail)
        self.write(lambda store, ref: append_system_item(store, ref, item))
        rendered = {"role": "system", "content": render_pod_event(item)}
        self.seg.push(history=[*self.seg.last.history, rendered])

    @rule(prompt=tokens, completion=tokens, cached=tokens)
    def usage(self, prompt: int, completion: int, cached: int) -> None:
        record = UsageRecord("m", prompt, completion, cached)
        self.write(lambda store, ref: save_usage(store, ref, record))
        p, c, k, n = self.seg.last.usage
        self.seg.push(usage=(p + prompt, c + completion, k + cached, n + 1))

    @rule(config=configs, keep=st.booleans(), prompt=prompts)
    def config_changed(self, config: dict[str, Any], keep: bool, prompt: str | None) -> None:
        if keep:
            self.write(lambda store, ref: save_config_changed(store, ref, config))
            self.seg.push(config=dict(config))
        else:
            self.write(
                lambda store, ref: save_config_changed(store, ref, config, system_prompt=prompt)
            )
            self.seg.push(config=dict(config), system_prompt=prompt)

    @rule(domain=st.sampled_from(["memory", "game", "terrarium.pod_scope"]), data=json_values)
    def extension(self, domain: str, data: Any) -> None:
        self.write(lambda store, ref: save_extension(store, ref, domain, data))
        self.seg.push(extensions={**self.seg.last.extensions, domain: data})

    @rule()
    def turn_end(self) -> None:
        self.write(save_turn_end)
        self.seg.push(turns=self.seg.last.turns + 1, **self.seg.last.ended(False))

    @rule(reason=st.none() | st.sampled_from(["stop", "length"]))
    def run_completed(self, reason: str | None) -> None:
        self.write(lambda store, ref: save_run_completed(store, ref, finish_reason=reason))
        self.seg.push(last_run=("completed", self.seg.next_seq, None), **self.seg.last.ended(False))

    @rule(error=texts)
    def run_errored(self, error: str) -> None:
        self.write(lambda store, ref: save_run_errored(store, ref, error))
        self.seg.push(last_run=("errored", self.seg.next_seq, error), **self.seg.last.ended(True))

    # Envelope keys are left out of the data: tests/contract/test_append.py's
    # test_envelope_keys_in_data_cannot_rewrite_the_envelope checks they are refused.
    @rule(
        kind=st.sampled_from(["hologram", "x-future"]),
        data=st.dictionaries(
            st.text(max_size=6).filter(lambda k: k not in ("v", "seq", "ts", "kind")),
            json_values,
            max_size=3,
        ),
    )
    def unknown_kind(self, kind: str, data: dict[str, Any]) -> None:
        self.write(lambda store, ref: append_entry(store, ref, kind, data))
        self.seg.push()

    # ------------------------------------------------------------------ branches

    @rule(index=indexes)
    def switch(self, index: int) -> None:
        """Write to another branch from now on."""
        self.current = index % len(self.segs)

    @rule()
    def fork_tail(self) -> None:
        parent = self.seg
        at = parent.next_seq - 1
        results = dict(zip(self.stores, self.write(fork), strict=True))
        seg = Seg(parent.context, ("fork", self.current, at), [copy.deepcopy(parent.last)])
        self.current = self.add_segment(seg, results)

    @rule(point=indexes)
    def fork_past(self, point: int) -> None:
        parent = self.seg
        at = point % parent.next_seq
        results = dict(zip(self.stores, self.write(lambda s, r: fork_at(s, r, at)), strict=True))
        seg = Seg(parent.context, ("fork", self.current, at), [copy.deepcopy(parent.snaps[at])])
        self.current = self.add_segment(seg, results)

    def _restart(self, kind: str, history: list[Any], prompt: str | None) -> None:
        parent = self.seg
        context = parent.context if self.heads[parent.context] == self.current else None
        if kind == "clear":
            results = self.write(lambda s, r: clear_segment(s, r, context=context))
        else:
            results = self.write(
                lambda s, r: create_compacted_segment(
                    s, r, history, context=context, system_prompt=prompt
                )
            )
        last = parent.last
        snap = Snap(
            history=list(history),
            system_prompt=last.system_prompt if prompt is None else prompt,
            config=copy.deepcopy(last.config),
            usage=last.usage,
            turns=last.turns,
            extensions=copy.deepcopy(last.extensions),
        )
        seg = Seg(parent.context, (kind, self.current, parent.next_seq - 1), [snap])
        self.current = self.add_segment(seg, dict(zip(self.stores, results, strict=True)))
        if context is not None:
            self.heads[context] = self.current

    @rule(summary=st.lists(history_items(), max_size=3), prompt=st.none() | texts)
    def compact(self, summary: list[Any], prompt: str | None) -> None:
        self._restart("compaction", summary, prompt)

    @rule()
    def clear(self) -> None:
        self._restart("clear", [], None)

    @rule(index=indexes)
    def move_head(self, index: int) -> None:
        """Move the current context's head to one of its segments (compare-and-set)."""
        context = self.seg.context
        mine = [i for i, seg in enumerate(self.segs) if seg.context == context]
        target = mine[index % len(mine)]
        for name, store in self.stores.items():
            store.set_head(
                ContextId.parse(context),
                self.segs[target].ids[name][1],
                expected=self.segs[self.heads[context]].ids[name][1],
            )
        self.heads[context] = target

    @rule(view=indexes)
    def stale_writer(self, view: int) -> None:
        """A writer with a view of the current segment (maybe stale) asks where to append."""
        seg = self.seg
        expected = 1 + view % seg.next_seq
        fresh = self.heads[seg.context] == self.current and expected == seg.next_seq
        results = self.write(lambda s, r: ensure_head_or_fork(s, seg.context, r, expected))
        if fresh:
            assert results == [seg.ids[name][1] for name in self.stores]
            return
        fork_seg = Seg(
            seg.context,
            ("fork", self.current, expected - 1),
            [copy.deepcopy(seg.snaps[expected - 1])],
        )
        self.current = self.add_segment(fork_seg, dict(zip(self.stores, results, strict=True)))
        self.heads[seg.context] = self.current

    @rule()
    def copy_context(self) -> None:
        """fork_context: copy the current context's head into a new context."""
        source = self.seg.context
        head = self.segs[self.heads[source]]
        self.copies += 1
        target = f"web:copy{self.copies}"
        last = head.last
        snap = Snap(  # failed runs are not copied; figures start afresh (counted once)
            history=[copy.deepcopy(h) for i, h in enumerate(last.history) if i not in last.failed],
            system_prompt=last.system_prompt,
            config=copy.deepcopy(last.config),
            extensions=copy.deepcopy(last.extensions),
        )
        seg = Seg(target, ("fork_context", self.heads[source], head.next_seq - 1), [snap])
        for name, store in self.stores.items():
            created = fork_context(store, source, target)
            seg.ids[name] = (created.session_id, created.segment_id)
            assert created.session_id != head.ids[name][0]
        self.segs.append(seg)
        self.heads[target] = len(self.segs) - 1

    # ------------------------------------------------------------------ checks

    @invariant()
    def current_segment_restores_to_the_model(self) -> None:
        if self.segs:
            self.check(self.current)

    @invariant()
    def heads_match_the_model(self) -> None:
        for name, store in self.stores.items():
            heads = {h.context: h.segment_id for h in store.list_contexts()}
            assert heads == {ctx: self.segs[i].ids[name][1] for ctx, i in self.heads.items()}

    @rule()
    def listings_match_the_model(self) -> None:
        """A rule, not an invariant: the derived indexes must also be right after they have
        fallen several steps behind the log."""
        for name, store in self.stores.items():
            if not isinstance(lister(store), Listing):
                continue
            listed = {summary.context: summary for summary in lister(store).list_contexts_fast()}
            assert listed.keys() == self.heads.keys()
            for context, index in self.heads.items():
                summary = listed[context]
                assert summary.message_count == len(self.segs[index].last.history), name
                state = restore_by_segment(store, *self.segs[index].ids[name])
                assert summary.last_active == state.last_active, name
                assert summary.head == str(self.segs[index].ids[name][1])


# 15 runs of 50 steps call each of the ~20 rules about 35 times; the long run is opt-in.
LogMachine.TestCase.settings = settings(max_examples=15, stateful_step_count=50, deadline=None)
TestLog = LogMachine.TestCase


@pytest.mark.slow
class TestLogLong(LogMachine.TestCase):
    """The same machine, 60 runs of 50 steps."""

    settings = settings(max_examples=60, stateful_step_count=50, deadline=None)
