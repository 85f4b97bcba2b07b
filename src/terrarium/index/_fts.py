"""Full-text search over SQLite FTS5: the ranking of the derived index (:mod:`terrarium.index`).

It owns no data: the index hands it a connection. :func:`bm25` is the same ranking in Python,
for :func:`terrarium.search.scan`. The trade-off: a query with more than ``RANK_WINDOW``
matches is ranked among its most recent ``RANK_WINDOW`` only. On 1M messages that keeps a
common word in milliseconds rather than 630 ms, and for such a word recency is the better order.

Usage::

    q = check_query(SearchQuery("deploy failed", limit=20))
    phrases = [fts5_phrases([term]) for term in query_terms(q.text)]
    ranked = Ranker().rank(conn, phrases, "", q, rows)  # [(rowid, score)]
    hits = assemble_hits(ranked, meta, snippets)
"""

from __future__ import annotations

import math
import sqlite3
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from terrarium.index._query import SearchHit, SearchQuery
from terrarium.index._sql import FTS, FTS_RECENT
from terrarium.model import item_role, item_text
from terrarium.text import (
    HIGHLIGHT_CLOSE,
    HIGHLIGHT_OPEN,
    query_terms,
    scan_snippet,
    snippet_spans,
    tokenize,
)

#: Queries matching more rows than this are ranked among their most recent matches.
RANK_WINDOW = 2000
#: Among few matches, terms in more than this share of all rows only filter, unranked.
COMMON_SHARE = 0.05

# --------------------------------------------------------------------------- queries


def role_text(item: Any) -> tuple[str, str]:
    """A history item's role (``other`` for none) and its plain text (empty for none)."""
    if not isinstance(item, Mapping):
        return "other", ""
    try:
        role, text = item_role(item), item_text(item)
    except (AttributeError, TypeError):
        return "other", ""
    return role or "other", text if isinstance(text, str) else ""


def fts5_phrases(terms: Iterable[str]) -> str:
    """Terms as FTS5 strings (each a phrase matched literally), implicitly ANDed."""
    return " ".join('"' + term.replace('"', '""') + '"' for term in terms)


LONG_BODY = 16_384
"""Characters above which a hit's snippet is cut in Python (:func:`long_snippet`), not by
FTS5's ``snippet()``: that scores each candidate window against every match in the row, so a
1 MB message holding a word 35,000 times took 10 s a search (measured on this machine)."""


def long_snippet(body: str, text: str) -> str:
    """A snippet of a long ``body`` around the first match of the query ``text``, marked as
    FTS5's ``snippet()`` marks one (:func:`terrarium.text.scan_snippet` picks the window)."""
    snippet, spans = scan_snippet(body, [tokenize(term) for term in query_terms(text)])
    for start, stop in reversed(spans):  # from the last: the earlier spans' offsets hold
        marked = HIGHLIGHT_OPEN + snippet[start:stop] + HIGHLIGHT_CLOSE
        snippet = snippet[:start] + marked + snippet[stop:]
    return snippet


def assemble_hits(
    ranked: Sequence[tuple[int, float]],
    meta: Mapping[int, Sequence[Any]],
    snippets: Mapping[int, str],
) -> list[SearchHit]:
    """Hits in rank order from ranked rowids, their rows and their marked snippets.

    ``meta`` maps a rowid to (context, date, session id, segment id, seq, role, ts); rows
    missing from ``meta`` or ``snippets`` (deleted meanwhile) are left out. The marks are two
    private-use characters, indexed as U+FFFD in the text itself (``prepare_text``).
    """
    hits = []
    for rowid, score in ranked:
        if rowid not in meta or rowid not in snippets:
            continue
        context, date, session, segment, seq, role, ts = meta[rowid]
        text, spans = snippet_spans(snippets[rowid])
        ids = uuid.UUID(session), uuid.UUID(segment)
        hits.append(SearchHit(context, date, *ids, seq, role, ts, text, spans, score))
    return hits


