"""Bad input given to a write is refused whole, as the library's own error, on every backend.

Lone surrogates (text UTF-8 cannot hold), values nested deeper than ``codec.MAX_DEPTH`` and
names that display misleadingly: each is one :class:`InvalidEntry` or
:class:`InvalidContextId`, and the store is as it was (no entry, no torn line, no half-made
context).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from terrarium import (
    ContextId,
    InvalidContextId,
    InvalidEntry,
    PodActiveSegmentRef,
    SegmentOrigin,
    SegmentStartState,
    Store,
    codec,
    create_segment,
    create_segment_with_ids,
    restore,
    save_delta,
    save_user_input,
    sessions,
    states,
)
from terrarium.model import new_segment_id, new_session_id

CTX = ContextId("cli", "main")


def nested(levels: int) -> Any:
    """A value that nests ``levels`` arrays deep."""
    value: Any = "x"
    for _ in range(levels):
        value = [value]
    return value


def item_nesting(levels: int) -> dict[str, Any]:
    """An assistant item whose line in the log nests exactly ``levels`` deep.

    The line's object is level 1 and the item level 2, so ``x`` holds ``levels - 2`` arrays.
    """
    return {"role": "assistant", "content": "deep", "x": nested(levels - 2)}


def snapshot(store: Store) -> tuple[Any, ...]:
    """What the store holds for CTX: its head and every line of its segments."""
    head = store.get_head(CTX)
    assert head is not None
    return (
        head,
        [
            store.read_segment(head.session_id, segment).entries
            for segment in store.list_segments(head.session_id)
        ],
    )


def files(store: Store) -> dict[str, bytes | None]:
    """Every file (with its bytes) and folder of a filesystem store but its locks and index."""
    root = getattr(store, "root", None)
    if not isinstance(root, Path):
        return {}
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
        if p.relative_to(root).parts[0] not in (".locks", ".index")
    }


def started(store: Store) -> PodActiveSegmentRef:
    create_segment(store, SegmentStartState(system_prompt="Be brief."), context=CTX)
    save_user_input(store, must_head(store), "hello")
    return must_head(store)


def must_head(store: Store) -> PodActiveSegmentRef:
    head = store.get_head(CTX)
    assert head is not None
    return PodActiveSegmentRef(head.session_id, head.segment_id)


@pytest.mark.parametrize("text", ["hi \ud800", "\udcff", "ok \U0001f600 then \udfff"])
def test_lone_surrogate_in_user_input_is_refused_and_nothing_written(
    store: Store, text: str
) -> None:
    """A lone surrogate in a message is InvalidEntry naming it; the log is unchanged."""
    ref = started(store)
    before, on_disk = snapshot(store), files(store)
    with pytest.raises(InvalidEntry, match=r"not valid Unicode: lone surrogate U\+D[89A-F]"):
        save_user_input(store, ref, text)
    assert snapshot(store) == before and files(store) == on_disk


def test_bad_entry_in_a_batch_writes_none_of_it(store: Store) -> None:
    """An append is all or nothing: one bad item refuses the good ones beside it."""
    ref = started(store)
    before, on_disk = snapshot(store), files(store)
    good = {"role": "assistant", "content": "fine"}
    for bad in ({"role": "user", "content": "\ud800"}, item_nesting(codec.MAX_DEPTH + 1)):
        with pytest.raises(InvalidEntry):
            save_delta(store, ref, [good, bad, good])
    assert snapshot(store) == before and files(store) == on_disk


@pytest.mark.parametrize("levels", [codec.MAX_DEPTH + 1, 990, 1000, 5000])
def test_item_nested_too_deeply_is_refused(store: Store, levels: int) -> None:
    """An item nested past the limit (or past Python's recursion limit) is InvalidEntry."""
    ref = started(store)
    before, on_disk = snapshot(store), files(store)
    with pytest.raises(InvalidEntry, match=f"more than {codec.MAX_DEPTH} levels deep"):
        save_delta(store, ref, [item_nesting(levels)])
    assert snapshot(store) == before and files(store) == on_disk
    assert len(restore(store, CTX).history) == 1


def test_item_at_the_depth_limit_is_written_and_restored(store: Store) -> None:
    """A line nested exactly MAX_DEPTH deep is accepted, and every backend reads it back."""
    ref = started(store)
    item = item_nesting(codec.MAX_DEPTH)
    save_delta(store, ref, [item])
    assert restore(store, CTX).history[-1] == item


def test_bad_header_creates_no_context(store: Store) -> None:
    """A new context whose header cannot be logged is refused before anything is made."""
    on_disk = files(store)
    for start in (
        SegmentStartState(system_prompt="\ud800"),
        SegmentStartState(config={"x": nested(1000)}),
    ):
        with pytest.raises(InvalidEntry):
            create_segment(store, start, context=CTX)
    assert store.get_head(CTX) is None
    assert store.list_contexts() == []
    assert files(store) == on_disk


@pytest.mark.parametrize(
    "name",
    ["abc\u202edef", "a\u2066b", "\u200fx", "x\u061c", "line\u2028two", "p\u2029", "a\u200bb"],
)
def test_new_context_with_misleading_name_is_refused(store: Store, name: str) -> None:
    """Creating or forking into a name with a bidi control or separator is InvalidContextId."""
    bad = ContextId("cli", name)
    with pytest.raises(InvalidContextId, match="display misleadingly"):
        create_segment(store, context=bad)
    started(store)
    with pytest.raises(InvalidContextId, match="display misleadingly"):
        sessions.fork_context(store, CTX, bad)
    assert [h.context for h in store.list_contexts()] == [str(CTX)]


def test_existing_context_with_misleading_name_stays_usable(store: Store) -> None:
    """A context an older version created with such a name is listed, read, written, deleted."""
    old = ContextId("cli", "abc\u202edef")
    create_segment_with_ids(
        store,
        new_session_id(),
        new_segment_id(),
        SegmentStartState(history=[{"role": "user", "content": "hello"}]),
        context=old,
        origin=SegmentOrigin("import", source="an older terrarium"),
    )
    assert [h.context for h in store.list_contexts()] == [str(old)]
    head = store.get_head(old)
    assert head is not None
    save_user_input(store, PodActiveSegmentRef(head.session_id, head.segment_id), "again")
    assert [i["content"] for i in restore(store, old).history] == ["hello", "again"]
    sessions.fork_context(store, old, CTX)
    assert states.delete_context(store, old)
    assert [h.context for h in store.list_contexts()] == [str(CTX)]
