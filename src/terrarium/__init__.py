"""terrarium: durable, forkable, searchable conversation sessions for LLM agents.

The package re-exports its whole public API here; the names of the log layer are those of
the Rust ``session_store`` crate the design comes from (functions in snake_case, types as
they are), so a reader of that crate finds every piece.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from terrarium.errors import (
    BadResponse,
    ConflictError,
    ContextExists,
    ContextNotFound,
    ContextTooLong,
    CorruptLog,
    FormatVersionError,
    InvalidContextId,
    InvalidEntry,
    InvalidQuery,
    LLMError,
    ModelNotFound,
    RateLimited,
    SegmentNotFound,
    ServerUnreachable,
    SessionAttached,
    StoreError,
    StoreURLError,
    TerrariumError,
)
from terrarium.model import (
    FORMAT_VERSION,
    POD_SCOPE_EXTENSION_DOMAIN,
    ContentPart,
    ContextId,
    EntryKind,
    ImagePart,
    Item,
    LogEntry,
    LoggedContentPart,
    LoggedItem,
    LoggedRole,
    PodScopeSnapshot,
    ReasoningPart,
    RestoredState,
    Role,
    RunStatus,
    SegmentId,
    SegmentOrigin,
    SegmentStartState,
    SessionId,
    SystemItem,
    TextPart,
    ToolCallPart,
    TornTail,
    TraceEntry,
    UsageRecord,
    UsageTotals,
    from_logged,
    new_segment_id,
    new_session_id,
    render_pod_event,
    to_logged,
)
from terrarium.sessions import (
    append_entries,
    append_entry,
    append_system_item,
    attach_context,
    classify_history_item,
    clear_segment,
    collect_state,
    create_compacted_segment,
    create_segment,
    create_segment_with_ids,
    detached_sessions,
    ensure_head_or_fork,
    fork,
    fork_at,
    fork_context,
    read_entries,
    restore,
    restore_by_segment,
    save_config_changed,
    save_delta,
    save_extension,
    save_pod_scope,
    save_run_completed,
    save_run_errored,
    save_trace,
    save_turn_end,
    save_usage,
    save_user_input,
)
from terrarium.stores.base import (
    ContextLocking,
    PodActiveSegmentRef,
    PodMetadata,
    PodMetadataStore,
    Store,
)
from terrarium.stores.fs import FsStore
from terrarium.stores.memory import MemoryStore
from terrarium.stores.sqlite import SqliteStore
from terrarium.stores.url import open_store

if TYPE_CHECKING:
    from terrarium.agent.multi_context_manager import MultiContextManager
    from terrarium.agent.session_manager import PersistentSession
    from terrarium.llm.vllm_client import VLLMClient
    from terrarium.stores.postgres import PostgresStore

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # The runtime pulls in the openai client, and psycopg is an optional extra: import each
    # only when asked for.
    if name == "MultiContextManager":
        from terrarium.agent.multi_context_manager import MultiContextManager

        return MultiContextManager
    if name == "PersistentSession":
        from terrarium.agent.session_manager import PersistentSession

        return PersistentSession
    if name == "VLLMClient":
        from terrarium.llm.vllm_client import VLLMClient

        return VLLMClient
    if name == "PostgresStore":
        from terrarium.stores.postgres import PostgresStore

        return PostgresStore
    raise AttributeError(f"module 'terrarium' has no attribute {name!r}")


__all__ = [
    "FORMAT_VERSION",
    "POD_SCOPE_EXTENSION_DOMAIN",
    "BadResponse",
    "ConflictError",
    "ContentPart",
    "ContextExists",
    "ContextId",
    "ContextLocking",
    "ContextNotFound",
    "ContextTooLong",
    "CorruptLog",
    "EntryKind",
    "FormatVersionError",
    "FsStore",
    "ImagePart",
    "InvalidContextId",
    "InvalidEntry",
    "InvalidQuery",
    "Item",
    "LLMError",
    "LogEntry",
    "LoggedContentPart",
    "LoggedItem",
    "LoggedRole",
    "MemoryStore",
    "ModelNotFound",
    "MultiContextManager",
    "PersistentSession",
    "PodActiveSegmentRef",
    "PodMetadata",
    "PodMetadataStore",
    "PodScopeSnapshot",
    "PostgresStore",
    "RateLimited",
    "ReasoningPart",
    "RestoredState",
    "Role",
    "RunStatus",
    "SegmentId",
    "SegmentNotFound",
    "SegmentOrigin",
    "SegmentStartState",
    "ServerUnreachable",
    "SessionAttached",
    "SessionId",
    "SqliteStore",
    "Store",
    "StoreError",
    "StoreURLError",
    "SystemItem",
    "TerrariumError",
    "TextPart",
    "ToolCallPart",
    "TornTail",
    "TraceEntry",
    "UsageRecord",
    "UsageTotals",
    "VLLMClient",
    "__version__",
    "append_entries",
    "append_entry",
    "append_system_item",
    "attach_context",
    "classify_history_item",
    "clear_segment",
    "collect_state",
    "create_compacted_segment",
    "create_segment",
    "create_segment_with_ids",
    "detached_sessions",
    "ensure_head_or_fork",
    "fork",
    "fork_at",
    "fork_context",
    "from_logged",
    "new_segment_id",
    "new_session_id",
    "open_store",
    "read_entries",
    "render_pod_event",
    "restore",
    "restore_by_segment",
    "save_config_changed",
    "save_delta",
    "save_extension",
    "save_pod_scope",
    "save_run_completed",
    "save_run_errored",
    "save_trace",
    "save_turn_end",
    "save_usage",
    "save_user_input",
    "to_logged",
]