def bm25(
    phrase_freqs: Sequence[int],
    doc_freqs: Sequence[int],
    rows: int,
    length: int,
    average: float,
    k1: float = 1.2,
    b: float = 0.75,
) -> float:
    """The score FTS5's ``bm25()`` gives a row, negated so that higher is better."""
    score = 0.0
    for freq, hits in zip(phrase_freqs, doc_freqs, strict=True):
        idf = math.log((rows - hits + 0.5) / (hits + 0.5))
        if idf <= 0.0:
            idf = 1e-6
        score += idf * (freq * (k1 + 1.0)) / (freq + k1 * (1.0 - b + b * length / average))
    return score


#: Tokens each row has in the ``tags`` column (session, role, type): part of bm25's length.
TAG_TOKENS = 3


# --------------------------------------------------------------------------- ranking


def body_match(phrases: Iterable[str]) -> str:
    """An FTS5 expression matching every one of ``phrases`` (FTS5 strings) in the text."""
    return f"body : ({' '.join(phrases)})"


def nth_match(conn: sqlite3.Connection, table: str, match: str, n: int) -> int | None:
    """The rowid of the (n+1)-th most recent row matching ``match``, or None if fewer match."""
    row = conn.execute(
        f"SELECT rowid FROM {table} WHERE {table} MATCH ? ORDER BY rowid DESC LIMIT 1 OFFSET ?",
        (match, n),
    ).fetchone()
    return None if row is None else int(row[0])


