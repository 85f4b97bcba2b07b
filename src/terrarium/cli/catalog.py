"""What the commands see as "the sessions": native contexts and legacy JSON files, together.

Legacy files (``sessions/{type}/{date}/{name}.json``, the old Terrarium format) are read in
place by :mod:`terrarium.formats.terrarium_json`: they list, show and export like native
contexts (read through a throw-away in-memory store), and a chat on one imports it into the
log first. The legacy file is never changed. A context that exists in the log hides any
legacy file of the same name.
"""

from __future__ import annotations

import importlib
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from terrarium.cli.app import CliState
from terrarium.errors import ContextNotFound
from terrarium.model import ContextId
from terrarium.stores.base import Store


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One row of ``terrarium list`` and of the picker."""

    context: ContextId
    date: str
    created_at: str
    last_active: str
    message_count: int
    legacy_path: Path | None = None
    """The legacy JSON file, for a session that is not in the log yet."""
    problem: str | None = None
    """Why some of its data cannot be read (one line naming the file), or None."""

    def to_json(self) -> dict[str, Any]:
        """The stable ``--json`` form (see docs/cli.md)."""
        return {
            "context_id": str(self.context),
            "type": self.context.type,
            "name": self.context.name,
            "date": self.date,
            "created_at": self.created_at,
            "last_active": self.last_active,
            "message_count": self.message_count,
            "legacy": self.legacy_path is not None,
            "legacy_path": str(self.legacy_path) if self.legacy_path is not None else None,
            "problem": self.problem,
        }


def legacy_module() -> types.ModuleType | None:
    """:mod:`terrarium.formats.terrarium_json`, or None before it exists."""
    try:
        return importlib.import_module("terrarium.formats.terrarium_json")
    except ImportError:  # pragma: no cover - legacy support not installed
        return None


def legacy_root(state: CliState) -> Path | None:
    """The folder legacy files live in: the filesystem store's root (no other store has one)."""
    from terrarium.stores.fs import FsStore

    store = state.store()
    return store.root if isinstance(store, FsStore) else None


def list_sessions(state: CliState, type: str | None = None) -> list[SessionInfo]:
    """Every session, grouped by type (alphabetical), newest first within a type."""
    manager = state.manager()
    rows: list[SessionInfo] = []
    for kind, items in manager.list_all_contexts().items():
        if type is not None and kind != type:
            continue
        for item in items:
            rows.append(
                SessionInfo(
                    ContextId.parse(item["context_id"]),
                    item["date"],
                    item["created_at"],
                    item["last_active"],
                    item["message_count"],
                    problem=item.get("problem"),
                )
            )
    native = {row.context for row in rows}
    for info in _legacy_sessions(state):
        if info.context not in native and (type is None or info.context.type == type):
            rows.append(info)
            native.add(info.context)
    rows.sort(key=lambda r: r.last_active, reverse=True)
    rows.sort(key=lambda r: r.context.type)
    return rows


def _legacy_sessions(state: CliState) -> list[SessionInfo]:
    module, root = legacy_module(), legacy_root(state)
    if module is None or root is None:
        return []
    out = []
    for path in module.iter_legacy_files(root):
        try:
            session = module.load(path, root=root)
            context = session.context
        except (ValueError, OSError):
            continue  # fsck reports unreadable files; a listing skips them
        meta = session.metadata
        out.append(
            SessionInfo(
                context,
                meta.session_date,
                meta.created_at,
                meta.last_active,
                len(session.messages),
                legacy_path=path,
            )
        )
    return out


def find_legacy(state: CliState, context: ContextId) -> Path | None:
    """The legacy file of ``context``, if there is one (whether or not it was imported)."""
    module, root = legacy_module(), legacy_root(state)
    if module is None or root is None:
        return None
    found: Path | None = module.find_legacy_file(root, context)
    return found


def readable(state: CliState, context: ContextId) -> Store:
    """A store holding ``context``: the real one, or an in-memory copy of a legacy file.

    Raises:
        ContextNotFound: neither the log nor a legacy file has it.
    """
    store = state.store()
    if store.get_head(context) is not None:
        return store
    path = find_legacy(state, context)
    if path is None:
        raise ContextNotFound(f"context {context} does not exist in {state.shown_location}")
    from terrarium.stores.memory import MemoryStore

    module = legacy_module()
    assert module is not None
    memory = MemoryStore()
    module.import_session(memory, module.load(path, root=legacy_root(state)), context=context)
    return memory


def require(state: CliState, context: ContextId) -> None:
    """Raise ContextNotFound unless ``context`` is in the log (legacy files do not count)."""
    if state.store().get_head(context) is None:
        hint = ""
        if find_legacy(state, context) is not None:
            hint = " (it is a legacy file: run 'terrarium import' or chat in it first)"
        raise ContextNotFound(f"context {context} does not exist in {state.shown_location}{hint}")


def resume(state: CliState, context: ContextId) -> bool:
    """Make ``context`` chat-ready: import its legacy file on first use. True if imported."""
    store = state.store()
    if store.get_head(context) is not None:
        return False
    path = find_legacy(state, context)
    if path is None:
        return False
    module = legacy_module()
    assert module is not None
    module.import_session(store, module.load(path, root=legacy_root(state)), context=context)
    return True


def exists(state: CliState, context: ContextId) -> bool:
    """Whether the log or a legacy file holds ``context``."""
    return state.store().get_head(context) is not None or find_legacy(state, context) is not None
