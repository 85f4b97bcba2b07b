"""``SqliteStore``'s derived state: the search tables and the listing counts on the heads.

Both are derived from the entries and brought up to them in batches by :func:`catch_up`,
never in the append of one entry: ``search_meta.wm`` is the newest entry id they have read.
The store catches up when ``SEARCH_BATCH`` entries wait, and before every search, listing and
head move, so an acknowledged entry is found by the next search. The appends' catch-ups do
the Python share (reading the lines, the counts, the items' text) and leave the items
*staged* in ``search_docs`` past ``search_meta.hw``; adding them to the FTS5 tables is SQL,
which :func:`index_staged` runs in the upkeep thread (:mod:`._upkeep`) with the GIL released,
or the next read's catch-up runs. Where a read cannot catch up (a read-only database, a full
disk, a lock held too long), :func:`late_hits` and :func:`late_counts` read the staged items
and the entries past ``wm`` instead, so nothing acknowledged is missed.

Search has the semantics of FsStore's index (:mod:`terrarium.index`), whose
helpers it shares: the same history items (every ``user_input``, ``item`` and ``system_item``
entry with text, and the history a header carries, with seq 0), text preparation, FTS5
tokenizer, quoting of the user's words as data, filter tokens (:func:`doc_tags`), bm25 ranking
(:class:`terrarium.stores.fts.Ranker`), snippets and highlight spans.

Usage (inside the store's write transaction, then in a read snapshot)::

    wm = catch_up(conn)
    hits = indexed_hits(conn, ranker, query, phrases) + late_hits(conn, query, phrases)
"""

from __future__ import annotations

import json
import sqlite3
import uuid
from collections.abc import Sequence
from typing import Any

import msgspec

from terrarium import codec
from terrarium.model import HISTORY_KINDS
from terrarium.stores.base import ContextSummary, SearchHit, SearchQuery
from terrarium.stores.fts import (
    LONG_BODY,
    TAG_TOKENS,
    Ranker,
    assemble_hits,
    bm25,
    body_match,
    fts5_totals,
    long_snippet,
)
from terrarium.stores.sqlite import _sql as sql
from terrarium.text import (
    ELLIPSIS,
    HIGHLIGHT_CLOSE,
    HIGHLIGHT_OPEN,
    SNIPPET_TOKENS,
    indexed_item,
    phrase_count,
    query_terms,
    scan_snippet,
    shown_text,
    tokenize,
)

#: ``search_recent`` holds this many to twice as many of the newest items (see :func:`catch_up`).
SEARCH_RECENT = 50_000

# Per (session, segment): [history items an entry run adds to a head's count, last entry time].
Counts = dict[tuple[str, str], list[Any]]
# A history item as indexed: (seq, role, ts, body as indexed by ``prepare_text``).
Doc = tuple[int, str, str, str]


def line_docs(seq: int, line: Any) -> list[Doc]:
    """The history items an entry line holds with text: a header's history (all with seq 0,
    a compaction's summary or an import), or one item."""
    if not isinstance(line, dict):
        return []
    ts = str(line.get("ts", ""))
    if seq == 0:
        history = line.get("history")
        docs = (_doc(0, item, ts) for item in (history if isinstance(history, list) else ()))
        return [doc for doc in docs if doc is not None]
    doc = _doc(seq, line.get("item"), ts)
    return [] if doc is None else [doc]


def _doc(seq: int, item: Any, ts: str) -> Doc | None:
    """The indexed form of one history item, or None when it has no text to find."""
    found = indexed_item(item)
    return None if found is None else (seq, found[0], ts, found[1])


def doc_tags(session: str, role: str, type: str | None) -> str:
    """The filter tokens of an item: session, role and context type, one token each (three
    tokens for every item, so bm25 scores equal FsStore's)."""
    return f"{session_tag(session)} r{role} t{(type or '').encode().hex()}"


def session_tag(session: str) -> str:
    """The session's filter token: a canonical UUID string without its dashes is its hex."""
    return f"s{session.replace('-', '')}"


# --------------------------------------------------------------------------- catch-up


