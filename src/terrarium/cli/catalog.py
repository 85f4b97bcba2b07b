"""What the commands see as "the sessions": native contexts and legacy JSON files, together.

Legacy files (``sessions/{type}/{date}/{name}.json``, the old Terrarium format) are read in
place by :mod:`terrarium.legacy`, which holds the rules (the manager follows the same): they
list, show and export like native contexts (read through a throw-away in-memory store), and a
chat on one imports it into the log first. The legacy file is never changed. A context that
exists in the log hides any legacy file of the same name. ``list`` warns about legacy files it
cannot use.
"""

from __future__ import annotations

import importlib
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from terrarium import legacy
from terrarium.cli.app import CliState
from terrarium.cli.output import one_line
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
    """Why some of its log cannot be read (one line naming the file), or None."""

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
    return legacy.legacy_root(state.store())


def list_sessions(state: CliState, type: str | None = None) -> list[SessionInfo]:
    """Every session, grouped by type (alphabetical), newest first within a type.

    Legacy files that cannot be used are reported on stderr, one line each
    (``warning: <path>: <reason>``); the listing goes on without them.
    """
    manager = state.manager()
    found = legacy.listing(state.store())
    for problem in found.problems:
        state.out.note(f"warning: {one_line(str(problem))}", style="yellow")
    rows: list[SessionInfo] = []
    for kind, items in manager.list_all_contexts().items():
        if type is not None and kind != type:
            continue
        for item in items:
            context = ContextId.parse(item["context_id"])
            info = found.by_context.get(context) if item.get("legacy") else None
            rows.append(
                SessionInfo(
                    context,
                    item["date"],
                    item["created_at"],
                    item["last_active"],
                    item["message_count"],
                    legacy_path=info.path if info is not None else None,
                    problem=item.get("problem"),
                )
            )
    rows.sort(key=lambda r: r.last_active, reverse=True)
    rows.sort(key=lambda r: r.context.type)
    return rows


def find_legacy(state: CliState, context: ContextId) -> Path | None:
    """The legacy file of ``context``, if there is one (whether or not it was imported)."""
    return legacy.find(state.store(), context)


def readable(state: CliState, context: ContextId) -> Store:
    """A store holding ``context``: the real one, or an in-memory copy of a legacy file.

    Raises:
        ContextNotFound: neither the log nor a legacy file has it.
    """
    store = state.store()
    if store.get_head(context) is not None:
        return store
    copy = legacy.read(store, context)
    if copy is None:
        raise ContextNotFound(f"context {context} does not exist in {state.shown_location}")
    return copy.store


def require(state: CliState, context: ContextId) -> None:
    """Raise ContextNotFound unless ``context`` is in the log (legacy files do not count)."""
    if state.store().get_head(context) is None:
        hint = ""
        if find_legacy(state, context) is not None:
            hint = " (it is a legacy file: run 'terrarium import' or chat in it first)"
        raise ContextNotFound(f"context {context} does not exist in {state.shown_location}{hint}")


def resume(state: CliState, context: ContextId) -> bool:
    """Make ``context`` chat-ready: import its legacy file on first use. True if imported."""
    return legacy.resume(state.store(), context)


def exists(state: CliState, context: ContextId) -> bool:
    """Whether the log or a legacy file holds ``context``."""
    return state.store().get_head(context) is not None or find_legacy(state, context) is not None
