"""What the dashboard reads of the derived index: pages of every context and the sums."""

from __future__ import annotations

import heapq
import sqlite3
from collections.abc import Callable
from typing import Any

import msgspec

from terrarium.index import _listing
from terrarium.index import _sql as sql
from terrarium.index._listing import ContextSummary, ListingQuery
from terrarium.model import UsageTotals

SORTS = (*_listing.COLUMNS,)
"""The orders a page of :meth:`Reader.page` walks: those of every listing, and tokens."""

VIEWS = {"hot": ("sessions", "legacy_rows"), "archived": ("archived_rows",)}
"""What each state shows (``all``: both)."""


class Sums(msgspec.Struct):
    """The sums over the hot contexts (legacy files in contexts and messages only)."""

    per_type: dict[str, tuple[int, int]]
    """Per type: contexts, messages."""
    turns: int
    """Turns of the hot sessions' conversations."""
    models: dict[str, UsageTotals]
    """Usage per model."""
    per_day: dict[str, dict[str, int]]
    """Messages per day, per type: each once, on the day it was first logged."""
    legacy: int
    """Legacy files among the contexts."""
    damaged: dict[str, str]
    """The damaged sessions (counted as far as they could be read), each with its problem."""


class Reader:
    """The dashboard's reads, on one snapshot of the index (see ``SearchIndex.read``)."""

    def __init__(self, conn: sqlite3.Connection, left: int = 0, root: str = sql.ROOT) -> None:
        self.conn = conn
        self.left = left
        """Sessions a first build has still to index (0: the index holds every one)."""
        self.root = root
        """What problem texts name the store's root by now (see ``sql.ROOT``)."""

    def page(self, query: ListingQuery, state: str = "hot") -> list[ContextSummary]:
        """One page of the contexts ``state`` shows, an index walk per view, merged."""
        views = VIEWS.get(state) or (*VIEWS["hot"], *VIEWS["archived"])
        found: list[ContextSummary] = []
        for view in views:
            select = sql.HOT_ROWS if view == "sessions" else sql.OTHER_ROWS.format(view=view)
            statement, params = _listing.page_statement(select, query, SORTS)
            rows = self.conn.execute(statement, (self.root, *params))
            found += [ContextSummary(*row) for row in rows]
        if len(views) > 1:
            found = heapq.nlargest(query.limit, found, key=sort_key(query.sort))
        return found

    def types(self, state: str = "hot") -> list[str]:
        """Every type the contexts ``state`` shows have, sorted."""
        views = VIEWS.get(state) or (*VIEWS["hot"], *VIEWS["archived"])
        found = {row[0] for v in views for row in self.conn.execute(sql.TYPES_OF.format(view=v))}
        return sorted(found)

    def sums(self) -> Sums:
        """The sums, each an aggregate over the index's rows."""
        per_type: dict[str, tuple[int, int]] = {}
        legacy = 0
        for kind, contexts, messages, is_legacy in self.conn.execute(sql.PER_TYPE):
            n, m = per_type.get(kind, (0, 0))
            per_type[kind] = (n + contexts, m + int(messages))
            legacy += contexts if is_legacy else 0
        models = {
            model: UsageTotals(*map(int, numbers))
            for model, *numbers in self.conn.execute(sql.PER_MODEL)
        }
        per_day: dict[str, dict[str, int]] = {}
        for statement in (sql.PER_DAY, sql.COPIES_PER_DAY):
            for day, kind, n in self.conn.execute(statement):
                counts = per_day.setdefault(day, {})
                counts[kind] = counts.get(kind, 0) + int(n)
        (turns,) = self.conn.execute(sql.TURNS).fetchone()
        damaged = dict(self.conn.execute(sql.DAMAGED, (self.root,)).fetchall())
        return Sums(dict(sorted(per_type.items())), int(turns), models, per_day, legacy, damaged)

    def forks_of(self, context: str) -> list[str]:
        """The hot contexts forked from ``context`` (``fork_context``), sorted."""
        return [row[0] for row in self.conn.execute(sql.FORKS_OF, (context,))]

    def fingerprint(self) -> str:
        """What changes when any context is written to, archived or found beside the store."""
        return repr(self.conn.execute(sql.FINGERPRINT).fetchall())

    def segment_bytes(self) -> int:
        """Bytes of the segments the index has read (a filesystem store's: its files)."""
        return int(self.conn.execute(sql.SEGMENT_BYTES).fetchone()[0])


def sort_key(sort: str) -> Callable[[ContextSummary], tuple[Any, str]]:
    """A page's order as a key of its rows: (the sort's column, the context id)."""
    column = _listing.COLUMNS[sort]
    return lambda row: (getattr(row, column), row.context)