def catch_up(
    conn: sqlite3.Connection,
    *,
    counts: bool = True,
    recent: int = SEARCH_RECENT,
    limit: int | None = None,
    refill: int | None = 0,
    index: bool = True,
) -> int:
    """Bring the derived tables up to every entry, or the oldest ``limit`` of those they have
    not read (in the caller's write transaction); return the newest entry id they have now read.

    Reads the entries above ``wm`` (in the caller's write transaction, so a rolled back entry
    is never read): adds their history items to ``search_docs`` and (with ``counts``) their
    history items and last time to the listing counts of the heads they extend; then (with
    ``index``) adds every item of ``search_docs`` not yet in them to both FTS5 tables
    (:func:`index_staged`). Without it the new items stay staged for the upkeep thread:
    FTS5's share of the work is SQL, which runs with the GIL released, off the append path.
    ``recent`` and ``refill``: see :func:`index_staged` and :func:`refill_recent`. The items
    of a detached session (no context) are left out: search shows contexts only, and
    :func:`index_session` adds them when a context adopts the session.
    """
    wm, top = conn.execute(sql.PENDING).fetchone()
    if top is not None and top > wm:
        if limit is not None:
            rows = conn.execute(sql.ENTRIES_SLICE, (wm, limit)).fetchall()
            top = rows[-1][0]
        else:
            rows = conn.execute(sql.ENTRIES_AFTER_IDS, (wm,)).fetchall()
        segments, docs = _read_entries(conn, rows)
        if counts:
            conn.executemany(
                sql.ADD_COUNTS, [(items, last, s, g) for (s, g), (items, last) in segments.items()]
            )
        _stage(conn, docs)
        conn.execute(sql.SET_WM, (top,))
        wm = top
    if index:
        index_staged(conn, recent)
    if refill != 0:
        refill_recent(conn, recent, refill)
    return int(wm)


def _read_entries(
    conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]
) -> tuple[Counts, list[tuple[Any, ...]]]:
    """What the entry ``rows`` (id, session, segment, seq, kind, ts, line) add: to the listing
    counts (see :func:`_tally`), and the history items to index, as ``search_docs`` rows
    without their ids."""
    segments: Counts = {}
    types: dict[str, str | None] = {}
    docs: list[tuple[Any, ...]] = []
    for _, s, g, seq, kind, ts, text in rows:
        _tally(segments, s, g, seq, kind, ts)
        if kind not in HISTORY_KINDS and seq != 0:
            continue
        try:
            line = codec.decode(text)
        except msgspec.DecodeError:
            continue  # a damaged line holds nothing to find; reading the segment reports it
        if s not in types:
            found = conn.execute(sql.SESSION_TYPE, (s,)).fetchone()
            types[s] = None if found is None else found[0]
        if types[s] is None:
            continue  # detached: indexed when attached
        for doc_seq, role, doc_ts, body in line_docs(seq, line):
            docs.append((s, g, doc_seq, role, doc_ts, body, doc_tags(s, role, types[s])))
    return segments, docs


def index_session(
    conn: sqlite3.Connection, session: str, type: str, *, recent: int = SEARCH_RECENT
) -> None:
    """Add every history item of a session that was detached to the search tables, now that a
    context of ``type`` adopted it (in the caller's write transaction, after a catch-up, which
    left them out)."""
    docs: list[tuple[Any, ...]] = []
    for g, seq, _, _, text in conn.execute(sql.SESSION_DOC_ENTRIES, (session,)):
        try:
            line = codec.decode(text)
        except msgspec.DecodeError:
            continue
        for doc_seq, role, doc_ts, body in line_docs(seq, line):
            docs.append((session, g, doc_seq, role, doc_ts, body, doc_tags(session, role, type)))
    _stage(conn, docs)
    index_staged(conn, recent)


def _tally(counts: Counts, s: str, g: str, seq: int, kind: str, ts: str) -> None:
    """Add one entry to ``counts``: per (session, segment), the history items it adds to the
    listing count of a head on that segment, and the time of its last entry."""
    counted = counts.setdefault((s, g), [0, ts])
    counted[1] = ts
    if seq != 0 and kind in HISTORY_KINDS:
        counted[0] += 1


