"""Writing and reading back search test data the same way in any store."""

from __future__ import annotations

from typing import Any

from terrarium.model import ContextId, Item, SegmentStartState
from terrarium.sessions import (
    clear_segment,
    create_compacted_segment,
    create_segment,
    fork_at,
    restore,
    save_delta,
    save_user_input,
)
from terrarium.stores.base import PodMetadata, SearchHit, Store


def add_context(store: Store, context: str, *texts: str, role: str = "user") -> PodMetadata:
    """Create ``context`` and log ``texts`` as items of ``role``."""
    create_segment(store, None, context=context)
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    if texts:
        save_delta(store, head, [{"role": role, "content": text} for text in texts])
    return head


def snippets(hits: list[SearchHit]) -> list[str]:
    """Each hit's snippet, in order."""
    return [hit.snippet for hit in hits]


def places(hits: list[SearchHit]) -> set[tuple[str, int]]:
    """Where the hits are: the set of (context, seq)."""
    return {(hit.context, hit.seq) for hit in hits}


def user_item(text: str) -> dict[str, Any]:
    """A user message item."""
    return {"role": "user", "content": text}


def build_history(store: Store) -> None:
    """The same history in any store: several contexts, roles, a fork, a compaction, a clear,
    and a deleted context."""
    texts = [
        "The quick brown fox jumps over the lazy dog",
        "A quick reply: the fox is quick",
        "Dogs and foxes are not the same animal",
        "café society meets in the café",
        "東京タワーは東京にあります",
        "The brown bear, the brown fox and the red fox",
    ]
    add_context(store, "cli:main", *texts[:3])
    head = add_context(store, "irc:#python", *texts[3:])
    save_delta(store, head, [Item.assistant("the fox answered quickly"), Item.system("fox alert")])
    fork_at(store, head, 2)
    state = restore(store, "irc:#python")
    create_compacted_segment(store, state, [Item.assistant("summary: a fox story")], context=None)
    other = add_context(store, "game:run-1", "no animals here", "a fox appears", role="assistant")
    clear_segment(store, restore(store, "game:run-1"), context="game:run-1")
    save_user_input(store, other, "after the clear, the fox again")
    create_segment(
        store,
        SegmentStartState(history=[Item.user("imported fox memories"), Item.assistant("ok")]),
        context="web:imported",
    )
    add_context(store, "cli:gone", "a fox that is deleted")
    store.delete_context(ContextId("cli", "gone"))
