"""Contract: contexts and heads (create, get, set, list, delete, isolation)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from terrarium import (
    ConflictError,
    ContextExists,
    ContextId,
    ContextNotFound,
    PodActiveSegmentRef,
    SegmentNotFound,
    Store,
    create_segment,
    fork,
    new_segment_id,
    new_session_id,
    restore,
    restore_by_segment,
    save_delta,
    save_user_input,
    states,
)
from terrarium.stores.base import Lifecycle, NewEntry

CLI_MAIN = ContextId("cli", "main")


def _ref(store: Store, context: ContextId) -> PodActiveSegmentRef:
    head = store.get_head(context)
    assert head is not None
    return head.ref


def _texts(store: Store, context: str | ContextId) -> list[str]:
    return [item["content"] for item in restore(store, context).history]


def test_get_head_of_unknown_context_is_none(store: Store) -> None:
    """get_head returns None for a context that was never created."""
    assert store.get_head(CLI_MAIN) is None
    assert store.list_contexts() == []


def test_create_context_stores_header_and_head(store: Store) -> None:
    """create_context writes the header as seq 0 and a head naming that root segment."""
    session_id, segment_id = new_session_id(), new_segment_id()
    header = {
        "v": 1,
        "ts": "2026-01-02T03:04:05.000006Z",
        "kind": "header",
        "session_id": str(session_id),
        "segment_id": str(segment_id),
        "context": "cli:main",
        "origin": {"kind": "root"},
        "system_prompt": "be brief",
        "config": {"model": "m"},
        "history": [],
    }
    head = store.create_context(CLI_MAIN, header)
    assert (head.context, head.session_id, head.segment_id) == ("cli:main", session_id, segment_id)
    assert head.created_at == "2026-01-02T03:04:05.000006Z"
    assert head.date == "2026-01-02"
    assert store.get_head(CLI_MAIN) == head
    read = store.read_segment(session_id, segment_id)
    assert read.header == {**header, "seq": 0}
    assert read.entries == []
    assert read.next_seq == 1
    assert store.next_seq(session_id, segment_id) == 1
    assert store.list_segments(session_id) == [segment_id]


def test_create_context_refuses_a_session_id_in_use(store: Store) -> None:
    """A second context on a session id that exists is a conflict; the first keeps its log."""
    created = create_segment(store, context="cli:main")
    save_user_input(store, _ref(store, CLI_MAIN), "kept")
    header = {
        "v": 1,
        "ts": "2026-01-02T03:04:05.000006Z",
        "kind": "header",
        "session_id": str(created[0]),
        "segment_id": str(new_segment_id()),
        "context": "cli:other",
        "origin": {"kind": "root"},
        "history": [],
    }
    with pytest.raises(ConflictError):
        store.create_context(ContextId("cli", "other"), header)
    assert store.get_head(ContextId("cli", "other")) is None
    assert _texts(store, CLI_MAIN) == ["kept"]
    assert store.list_segments(created[0]) == [created[1]]
    detached = {**header, "session_id": str(new_session_id()), "context": None}
    store.create_session(detached)  # a session of no context is in use too
    with pytest.raises(ConflictError):
        store.create_context(ContextId("cli", "other"), {**detached, "context": "cli:other"})
    assert store.get_head(ContextId("cli", "other")) is None


def test_create_segment_api_makes_the_context_head(store: Store) -> None:
    """sessions.create_segment creates the context with its root segment as the head."""
    session_id, segment_id = create_segment(store, context="irc:#python")
    head = store.get_head(ContextId("irc", "#python"))
    assert head is not None
    assert (head.context, head.session_id, head.segment_id) == (
        "irc:#python",
        session_id,
        segment_id,
    )
    state = restore(store, "irc:#python")
    assert (state.session_id, state.segment_id, state.context) == (
        session_id,
        segment_id,
        "irc:#python",
    )
    assert state.origin.kind == "root"
    assert state.history == []
    assert state.next_seq == 1


def test_create_existing_context_raises_and_keeps_the_original(store: Store) -> None:
    """Creating a context that exists raises ContextExists and leaves the original untouched."""
    session_id, segment_id = create_segment(store, context=CLI_MAIN)
    save_user_input(store, PodActiveSegmentRef(session_id, segment_id), "hello")
    with pytest.raises(ContextExists, match="cli:main"):
        create_segment(store, context=CLI_MAIN)
    head = store.get_head(CLI_MAIN)
    assert head is not None
    assert (head.session_id, head.segment_id) == (session_id, segment_id)
    assert _texts(store, CLI_MAIN) == ["hello"]


def test_set_head_moves_the_head_when_expected_matches(store: Store) -> None:
    """set_head with the current head as ``expected`` moves the head to the new segment."""
    session_id, root = create_segment(store, context=CLI_MAIN)
    branch = fork(store, PodActiveSegmentRef(session_id, root))
    moved = store.set_head(CLI_MAIN, branch, expected=root)
    assert (moved.session_id, moved.segment_id) == (session_id, branch)
    head = store.get_head(CLI_MAIN)
    assert head is not None
    assert head.segment_id == branch
    assert head.created_at == moved.created_at
    assert restore(store, CLI_MAIN).segment_id == branch


def test_set_head_with_a_stale_expected_raises_conflict(store: Store) -> None:
    """set_head whose ``expected`` is not the head raises ConflictError; the head stays."""
    session_id, root = create_segment(store, context=CLI_MAIN)
    ref = PodActiveSegmentRef(session_id, root)
    first, second = fork(store, ref), fork(store, ref)
    store.set_head(CLI_MAIN, first, expected=root)
    with pytest.raises(ConflictError):
        store.set_head(CLI_MAIN, second, expected=root)
    assert _ref(store, CLI_MAIN).segment_id == first


def test_set_head_of_unknown_context_raises_context_not_found(store: Store) -> None:
    """set_head on a context that does not exist raises ContextNotFound."""
    with pytest.raises(ContextNotFound):
        store.set_head(CLI_MAIN, new_segment_id(), expected=new_segment_id())


def test_set_head_to_another_sessions_segment_is_refused(store: Store) -> None:
    """A head can only name a segment of its own session (SegmentNotFound otherwise)."""
    _, root = create_segment(store, context=CLI_MAIN)
    _, other_root = create_segment(store, context="cli:other")
    with pytest.raises(SegmentNotFound):
        store.set_head(CLI_MAIN, other_root, expected=root)
    with pytest.raises(SegmentNotFound):
        store.set_head(CLI_MAIN, new_segment_id(), expected=root)
    assert _ref(store, CLI_MAIN).segment_id == root


def test_list_contexts_is_sorted_by_context_id(store: Store) -> None:
    """list_contexts returns every head sorted by (type, name), whatever the creation order."""
    names = ["web:session_abc", "irc:python", "cli:main", "irc:#python", "game:pokemon_run1"]
    names += ["cli:alpha", "irc:Zed", "cli:main2"]
    for name in names:
        create_segment(store, context=name)
    listed = [head.context for head in store.list_contexts()]
    assert listed == [
        "cli:alpha",
        "cli:main",
        "cli:main2",
        "game:pokemon_run1",
        "irc:#python",
        "irc:Zed",
        "irc:python",
        "web:session_abc",
    ]


def test_list_contexts_is_sorted_like_context_ids(store: Store) -> None:
    """list_contexts orders by (type, name), as ContextId does, even where the text differs."""
    for context in ("a-b:y", "a:x", "ab:z", "a:x-1", "b:#1"):
        create_segment(store, None, context=context)
    heads = [head.context for head in store.list_contexts()]
    assert heads == [str(c) for c in sorted(ContextId.parse(h) for h in heads)]
    assert heads[0] == "a:x"


def test_list_contexts_filters_by_type(store: Store) -> None:
    """list_contexts(type) returns only that type's contexts; an unknown type gives []."""
    for name in ["irc:python", "cli:main", "irc:#python", "ircx:python"]:
        create_segment(store, context=name)
    assert [h.context for h in store.list_contexts("irc")] == ["irc:#python", "irc:python"]
    assert [h.context for h in store.list_contexts("cli")] == ["cli:main"]
    assert store.list_contexts("web") == []