def _stage(conn: sqlite3.Connection, docs: Sequence[tuple[Any, ...]]) -> None:
    """Add ``docs`` (session, segment, seq, role, ts, body, tags) to ``search_docs``, after
    every item there is, staged for :func:`index_staged`."""
    if docs:
        (first,) = conn.execute(sql.NEXT_DOC).fetchone()
        conn.executemany(sql.INSERT_DOC, [(first + i, *doc) for i, doc in enumerate(docs)])


def index_staged(conn: sqlite3.Connection, recent: int, most: int | None = None) -> bool:
    """Add up to ``most`` (None: all) of the staged items (those of ``search_docs`` past
    ``hw``, oldest first) to both FTS5 tables (in the caller's write transaction); return
    whether some are still staged.

    ``search_fts`` holds every item up to ``hw``; ``search_recent`` those from ``floor`` up
    to ``hw``, about ``recent`` to twice as many. Past that it is emptied and
    :func:`refill_recent` fills it again with the newest ``recent``, newest first, a slice at
    a time: letting items out one by one would leave FTS5 delete markers in it, which made a
    common word twice as slow to rank, and a ``'rebuild'`` in one transaction held the write
    lock, and so every append, for ~0.5-0.9 s. SQL only: the upkeep thread runs it in slices.
    """
    _, hw, floor = (int(value) for value in conn.execute(sql.META).fetchone())
    (top,) = conn.execute(sql.NEWEST_DOC).fetchone()
    if top is None or top <= hw:
        return False
    last = top if most is None else min(top, hw + most)
    conn.execute(sql.FTS_ADD_RANGE.format(table="search_fts"), (hw + 1, last + 1))
    if last - floor + 1 > 2 * recent:
        conn.execute(sql.FTS_DELETE_ALL.format(table="search_recent"))
        floor = last + 1
    else:
        conn.execute(sql.FTS_ADD_RANGE.format(table="search_recent"), (hw + 1, last + 1))
    conn.execute(sql.SET_WINDOWS, (last, floor))
    return bool(last < top)


def refill_recent(conn: sqlite3.Connection, recent: int, most: int | None = None) -> bool:
    """Add up to ``most`` (None: all) of the items just under ``floor`` to ``search_recent``,
    until it holds the newest ``recent`` (in the caller's write transaction); return whether
    it still lacks some.

    It is filled downwards, so that at every step it holds exactly the items from ``floor``
    on, which is what its content view and the ranking read.
    """
    _, hw, floor = (int(value) for value in conn.execute(sql.META).fetchone())
    target = max(1, hw - recent + 1)
    if floor <= target or most == 0:
        return floor > target
    low = target if most is None else max(target, floor - most)
    conn.execute(sql.FTS_ADD_RANGE.format(table="search_recent"), (low, floor))
    conn.execute(sql.SET_WINDOWS, (hw, low))
    return low > target


def unindex_session(conn: sqlite3.Connection, session_id: str) -> None:
    """Remove a session's items from the search tables (in the caller's transaction).

    The indexed items are found through their session tag in ``search_fts``, which holds
    every item up to ``hw``; this spares ``search_docs`` an index on ``session_id`` that every
    item would pay to update. Staged items (past ``hw``, in no FTS5 table) are few, and
    deleted from ``search_docs`` alone.
    """
    conn.execute(sql.DELETE_STAGED_OF, (session_id,))
    match = f'tags : "{session_tag(session_id)}"'
    ids = [row[0] for row in conn.execute(sql.FTS_IDS, (match,))]
    if not ids:
        return
    (floor,) = conn.execute(sql.FLOOR).fetchone()
    found = json.dumps(ids)
    for table, low in (("search_fts", 0), ("search_recent", floor)):
        conn.execute(sql.FTS_DELETE_IN.format(table=table), (found, low))
    conn.execute(sql.DELETE_DOCS_IN, (found,))


# --------------------------------------------------------------------------- listing counts