class Ranker:
    """bm25 ranking (``k1=1.2``, ``b=0.75``, FTS5's own) over the text column of an FTS5 index.

    The filters (type, context, role) are tokens of a second column, ``tags``, so FTS5
    intersects them with the terms instead of testing every match; ``since`` is tested per row.
    FTS5's bm25 costs about 1-2 us per matching row (it reads each row's size), plus, to weigh
    each phrase of the expression (its IDF), 40 ns per row in the whole table that holds the
    phrase: ranking a word found in 860k of 1M messages costs 630 ms, and even a rare word
    ANDed with it pays 35 ms. Hence, measured on 1M messages (``benchmarks/bench_search.py``,
    ``benchmarks/bench_stores.py``):

    * the ranking expression holds the terms only; the whole expression (terms and tags)
      filters through ``+rowid IN (...)``, so a role tag in half the rows is never weighed
      (the ``+`` keeps SQLite from turning the list into one MATCH per row);
    * each term is classed, once per term while the table's size stays within 10 %, by how
      many rows hold it: *few* (at most ``RANK_WINDOW``), *common* (more than
      ``COMMON_SHARE`` of all rows, and more than ``RANK_WINDOW``), or in between;
    * a query with a *few* term has at most ``RANK_WINDOW`` matches, so it is ranked whole, in
      rowid order (FTS5 walks a long doclist backwards page by page: finding the newest
      matches of a rare word ANDed with a common one that way cost 10 ms);
    * any other query is first walked newest first: with more than ``RANK_WINDOW`` matches it
      is ranked among its most recent ``RANK_WINDOW`` matches in ``fts_recent``, the table of
      the newest items, where even a common word is cheap to weigh (falling back to the whole
      index when that finds too few). Such words carry almost no information, and for them
      recency is the better order anyway;
    * among fewer matches, *common* terms only filter when the query has rarer ones: bm25
      gives them almost no weight (IDF under 3, against 6 to 8 for the words people look for)
      and weighing them is what costs.

    Rows are numbered in arrival order. Below ``RANK_WINDOW`` matches the scan's :func:`bm25`
    gives the same hits and scores. Threads may share a ranker (at worst two class one term).
    """

    def __init__(self) -> None:
        # phrase -> (class: 0 few, 1 between, 2 common; rows when classed)
        self._classes: dict[str, tuple[int, int]] = {}

    def rank(
        self,
        conn: sqlite3.Connection,
        phrases: Sequence[str],
        filters: str,
        q: SearchQuery,
        rows: int,
    ) -> list[tuple[int, float]]:
        """The best (rowid, score) pairs for ``q``, higher first (``conn`` in a read
        transaction; ``filters``: `` AND tags : ...`` conditions or ``""``)."""
        body = body_match(phrases)
        match = body + filters
        window = max(RANK_WINDOW, q.limit)
        classes = {p: self._class(conn, p, window, rows) for p in phrases}
        # With no rare term there may be many matches: find the window's oldest.
        bound = nth_match(conn, FTS, match, window) if 0 not in classes.values() else None
        if bound is None:  # at most ``window`` matches: rank them all
            informative = [p for p in phrases if classes[p] < 2]
            if len(set(phrases)) < 2 and not filters:
                informative = list(phrases)
            # Ranking by common terms alone would walk all their rows to apply the filters.
            rank_match = body_match(informative) if informative else match
            return self._ranked(conn, FTS, rank_match, match, None, q)
        recent = nth_match(conn, FTS_RECENT, match, window)
        ranked = self._ranked(conn, FTS_RECENT, body, match, recent, q)
        if len(ranked) >= q.limit:
            return ranked
        ranked = self._ranked(conn, FTS, body, match, bound, q)
        if len(ranked) >= q.limit or q.since is None:
            return ranked
        return self._ranked(conn, FTS, body, match, None, q)

    def _class(self, conn: sqlite3.Connection, phrase: str, window: int, rows: int) -> int:
        """0 if at most ``window`` rows hold ``phrase``, 2 if more than ``COMMON_SHARE`` of
        ``rows`` (and ``window``) do, else 1."""
        known = self._classes.get(phrase)
        if known is not None and 0.9 * known[1] <= rows <= 1.1 * known[1]:
            return known[0]
        match = body_match([phrase])
        if nth_match(conn, FTS, match, window) is None:
            found = 0
        else:
            threshold = max(window, int(rows * COMMON_SHARE))
            found = 2 if nth_match(conn, FTS, match, threshold) is not None else 1
        if len(self._classes) > 10_000:
            self._classes.clear()
        self._classes[phrase] = (found, rows)
        return found

    def _ranked(
        self,
        conn: sqlite3.Connection,
        table: str,
        rank_match: str,
        match: str,
        floor: int | None,
        q: SearchQuery,
    ) -> list[tuple[int, float]]:
        """Rows matching ``match`` (from rowid ``floor`` on) ranked by bm25 of
        ``rank_match``, newest first among equal scores."""
        sql = f"SELECT {table}.rowid AS id, bm25({table}, 1.0, 0.0) AS r FROM {table}"
        where = f" WHERE {table} MATCH ?"
        args: list[object] = [rank_match]
        if floor is not None:
            where += f" AND {table}.rowid >= ?"
            args.append(floor)
        if match != rank_match:
            # The unary + keeps SQLite from turning the IN list into one MATCH per row.
            where += f" AND +{table}.rowid IN (SELECT rowid FROM {table}(?)"
            args.append(match)
            if floor is not None:
                where += " WHERE rowid >= ?"
                args.append(floor)
            where += ")"
        if q.since is not None:
            sql += f" JOIN docs ON docs.id = {table}.rowid"
            where += " AND docs.ts >= ?"
            args.append(q.since)
        args.append(q.limit)
        rows = conn.execute(f"{sql}{where} ORDER BY r, {table}.rowid DESC LIMIT ?", args)
        return [(rowid, -rank) for rowid, rank in rows]


def merge_hits(hot: list[SearchHit], cold: list[SearchHit], limit: int) -> list[SearchHit]:
    """The best ``limit`` of two ranked lists of hits, best first."""
    if not cold:
        return hot
    return sorted(hot + cold, key=lambda hit: hit.score, reverse=True)[:limit]
