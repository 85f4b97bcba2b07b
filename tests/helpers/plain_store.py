"""``PlainStore``: a store with only the ``Store`` protocol, for tests of what callers do
when a store has none of the optional abilities (no lifecycle, no blobs, no listing)."""

from __future__ import annotations

from terrarium.stores.memory import MemoryStore


class PlainStore:
    """A ``MemoryStore`` seen through the ``Store`` protocol's methods alone."""

    def __init__(self) -> None:
        self.inner = MemoryStore()


for _name in (
    "get_head set_head list_contexts create_context delete_context create_session "
    "attach_context detached_sessions create_segment append read_segment next_seq "
    "list_segments append_trace read_trace close"
).split():
    setattr(PlainStore, _name, lambda self, *a, _n=_name, **k: getattr(self.inner, _n)(*a, **k))
