"""The package's public surface: one explicit __all__, holding the crate's names."""

from __future__ import annotations

import terrarium

# Every name src/lib.rs of the Rust session_store crate exports (seeds/002_...txt).
CRATE_NAMES = """
    SessionId SegmentId new_session_id new_segment_id
    create_segment create_segment_with_ids create_compacted_segment fork fork_at
    ensure_head_or_fork SegmentStartState SegmentOrigin
    append_entry append_system_item save_delta save_user_input save_turn_end
    save_run_completed save_run_errored save_usage save_config_changed save_extension
    save_pod_scope classify_history_item
    restore restore_by_segment collect_state LogEntry RestoredState PodScopeSnapshot
    POD_SCOPE_EXTENSION_DOMAIN
    Item ContentPart Role LoggedItem LoggedContentPart LoggedRole to_logged from_logged
    UsageRecord SystemItem render_pod_event
    PodMetadata PodMetadataStore PodActiveSegmentRef
    Store StoreError FsStore TraceEntry
""".split()

OURS = [
    "MemoryStore",
    "SqliteStore",
    "PostgresStore",
    "MultiContextManager",
    "PersistentSession",
    "VLLMClient",
    "rewind",
]


def test_every_name_in_all_resolves() -> None:
    """Nothing in __all__ is missing, and __all__ has no duplicates."""
    assert len(set(terrarium.__all__)) == len(terrarium.__all__)
    for name in terrarium.__all__:
        assert getattr(terrarium, name) is not None, name


def test_the_crate_names_are_exported() -> None:
    """A reader of the Rust crate finds every one of its names, and our backends."""
    missing = [n for n in [*CRATE_NAMES, *OURS] if n not in terrarium.__all__]
    assert missing == []


def test_public_module_attributes_are_in_all() -> None:
    """Every public class or function defined in the package's modules and imported into
    terrarium is listed in __all__ (no accidental public surface)."""
    public = {
        name
        for name, value in vars(terrarium).items()
        if not name.startswith("_")
        and getattr(value, "__module__", "").startswith("terrarium")
        and callable(value)
    }
    assert public - set(terrarium.__all__) == set()


def test_unknown_attribute_is_an_attribute_error() -> None:
    """The lazy loader does not swallow typos."""
    try:
        terrarium.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as exc:
        assert "NoSuchThing" in str(exc)
    else:
        raise AssertionError("expected AttributeError")
