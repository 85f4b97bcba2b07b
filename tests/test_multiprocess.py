"""Many processes on one FsStore context: appends never lost, doubled or interleaved.

Each writer is a separate Python process (``tests/helpers/fs_child.py``) with its own FsStore;
they are released together once all are ready, so their appends really overlap.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from helpers.procs import Child, start_together
from terrarium import ContextId, FsStore, PodActiveSegmentRef, codec, create_segment, restore

CONTEXT = "cli:shared"


@pytest.fixture
def ref(store: FsStore) -> PodActiveSegmentRef:
    session_id, segment_id = create_segment(store, context=CONTEXT)
    return PodActiveSegmentRef(session_id, segment_id)


def _run_together(command: str, writers: int, **args: Any) -> list[dict[str, Any]]:
    """Run ``writers`` children of ``command`` at once; return each one's final message."""
    with ExitStack() as stack:
        children = [
            stack.enter_context(Child(command, writer=n, seed=n, **args)) for n in range(writers)
        ]
        start_together(children)
        results = []
        for child in children:
            [result] = child.finish()
            results.append(result)
    return results


def test_concurrent_appends_from_many_processes_are_whole_and_numbered(
    store: FsStore, ref: PodActiveSegmentRef
) -> None:
    """6 processes x 500 appends of up to 64 KB: every entry once, seqs 1..N, lines whole."""
    writers, count = 6, 500
    _run_together("mp_append", writers, root=str(store.root), context=CONTEXT, count=count)

    folder = store.folder_of(ContextId.parse(CONTEXT))
    assert folder is not None
    raw = (folder / f"{ref.segment_id}.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    lines = [codec.decode(line) for line in raw.split(b"\n")[:-1]]  # each line parses alone
    assert [line["seq"] for line in lines] == list(range(writers * count + 1))
    entries = lines[1:]
    tags = [line["tag"] for line in entries]
    assert Counter(tags) == Counter(f"{w}.{i}" for w in range(writers) for i in range(count))
    for writer in range(writers):  # each writer's own appends keep their order
        mine = [int(t.split(".")[1]) for t in tags if t.startswith(f"{writer}.")]
        assert mine == list(range(count))
    switches = sum(a.split(".")[0] != b.split(".")[0] for a, b in itertools.pairwise(tags))
    assert switches > writers  # the writers did overlap
    sizes = Counter(len(line["item"]["content"]) for line in entries)
    assert set(sizes) <= {10, 100, 1000, 8000, 30_000, 64_000}
    assert sizes[64_000] > 0

    state = restore(store, CONTEXT)
    assert state.next_seq == writers * count + 1
    assert state.torn == []
    assert store.next_seq(ref.session_id, ref.segment_id) == writers * count + 1
    assert [p.name for p in folder.iterdir() if ".torn-" in p.name] == []


def test_expected_seq_lets_exactly_one_process_win_each_seq(
    store: FsStore, ref: PodActiveSegmentRef
) -> None:
    """4 processes try every seq with expected_seq: one wins it, the others get ConflictError."""
    writers, count = 4, 150
    results = _run_together(
        "mp_expected", writers, root=str(store.root), context=CONTEXT, count=count
    )

    winners: dict[int, list[int]] = {seq: [] for seq in range(1, count + 1)}
    for writer, result in enumerate(results):
        assert sorted(result["won"] + result["lost"]) == list(range(1, count + 1))
        for seq in result["won"]:
            winners[seq].append(writer)
    assert all(len(w) == 1 for w in winners.values()), "a seq was won twice or not at all"
    assert sum(len(r["lost"]) for r in results) == (writers - 1) * count

    entries = store.read_segment(ref.session_id, ref.segment_id).entries
    assert [e["seq"] for e in entries] == list(range(1, count + 1))
    assert [e["tag"] for e in entries] == [f"{winners[s][0]}.{s}" for s in range(1, count + 1)]


def test_ensure_head_or_fork_keeps_every_writers_entries(
    store: FsStore, ref: PodActiveSegmentRef
) -> None:
    """Writers with stale views fork instead of clobbering: every acked entry is in the tree."""
    writers, count = 4, 60
    results = _run_together("mp_fork", writers, root=str(store.root), context=CONTEXT, count=count)

    acked = Counter(tag for result in results for tag in result["acked"])
    assert sum(acked.values()) == writers * count
    stored: Counter[str] = Counter()
    segments = store.list_segments(ref.session_id)
    for segment in segments:
        read = store.read_segment(ref.session_id, segment)
        assert [e["seq"] for e in read.entries] == list(range(1, len(read.entries) + 1))
        stored.update(e["tag"] for e in read.entries)
    assert stored == acked, "an entry was lost, or written twice"
    assert len(segments) > 1  # the writers did collide and fork

    head = store.get_head(ContextId.parse(CONTEXT))
    assert head is not None and head.segment_id in segments
    state = restore(store, CONTEXT)
    assert state.segment_id == head.segment_id


def test_concurrent_creation_of_one_context_has_exactly_one_winner(
    store: FsStore, root: Path
) -> None:
    """Processes racing to create the same contexts: one succeeds, the rest get ContextExists."""
    names = [f"irc:#race{n}" for n in range(20)]
    results = _run_together("mp_create", 4, root=str(root), contexts=names)

    for name in names:
        creators = [r["created"][name] for r in results if name in r["created"]]
        losers = [r for r in results if name in r["existed"]]
        assert len(creators) == 1, f"{name} was created {len(creators)} times"
        assert len(losers) == 3
        head = store.get_head(ContextId.parse(name))
        assert head is not None and str(head.session_id) == creators[0]
        state = restore(store, name)
        assert str(state.session_id) == creators[0]
        assert store.list_segments(head.session_id) == [head.segment_id]
    assert [h.context for h in store.list_contexts()] == sorted(names)
    folders = [d for day in (root / "irc").iterdir() for d in day.iterdir()]
    assert sorted(d.name for d in folders) == sorted(n.split(":", 1)[1] for n in names)
    trash = root / ".trash"
    assert not trash.exists() or os.listdir(trash) == []
    assert len(os.listdir(root / ".index" / "sessions")) == len(names)
