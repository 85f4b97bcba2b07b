"""Large outputs as content-addressed blobs: the same behaviour on every backend."""

from __future__ import annotations

import pytest

import terrarium as t
from helpers.race_child import fsck
from terrarium.blobs import BLOBS_KEY, DEFAULT_THRESHOLD, PREVIEW_CHARS, LazyBlob, collect_garbage
from terrarium.errors import BlobNotFound
from terrarium.stores.base import BlobStore, Store

pytestmark = pytest.mark.ability.with_args(BlobStore)

BIG = "line of a large tool output\n" * 4000  # 112,000 bytes
OTHER = "é" * 40_000  # 80,000 bytes in 40,000 characters


def _tool(content: str, call: str = "c1") -> dict[str, object]:
    return {"role": "tool", "tool_call_id": call, "content": content}


def _context(store: Store, name: str = "cli:blobs") -> t.PodMetadata:
    t.create_segment(store, t.SegmentStartState(), context=name)
    head = store.get_head(t.ContextId.parse(name))
    assert head is not None
    return head


def test_large_output_is_stored_once_and_restored_whole(store: Store) -> None:
    """A string over the threshold leaves the log (preview + reference) and comes back whole."""
    assert isinstance(store, BlobStore)
    head = _context(store)
    t.save_delta(store, head, [_tool(BIG), _tool(BIG, "c2"), _tool("small", "c3")])
    lines = store.read_segment(head.session_id, head.segment_id).entries
    assert [len(line.get(BLOBS_KEY, [])) for line in lines] == [1, 1, 0]
    ref = lines[0][BLOBS_KEY][0]
    assert ref["path"] == ["item", "content"]
    assert ref["bytes"] == len(BIG.encode()) and ref["chars"] == len(BIG)
    assert lines[0]["item"]["content"].startswith(BIG[:PREVIEW_CHARS])
    assert len(lines[0]["item"]["content"]) < PREVIEW_CHARS + 200
    assert store.blob_digests() == [ref["sha256"]]  # identical outputs: one blob
    state = t.restore(store, "cli:blobs")
    assert [item["content"] for item in state.history] == [BIG, BIG, "small"]


def test_lazy_restore_reads_on_demand(store: Store) -> None:
    """``blobs="lazy"`` gives LazyBlob values with digest, size, preview and read()."""
    head = _context(store)
    t.save_delta(store, head, [_tool(OTHER)])
    value = t.restore(store, "cli:blobs", blobs="lazy").history[-1]["content"]
    assert isinstance(value, LazyBlob)
    assert (value.size, value.chars) == (len(OTHER.encode()), len(OTHER))
    assert value.preview.startswith(OTHER[:PREVIEW_CHARS])
    assert value.read() == OTHER
    stored = t.restore(store, "cli:blobs", blobs="stored").history[-1]["content"]
    assert stored == value.preview


def test_forks_and_copies_into_other_contexts_share_the_blob(store: Store) -> None:
    """A fork into another context (its header holds the history) refers to the same blob."""
    assert isinstance(store, BlobStore)
    head = _context(store)
    t.save_delta(store, head, [_tool(BIG)])
    forked = t.fork_context(store, "cli:blobs", "cli:copy")
    header = store.read_segment(forked.session_id, forked.segment_id).header
    assert header[BLOBS_KEY][0]["path"] == ["history", 0, "content"]
    assert len(store.blob_digests()) == 1
    assert t.restore(store, "cli:copy").history[0]["content"] == BIG
    t.create_compacted_segment(store, head, [_tool(BIG)], context="cli:blobs")
    assert t.restore(store, "cli:blobs").history == [_tool(BIG)]


def test_threshold_zero_keeps_everything_inline(store: Store) -> None:
    """With the threshold off, nothing goes to blobs."""
    assert isinstance(store, BlobStore)
    store.blob_threshold = 0
    head = _context(store)
    t.save_delta(store, head, [_tool(BIG)])
    line = store.read_segment(head.session_id, head.segment_id).entries[0]
    assert BLOBS_KEY not in line and line["item"]["content"] == BIG
    assert store.blob_digests() == []


def test_put_blob_is_idempotent_and_checked(store: Store) -> None:
    """put_blob returns the sha256 and stores once; a missing blob is a clear error."""
    assert isinstance(store, BlobStore)
    digest = store.put_blob(b"abc")
    assert digest == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert store.put_blob(b"abc") == digest and store.blob_digests() == [digest]
    assert store.has_blob(digest) and store.get_blob(digest) == b"abc"
    with pytest.raises(BlobNotFound, match="0" * 64):
        store.get_blob("0" * 64)
    with pytest.raises(ValueError, match="invalid blob digest"):
        store.get_blob("../../etc/passwd")


def test_garbage_collection_keeps_referenced_blobs(store: Store) -> None:
    """GC deletes exactly the blobs no log refers to (and spares young ones)."""
    assert isinstance(store, BlobStore)
    head = _context(store)
    t.save_delta(store, head, [_tool(BIG)])
    orphan = store.put_blob(b"nobody refers to me")
    assert collect_garbage(store) == 0  # too young
    assert collect_garbage(store, min_age=0) == 1
    assert not store.has_blob(orphan)
    assert t.restore(store, "cli:blobs").history[0]["content"] == BIG


def test_reserved_key_is_refused(store: Store) -> None:
    """Entry data may not set ``_blobs`` itself."""
    head = _context(store)
    with pytest.raises(t.InvalidEntry, match="_blobs"):
        t.append_entry(store, head, "item", {"item": _tool("x"), BLOBS_KEY: []})


def test_default_threshold() -> None:
    """The default threshold is 64 KiB."""
    assert DEFAULT_THRESHOLD == 65536


def test_a_lazily_restored_history_can_be_written_back(store: Store) -> None:
    """Items holding LazyBlob values write like the texts they stand for (compaction, forks)."""
    assert isinstance(store, BlobStore)
    head = _context(store)
    t.save_delta(store, head, [_tool(BIG)])
    state = t.restore(store, "cli:blobs", blobs="lazy")
    t.create_compacted_segment(store, state, state.history, context="cli:blobs")
    t.save_delta(store, t.restore(store, "cli:blobs"), state.history)
    assert [i["content"] for i in t.restore(store, "cli:blobs").history] == [BIG, BIG]
    assert len(store.blob_digests()) == 1


def test_fsck_passes_over_a_blob_collected_while_it_checked(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fsck lists the stored blobs, then reads each to check its digest: one that another
    process's blob collection took in between (its session purged) is no damage (the
    lifecycle race saw ``fsck --repair`` report such a blob as not stored, and fail)."""
    assert isinstance(store, BlobStore)
    head = _context(store)
    t.save_delta(store, head, [_tool(BIG)])
    assert t.states.purge_context(store, t.ContextId.parse("cli:blobs"))  # type: ignore[arg-type]
    listed = store.blob_digests

    def listed_then_collected() -> list[str]:
        monkeypatch.setattr(store, "blob_digests", listed)  # once
        found = listed()
        assert collect_garbage(store, min_age=0) == 1
        return found

    monkeypatch.setattr(store, "blob_digests", listed_then_collected)
    assert fsck(store, repair=False) == []
