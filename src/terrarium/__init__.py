"""terrarium: durable, forkable, searchable conversation sessions for LLM agents.

The package re-exports its whole public API here; the names of the log layer are those of
the Rust ``session_store`` crate the design comes from (functions in snake_case, types as
they are), so a reader of that crate finds every piece.

Every name is imported on first use (``terrarium._lazy``): ``import terrarium`` itself loads
nothing but this table, so a command that only lists sessions never imports the ``openai``
client, ``psycopg`` or a store backend it does not open.
"""

from __future__ import annotations

from terrarium._lazy import attach

TYPE_CHECKING = False  # typing's costs more to import than this whole module

if TYPE_CHECKING:  # ``X as X``: a type checker sees each name re-exported
    from terrarium.agent.multi_context_manager import MultiContextManager as MultiContextManager
    from terrarium.agent.session_manager import PersistentSession as PersistentSession
    from terrarium.errors import BadResponse as BadResponse
    from terrarium.errors import ConflictError as ConflictError
    from terrarium.errors import ContextExists as ContextExists
    from terrarium.errors import ContextNotFound as ContextNotFound
    from terrarium.errors import ContextTooLong as ContextTooLong
    from terrarium.errors import CorruptLog as CorruptLog
    from terrarium.errors import FormatVersionError as FormatVersionError
    from terrarium.errors import InvalidContextId as InvalidContextId
    from terrarium.errors import InvalidEntry as InvalidEntry
    from terrarium.errors import InvalidQuery as InvalidQuery
    from terrarium.errors import LLMError as LLMError
    from terrarium.errors import ModelNotFound as ModelNotFound
    from terrarium.errors import RateLimited as RateLimited
    from terrarium.errors import SegmentNotFound as SegmentNotFound
    from terrarium.errors import ServerUnreachable as ServerUnreachable
    from terrarium.errors import SessionAttached as SessionAttached
    from terrarium.errors import SessionConflict as SessionConflict
    from terrarium.errors import StoreError as StoreError
    from terrarium.errors import StoreNotFound as StoreNotFound
    from terrarium.errors import StoreUnavailable as StoreUnavailable
    from terrarium.errors import StoreURLError as StoreURLError
    from terrarium.errors import TerrariumError as TerrariumError
    from terrarium.llm.vllm_client import VLLMClient as VLLMClient
    from terrarium.model import FORMAT_VERSION as FORMAT_VERSION
    from terrarium.model import POD_SCOPE_EXTENSION_DOMAIN as POD_SCOPE_EXTENSION_DOMAIN
    from terrarium.model import ContentPart as ContentPart
    from terrarium.model import ContextId as ContextId
    from terrarium.model import EntryKind as EntryKind
    from terrarium.model import ImagePart as ImagePart
    from terrarium.model import Item as Item
    from terrarium.model import LogEntry as LogEntry
    from terrarium.model import LoggedContentPart as LoggedContentPart
    from terrarium.model import LoggedItem as LoggedItem
    from terrarium.model import LoggedRole as LoggedRole
    from terrarium.model import PodScopeSnapshot as PodScopeSnapshot
    from terrarium.model import ReasoningPart as ReasoningPart
    from terrarium.model import RestoredState as RestoredState
    from terrarium.model import Role as Role
    from terrarium.model import RunStatus as RunStatus
    from terrarium.model import SegmentId as SegmentId
    from terrarium.model import SegmentOrigin as SegmentOrigin
    from terrarium.model import SegmentStartState as SegmentStartState
    from terrarium.model import SessionId as SessionId
    from terrarium.model import SystemItem as SystemItem
    from terrarium.model import TextPart as TextPart
    from terrarium.model import ToolCallPart as ToolCallPart
    from terrarium.model import TornTail as TornTail
    from terrarium.model import TraceEntry as TraceEntry
    from terrarium.model import UsageRecord as UsageRecord
    from terrarium.model import UsageTotals as UsageTotals
    from terrarium.model import from_logged as from_logged
    from terrarium.model import new_segment_id as new_segment_id
    from terrarium.model import new_session_id as new_session_id
    from terrarium.model import render_pod_event as render_pod_event
    from terrarium.model import to_logged as to_logged
    from terrarium.sessions import append_entries as append_entries
    from terrarium.sessions import append_entry as append_entry
    from terrarium.sessions import append_system_item as append_system_item
    from terrarium.sessions import attach_context as attach_context
    from terrarium.sessions import classify_history_item as classify_history_item
    from terrarium.sessions import clear_segment as clear_segment
    from terrarium.sessions import collect_state as collect_state
    from terrarium.sessions import create_compacted_segment as create_compacted_segment
    from terrarium.sessions import create_segment as create_segment
    from terrarium.sessions import create_segment_with_ids as create_segment_with_ids
    from terrarium.sessions import detached_sessions as detached_sessions
    from terrarium.sessions import ensure_head_or_fork as ensure_head_or_fork
    from terrarium.sessions import fork as fork
    from terrarium.sessions import fork_at as fork_at
    from terrarium.sessions import fork_context as fork_context
    from terrarium.sessions import read_entries as read_entries
    from terrarium.sessions import restore as restore
    from terrarium.sessions import restore_by_segment as restore_by_segment
    from terrarium.sessions import rewind as rewind
    from terrarium.sessions import save_config_changed as save_config_changed
    from terrarium.sessions import save_delta as save_delta
    from terrarium.sessions import save_extension as save_extension
    from terrarium.sessions import save_pod_scope as save_pod_scope
    from terrarium.sessions import save_run_completed as save_run_completed
    from terrarium.sessions import save_run_errored as save_run_errored
    from terrarium.sessions import save_trace as save_trace
    from terrarium.sessions import save_turn_end as save_turn_end
    from terrarium.sessions import save_usage as save_usage
    from terrarium.sessions import save_user_input as save_user_input
    from terrarium.stores.base import ContextLocking as ContextLocking
    from terrarium.stores.base import PodActiveSegmentRef as PodActiveSegmentRef
    from terrarium.stores.base import PodMetadata as PodMetadata
    from terrarium.stores.base import PodMetadataStore as PodMetadataStore
    from terrarium.stores.base import Store as Store
    from terrarium.stores.fs import FsStore as FsStore
    from terrarium.stores.memory import MemoryStore as MemoryStore
    from terrarium.stores.postgres import PostgresStore as PostgresStore
    from terrarium.stores.sqlite import SqliteStore as SqliteStore
    from terrarium.stores.url import open_store as open_store