def test_list_contexts_reports_the_current_head(store: Store) -> None:
    """list_contexts returns the same head records as get_head, including moved heads."""
    session_id, root = create_segment(store, context=CLI_MAIN)
    create_segment(store, context="cli:b")
    branch = fork(store, PodActiveSegmentRef(session_id, root))
    store.set_head(CLI_MAIN, branch, expected=root)
    listed = {head.context: head for head in store.list_contexts()}
    assert listed == {
        "cli:main": store.get_head(CLI_MAIN),
        "cli:b": store.get_head(ContextId("cli", "b")),
    }
    assert listed["cli:main"].segment_id == branch


def test_delete_context_takes_its_whole_session_out_of_reach(store: Store) -> None:
    """delete_context removes the head; the session waits in the trash, where nothing writes
    to it by reference (SegmentNotFound); once purged, nothing reads it either. A second
    delete returns False."""
    session_id, root = create_segment(store, context=CLI_MAIN)
    ref = PodActiveSegmentRef(session_id, root)
    save_user_input(store, ref, "secret")
    branch = fork(store, ref)
    assert states.delete_context(store, CLI_MAIN) is True
    assert store.get_head(CLI_MAIN) is None
    assert store.list_contexts() == []
    with pytest.raises(ContextNotFound):
        restore(store, CLI_MAIN)
    with pytest.raises(SegmentNotFound):
        store.append(session_id, root, [NewEntry("turn_end", "2026-01-01T00:00:00Z", {})])
    assert states.delete_context(store, CLI_MAIN) is False
    if isinstance(store, Lifecycle):
        (entry,) = states.trashed_contexts(store)
        assert states.purge_trashed(store, entry.trash_id)
    for segment_id in (root, branch):
        with pytest.raises(SegmentNotFound):
            store.read_segment(session_id, segment_id)
    with pytest.raises(SegmentNotFound):
        store.list_segments(session_id)