def segment_summary(conn: sqlite3.Connection, session: str, segment: str) -> tuple[int, str]:
    """A segment's history items, as a restore would count them, and its last entry's time.

    A head move counts its new segment this way (its header's history, or a fork's prefix of
    its parent, and its entries); the catch-up then adds each entry it reads to the counts of
    the head it extends. O(entries of the segment): for heads that are set, never on the
    append path.
    """
    row = conn.execute(sql.SEGMENT_PREFIX, (session, segment, sql.MAX_SEQ)).fetchone()
    if row is None:  # no header: the segment is damaged; count nothing rather than fail
        return 0, ""
    items, last, *header = row
    return items + _header_items(conn, session, header), last or ""


def _header_items(conn: sqlite3.Connection, session: str, header: Sequence[Any]) -> int:
    """The history items a segment starts with: its header's history, or, for a fork that
    continues its parent, the parent's items up to the fork point (as restore replays)."""
    count = 0
    for _ in range(10_000):  # a chain of forks; bounded in case damaged headers loop
        history_len, other = header
        if other is None:  # a history list: a fresh start
            return count + int(history_len or 0)
        _, origin, parent, at_seq = codec.decode(other)
        if origin != "fork" or parent is None:
            return count
        try:
            parent = str(uuid.UUID(str(parent)))
        except ValueError:
            return count
        stop = sql.MAX_SEQ if at_seq is None else int(at_seq)  # None: the whole parent
        row = conn.execute(sql.SEGMENT_PREFIX, (session, parent, stop)).fetchone()
        if row is None:
            return count
        count += row[0]
        header = row[2:]
    return count


# --------------------------------------------------------------------------- late entries
# What a read sees of the entries past ``wm`` when the derived state could not be caught up.


def late_counts(conn: sqlite3.Connection) -> Counts:
    """Per (session, segment), what the entries past ``wm`` add to a head's listing counts
    (see :func:`_tally`); empty when the derived state has read every entry."""
    wm, top = conn.execute(sql.PENDING).fetchone()
    counts: Counts = {}
    if top is not None and top > wm:
        for s, g, seq, kind, ts, _ in conn.execute(sql.ENTRIES_AFTER, (wm,)):
            _tally(counts, s, g, seq, kind, ts)
    return counts


def with_late(summary: ContextSummary, late: list[Any] | None) -> ContextSummary:
    """``summary`` with what :func:`late_counts` found for its head, if anything."""
    if late is None:
        return summary
    count, last = late
    return msgspec.structs.replace(
        summary, message_count=summary.message_count + count, last_active=last
    )


def late_hits(conn: sqlite3.Connection, q: SearchQuery, phrases: list[str]) -> list[SearchHit]:
    """Hits among the history items the FTS5 tables do not hold (see :func:`_late_docs`),
    found by scanning them.

    Scored with bm25 as FTS5 would score them in ``search_fts`` with them added (its row and
    token totals, its "averages" record, and each phrase's rows, plus theirs); the indexed
    hits keep the scores FTS5 gave them without these items, a difference of a few rows in
    the statistics.
    """
    docs = _late_docs(conn)
    if not docs:
        return []
    terms = [tokenize(term) for term in query_terms(q.text)]
    freqs = [[phrase_count(doc[-1], term) for term in terms] for doc in docs]
    rows, tokens = fts5_totals(conn, "search_fts")
    rows += len(docs)
    average = (tokens + sum(len(doc[-1]) + TAG_TOKENS for doc in docs)) / rows
    doc_freqs = [
        sum(1 for f in freqs if f[i])
        + conn.execute(sql.FTS_COUNT, (body_match([phrase]),)).fetchone()[0]
        for i, phrase in enumerate(phrases)
    ]
    hits = []
    for (context, created, s, g, seq, role, ts, text, found), freq in zip(docs, freqs, strict=True):
        kind = context.partition(":")[0]
        if not all(freq) or (q.context or context) != context or (q.type or kind) != kind:
            continue
        if (q.role or role) != role or (q.since is not None and ts < q.since):
            continue
        snippet, spans = scan_snippet(text, terms)
        score = bm25(freq, doc_freqs, rows, len(found) + TAG_TOKENS, average)
        hits.append(
            SearchHit(
                context,
                created[:10],
                uuid.UUID(s),
                uuid.UUID(g),
                seq,
                role,
                ts,
                snippet,
                spans,
                score,
            )
        )
    return hits


