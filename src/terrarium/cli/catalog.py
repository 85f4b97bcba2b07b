"""What the commands see as "the sessions": native contexts and legacy JSON files, together.

Legacy files are read in place by :mod:`terrarium.legacy`, which holds the rules: they list,
show and export like native contexts (through a throw-away in-memory store), and a chat on one
imports it into the log first; the file is never changed. A context in the log hides a legacy
file of the same name.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

from terrarium import contexts, legacy
from terrarium.cli.app import CliState
from terrarium.cli.output import one_line
from terrarium.errors import ContextNotFound, TerrariumError
from terrarium.index._listing import ContextSummary
from terrarium.model import ContextId
from terrarium.stores.base import Store


def list_sessions(state: CliState, type: str | None = None) -> list[ContextSummary]:
    """Every session, grouped by type, newest first; unusable legacy files warned of on stderr."""
    listing = contexts.list_contexts(state.store(), type=type)
    warn_legacy(state, listing.problems)
    return listing.rows


def warn_legacy(state: CliState, problems: Iterable[legacy.LegacyProblem]) -> None:
    """One ``warning:`` line on stderr per legacy file that cannot be used."""
    for problem in problems:
        state.out.note(f"warning: {one_line(str(problem))}", style="yellow")


def readable(state: CliState, context: ContextId) -> Store:
    """The store holding ``context``, or an in-memory copy of its legacy file; ContextNotFound."""
    store = state.store()
    if store.get_head(context) is not None:
        return store
    copy = legacy.read(store, context)
    if copy is None:
        raise missing(state, context)
    return copy.store


def require(state: CliState, context: ContextId) -> None:
    """Raise ContextNotFound unless ``context`` is in the log (legacy files do not count)."""
    if state.store().get_head(context) is None:
        if legacy.find(state.store(), context) is not None:
            hint = " (it is a legacy file: run 'terrarium import' or chat in it first)"
            raise contexts.not_found(context, f"{state.shown_location}{hint}")
        raise missing(state, context)


def missing(state: CliState, context: ContextId) -> ContextNotFound:
    """The error for a missing session, naming close ones (``did you mean cli:main?``)."""
    error = contexts.not_found(context, state.shown_location)
    try:
        rows = contexts.list_contexts(state.store()).rows
    except (TerrariumError, OSError):  # no suggestion beats a second error
        return error
    return suggesting(error, context, [row.context for row in rows])


def suggesting(error: ContextNotFound, context: ContextId, names: list[str]) -> ContextNotFound:
    """``error`` naming the ids of ``names`` close to ``context``, if any (:func:`similar`)."""
    close = similar(context, names)
    if not close:
        return error
    import shlex  # an error path: not imported by every command

    shown = " or ".join(shlex.quote(candidate) for candidate in close)
    return ContextNotFound(f"{error}; did you mean {shown}?")


def similar(context: ContextId, candidates: list[str]) -> list[str]:
    """Up to three of ``candidates`` close to ``context``: the same name under another type
    first, then names (not ids: a shared ``cli:`` makes ids look alike) ``difflib`` finds alike."""
    import difflib  # an error path: not imported by every command

    by_name: dict[str, list[str]] = {}
    for candidate in candidates:
        by_name.setdefault(candidate.partition(":")[2], []).append(candidate)
    names = difflib.get_close_matches(context.name, list(by_name), n=3, cutoff=0.6)
    if context.name in by_name and context.name not in names:
        names.insert(0, context.name)
    found = [c for name in names for c in by_name[name] if c != str(context)]
    found.sort(
        key=lambda c: (c.partition(":")[2] != context.name, not c.startswith(f"{context.type}:"))
    )
    return found[:3]


def exists(state: CliState, context: ContextId) -> bool:
    """Whether the log or a legacy file holds ``context``."""
    return (
        state.store().get_head(context) is not None
        or legacy.find(state.store(), context) is not None
    )


@contextlib.contextmanager
def naming_store(state: CliState, *named: ContextId) -> Iterator[None]:
    """Name the store in a ContextNotFound raised inside (suggestions when it is one of
    ``named``: :func:`missing`'s message)."""
    try:
        yield
    except ContextNotFound as exc:
        for context in named:
            if str(exc) == str(contexts.not_found(context)):
                raise missing(state, context) from None
        raise ContextNotFound(f"{exc} in {state.shown_location}") from None