def test_delete_unknown_context_returns_false(store: Store) -> None:
    """delete_context of a context that never existed returns False and changes nothing."""
    create_segment(store, context="cli:other")
    assert states.delete_context(store, CLI_MAIN) is False
    assert [h.context for h in store.list_contexts()] == ["cli:other"]


def test_delete_leaves_other_contexts_untouched(store: Store) -> None:
    """Deleting one context keeps every other context's head and entries."""
    for name in ("irc:python", "irc:#python"):
        session_id, segment_id = create_segment(store, context=name)
        save_user_input(store, PodActiveSegmentRef(session_id, segment_id), f"in {name}")
    assert states.delete_context(store, ContextId("irc", "python")) is True
    assert [h.context for h in store.list_contexts()] == ["irc:#python"]
    assert _texts(store, "irc:#python") == ["in irc:#python"]


def test_deleted_context_can_be_recreated_fresh(store: Store) -> None:
    """A deleted context can be created again: a new session with none of the old entries."""
    old_session, old_root = create_segment(store, context=CLI_MAIN)
    save_user_input(store, PodActiveSegmentRef(old_session, old_root), "old")
    states.delete_context(store, CLI_MAIN)
    new_session, new_root = create_segment(store, context=CLI_MAIN)
    assert new_session != old_session
    assert restore(store, CLI_MAIN).history == []
    assert store.list_segments(new_session) == [new_root]
    save_user_input(store, PodActiveSegmentRef(new_session, new_root), "new")
    assert _texts(store, CLI_MAIN) == ["new"]
    with pytest.raises(SegmentNotFound):  # the old session is in the trash: not written
        save_user_input(store, PodActiveSegmentRef(old_session, old_root), "stale")