def _late_docs(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    """(context, created_at, session, segment, seq, role, ts, text, tokens) of every history
    item with text whose context exists and that the FTS5 tables do not hold: the staged
    items (see :func:`index_staged`), then those of the entries past ``wm``."""
    contexts: dict[str, tuple[str, str] | None] = {}

    def context_of(s: str) -> tuple[str, str] | None:
        if s not in contexts:
            contexts[s] = conn.execute(sql.SESSION_CONTEXT, (s,)).fetchone()
        return contexts[s]

    docs: list[tuple[Any, ...]] = []
    for s, g, seq, role, ts, body in conn.execute(sql.STAGED_DOCS):
        where = context_of(s)
        if where is not None:
            shown = shown_text(body)
            docs.append((*where, s, g, seq, role, ts, shown, tokenize(shown)))
    wm, top = conn.execute(sql.PENDING).fetchone()
    if top is None or top <= wm:
        return docs
    for s, g, seq, kind, _, text in conn.execute(sql.ENTRIES_AFTER, (wm,)):
        if kind not in HISTORY_KINDS and seq != 0:
            continue
        try:
            line = codec.decode(text)
        except msgspec.DecodeError:
            continue  # as the catch-up skips it
        where = context_of(s)
        if where is None:
            continue
        for doc_seq, role, ts, body in line_docs(seq, line):
            shown = shown_text(body)
            docs.append((*where, s, g, doc_seq, role, ts, shown, tokenize(shown)))
    return docs


# --------------------------------------------------------------------------- search


def indexed_hits(
    conn: sqlite3.Connection, ranker: Ranker, q: SearchQuery, phrases: list[str]
) -> list[SearchHit]:
    """The hits for a checked query among the indexed items; ``phrases`` are its terms as
    FTS5 strings.

    A query found in more than ``RANK_WINDOW`` items is ranked among its most recent matches
    only, in ``search_recent``, where even a common word is cheap to weigh. While
    ``search_recent`` holds every item it alone answers (bm25 over all items, so scores equal
    FsStore's index exactly); else ``search_fts``, which always holds every item.
    """
    filters = ""
    if q.context is not None:
        found = conn.execute(sql.CONTEXT_SESSION, (q.context,)).fetchone()
        if found is None:
            return []
        filters += f' AND tags : "{session_tag(found[0])}"'
    if q.type is not None:
        filters += f' AND tags : "t{q.type.encode().hex()}"'
    if q.role is not None:
        filters += f' AND tags : "r{q.role}"'
    hw, floor, lowest = conn.execute(sql.SEARCH_RANGE).fetchone()
    if lowest is None:
        return []
    table = "search_recent" if floor <= lowest else "search_fts"
    ranked = ranker.rank(conn, table, phrases, filters, q, hw - lowest + 1)
    if not ranked:
        return []
    ids = [rowid for rowid, _ in ranked]
    long = conn.execute(sql.LONG_BODIES, (json.dumps(ids), LONG_BODY)).fetchall()
    snippets = {rowid: long_snippet(body, q.text) for rowid, body in long}
    short = [rowid for rowid in ids if rowid not in snippets]
    if short:
        snippets.update(
            conn.execute(
                sql.SNIPPETS.format(table=table),
                (
                    HIGHLIGHT_OPEN,
                    HIGHLIGHT_CLOSE,
                    ELLIPSIS,
                    SNIPPET_TOKENS,
                    json.dumps(short),
                    body_match(phrases) + filters,
                ),
            )
        )
    meta = {
        row[0]: (row[1], row[2][:10], *row[3:])  # the date is the creation date
        for row in conn.execute(sql.HIT_ROWS.format(marks=",".join("?" * len(ids))), ids)
    }
    return assemble_hits(ranked, meta, snippets)
