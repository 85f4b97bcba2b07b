"""Contract: ``terrarium.search.search`` finds each message once, in the conversation a user
would open, on every backend (the store's index or the scan).

A hit names its place in its context's conversation (``restore(...).history[hit.message]``);
a hit on a branch that is no longer the head (cleared, compacted away, rewound) is left out,
or with ``all_branches`` marked ``branch="off"``; a fork's copies of a message are not hits
when the message is found where it was first written.
"""

from __future__ import annotations

from helpers.history import add_context
from terrarium.index._query import SearchHit, SearchQuery
from terrarium.model import ContextId, Item, SegmentStartState
from terrarium.search import search
from terrarium.sessions import (
    clear_segment,
    create_compacted_segment,
    create_segment,
    fork_context,
    restore,
    rewind,
    save_user_input,
)
from terrarium.stores.base import Store


def _texts(store: Store, hits: list[SearchHit]) -> list[tuple[str, str, str]]:
    """Each hit as (context, branch, text of the message at its place), checking the place:
    a head hit's ``message`` is the index of its item in the context's restored history."""
    found = []
    for hit in hits:
        if hit.branch == "head":
            assert hit.message is not None, hit
            item = restore(store, hit.context, blobs="stored").history[hit.message]
            assert isinstance(item, dict)
            found.append((hit.context, "head", str(item["content"])))
        else:
            assert hit.branch == "off" and hit.message is None, hit
            found.append((hit.context, "off", hit.snippet))
    return sorted(found)


def _all(text: str) -> SearchQuery:
    return SearchQuery(text, all_branches=True)


def test_a_cleared_history_is_found_only_with_all_branches(store: Store) -> None:
    """After a clear, the old messages are not in the conversation: not found by default,
    found and marked off with ``all_branches``; what follows the clear is found at its place."""
    add_context(store, "cli:a", "a walrus at sea", "nothing here")
    cleared = clear_segment(store, restore(store, "cli:a"), context="cli:a")
    assert search(store, "walrus") == []
    assert _texts(store, search(store, _all("walrus"))) == [("cli:a", "off", "a walrus at sea")]
    head = store.get_head(ContextId.parse("cli:a"))
    assert head is not None and head.segment_id == cleared
    save_user_input(store, head, "a second walrus")
    hits = search(store, "walrus")
    assert _texts(store, hits) == [("cli:a", "head", "a second walrus")]
    assert hits[0].message == 0


def test_a_rewound_item_is_found_only_with_all_branches(store: Store) -> None:
    """``rewind`` (the Agents SDK's ``pop_item``) takes the item out of the conversation: the
    search no longer finds it, except with ``all_branches``, marked off."""
    add_context(store, "cli:a", "first walrus", "second walrus")
    rewind(store, "cli:a", 1)
    assert _texts(store, search(store, "walrus")) == [("cli:a", "head", "first walrus")]
    assert _texts(store, search(store, _all("walrus"))) == [
        ("cli:a", "head", "first walrus"),
        ("cli:a", "off", "second walrus"),
    ]


def test_a_message_copied_by_forks_is_found_once_in_its_source(store: Store) -> None:
    """Three forks into other contexts copy the message: one hit, in the source context, at
    its place; once the source no longer holds it, one fork's copy by default, each fork's
    with ``all_branches``."""
    add_context(store, "cli:src", "hello", "the walrus speaks")
    for name in ("cli:f1", "cli:f2", "cli:f3"):
        fork_context(store, "cli:src", name)
    hits = search(store, "walrus")
    assert _texts(store, hits) == [("cli:src", "head", "the walrus speaks")]
    assert hits[0].message == 1
    assert search(store, SearchQuery("walrus", limit=1)) == hits  # copies score as the original
    clear_segment(store, restore(store, "cli:src"), context="cli:src")
    copies = [(c, "head", "the walrus speaks") for c in ("cli:f1", "cli:f2", "cli:f3")]
    (hit,) = _texts(store, search(store, "walrus"))
    assert hit in copies
    assert _texts(store, search(store, _all("walrus"))) == copies


def test_a_copy_of_a_copy_is_found_once(store: Store) -> None:
    """A fork of a fork holds a copy of the same original: once the source no longer holds
    it, the default search finds it once (found by tests/contract/test_figures_agree.py)."""
    add_context(store, "cli:b", "the walrus speaks")
    fork_context(store, "cli:b", "cli:a")
    fork_context(store, "cli:a", "irc:c")
    state = restore(store, "cli:b")
    create_compacted_segment(store, state, [Item.assistant("a summary")], context="cli:b")
    (hit,) = _texts(store, search(store, "walrus"))
    assert hit in [("cli:a", "head", "the walrus speaks"), ("irc:c", "head", "the walrus speaks")]


def test_a_compaction_keeps_its_turns_findable_once(store: Store) -> None:
    """The turns a compaction keeps are found once, where the head's conversation has them
    (its header's history); the ones it summarized away only with ``all_branches``."""
    add_context(store, "cli:a", "alpha walrus", "beta walrus", "gamma walrus")
    state = restore(store, "cli:a")
    summary = Item.assistant("summary of two messages")
    create_compacted_segment(store, state, [summary, state.history[-1]], context="cli:a")
    hits = search(store, "walrus")
    assert _texts(store, hits) == [("cli:a", "head", "gamma walrus")]
    assert hits[0].message == 1 and hits[0].seq == 0
    assert _texts(store, search(store, _all("walrus"))) == [
        ("cli:a", "head", "gamma walrus"),
        ("cli:a", "off", "alpha walrus"),
        ("cli:a", "off", "beta walrus"),
    ]


def test_hits_name_their_place_in_the_conversation(store: Store) -> None:
    """Each hit's ``message`` is its item's index in the restored history, not its seq."""
    add_context(store, "cli:a", *[f"line {n} of many" for n in range(6)], "the walrus line")
    add_context(store, "cli:b", "walrus first", "then more", "walrus again")
    imported = [Item.user("ok"), Item.user("a walrus in a header"), Item.user("more walrus")]
    create_segment(store, SegmentStartState(history=imported), context="web:imported")
    hits = search(store, SearchQuery("walrus", limit=10))
    assert sorted((h.context, h.message) for h in hits) == [
        ("cli:a", 6),
        ("cli:b", 0),
        ("cli:b", 2),
        ("web:imported", 1),
        ("web:imported", 2),
    ]
    _texts(store, hits)


def test_the_limit_counts_the_hits_kept(store: Store) -> None:
    """Hits left out (other branches, copies) do not take places of the limit."""
    add_context(store, "cli:a", *[f"walrus {n}" for n in range(5)])
    clear_segment(store, restore(store, "cli:a"), context="cli:a")
    add_context(store, "cli:b", "walrus kept", "walrus too")
    assert _texts(store, search(store, SearchQuery("walrus", limit=2))) == [
        ("cli:b", "head", "walrus kept"),
        ("cli:b", "head", "walrus too"),
    ]