def test_contexts_never_see_each_others_entries(store: Store) -> None:
    """Entries appended to one context never appear in another (irc:#python vs irc:python)."""
    names = ["irc:#python", "irc:python", "cli:main", "web:python"]
    refs = {}
    for name in names:
        session_id, segment_id = create_segment(store, context=name)
        refs[name] = PodActiveSegmentRef(session_id, segment_id)
    for round_ in range(3):
        for name in names:
            save_delta(
                store,
                refs[name],
                [{"role": "user", "content": f"{name} {round_}"}],
            )
    for name in names:
        assert _texts(store, name) == [f"{name} {i}" for i in range(3)]
        assert store.list_segments(refs[name].session_id) == [refs[name].segment_id]
        assert restore(store, name).next_seq == 4
    assert len({ref.session_id for ref in refs.values()}) == len(names)


def test_a_fork_stays_in_its_own_session(store: Store) -> None:
    """Forks and new segments of one context never show up in another context's session."""
    a_session, a_root = create_segment(store, context="irc:#python")
    b_session, b_root = create_segment(store, context="irc:python")
    fork(store, PodActiveSegmentRef(a_session, a_root))
    assert len(store.list_segments(a_session)) == 2
    assert store.list_segments(b_session) == [b_root]
    with pytest.raises(SegmentNotFound):
        store.read_segment(b_session, a_root)


@pytest.mark.parametrize(
    "name",
    [
        "#python",
        "main",
        "a:b",
        "CON",
        "nul.txt",
        "...",
        " padded ",
        ".hidden",
        "trailing.",
        "100%",
        "%2F",
        "back\\slash",
        'quo"te<>|?*',
        "日本語 チャンネル",
        "emoji 🐍",
    ],
)
def test_any_valid_context_name_is_stored_and_listed_as_is(store: Store, name: str) -> None:
    """Any valid context name can be created, restored and listed under its exact name."""
    context = ContextId("irc", name)
    session_id, segment_id = create_segment(store, context=context)
    save_user_input(store, PodActiveSegmentRef(session_id, segment_id), name)
    assert [h.context for h in store.list_contexts()] == [f"irc:{name}"]
    assert restore(store, context).history == [{"role": "user", "content": name}]
    assert states.delete_context(store, context) is True
    assert store.list_contexts() == []


def test_a_context_name_of_the_maximum_length_can_be_created(
    store: Store, xfail_on: Callable[..., None]
) -> None:
    """A name whose encoding is exactly MAX_NAME_BYTES (255) long is a valid, storable name."""
    context = ContextId("cli", "n" * 255)
    session_id, segment_id = create_segment(store, context=context)
    save_user_input(store, PodActiveSegmentRef(session_id, segment_id), "long")
    assert [h.context for h in store.list_contexts()] == [str(context)]
    assert restore(store, context).history == [{"role": "user", "content": "long"}]


def test_create_segment_in_unknown_session_raises_segment_not_found(store: Store) -> None:
    """create_segment needs an existing session."""
    header = {
        "v": 1,
        "ts": "2026-01-01T00:00:00Z",
        "kind": "header",
        "session_id": str(new_session_id()),
        "segment_id": str(new_segment_id()),
        "context": None,
        "origin": {"kind": "root"},
        "history": [],
    }
    with pytest.raises(SegmentNotFound):
        store.create_segment(new_session_id(), header)


def test_restore_by_segment_of_unknown_segment_raises_segment_not_found(store: Store) -> None:
    """Reading a segment that does not exist raises SegmentNotFound, in any session."""
    session_id, _ = create_segment(store, context=CLI_MAIN)
    with pytest.raises(SegmentNotFound):
        restore_by_segment(store, session_id, new_segment_id())
    with pytest.raises(SegmentNotFound):
        store.read_segment(new_session_id(), new_segment_id())
    with pytest.raises(SegmentNotFound):
        store.next_seq(session_id, new_segment_id())
    with pytest.raises(SegmentNotFound):
        store.list_segments(new_session_id())