__version__ = "0.1.0"

#: The public names, by the module that defines each.
_MODULES = {
    "terrarium.agent.multi_context_manager": "MultiContextManager",
    "terrarium.agent.session_manager": "PersistentSession",
    "terrarium.errors": """
        BadResponse ConflictError ContextExists ContextNotFound ContextTooLong CorruptLog
        FormatVersionError InvalidContextId InvalidEntry InvalidQuery LLMError ModelNotFound
        RateLimited SegmentNotFound ServerUnreachable SessionAttached SessionConflict StoreError
        StoreNotFound StoreURLError StoreUnavailable TerrariumError
    """,
    "terrarium.llm.vllm_client": "VLLMClient",
    "terrarium.model": """
        ContentPart ContextId EntryKind FORMAT_VERSION ImagePart Item LogEntry LoggedContentPart
        LoggedItem LoggedRole POD_SCOPE_EXTENSION_DOMAIN PodScopeSnapshot ReasoningPart
        RestoredState Role RunStatus SegmentId SegmentOrigin SegmentStartState SessionId SystemItem
        TextPart ToolCallPart TornTail TraceEntry UsageRecord UsageTotals from_logged new_segment_id
        new_session_id render_pod_event to_logged
    """,
    "terrarium.sessions": """
        append_entries append_entry append_system_item attach_context classify_history_item
        clear_segment collect_state create_compacted_segment create_segment create_segment_with_ids
        detached_sessions ensure_head_or_fork fork fork_at fork_context read_entries restore
        restore_by_segment rewind save_config_changed save_delta save_extension save_pod_scope
        save_run_completed save_run_errored save_trace save_turn_end save_usage save_user_input
    """,
    "terrarium.stores.base": """
        ContextLocking PodActiveSegmentRef PodMetadata PodMetadataStore Store
    """,
    "terrarium.stores.fs": "FsStore",
    "terrarium.stores.memory": "MemoryStore",
    "terrarium.stores.postgres": "PostgresStore",
    "terrarium.stores.sqlite": "SqliteStore",
    "terrarium.stores.url": "open_store",
}
_NAMES = {name: module for module, names in _MODULES.items() for name in names.split()}

__all__ = sorted([*_NAMES, "__version__"])

__getattr__, __dir__ = attach(__name__, _NAMES, __all__)
del annotations, TYPE_CHECKING, attach  # not part of the namespace
