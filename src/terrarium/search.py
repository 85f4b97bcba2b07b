"""Search the history of every context in a store.

:func:`search` hands the query to the store when it is
:class:`~terrarium.stores.base.Searchable` (``FsStore`` through its derived FTS5 index;
``SqliteStore`` and ``PostgresStore`` through their own), and otherwise falls back to
:func:`scan`, which reads every segment of every context, as a store without an index
(``MemoryStore``) must. It scans too when the store's index is unavailable
(:class:`~terrarium.errors.IndexUnavailable`: a read-only ``FsStore`` whose index is behind
its files, a full disk, an index locked by another process for too long), so a search never
misses an acknowledged entry; it logs the reason once per call.

Both paths agree on what is searched and how (``tests/contract/test_scan.py`` checks it):

* every history item of every segment, including the history that a header carries (a
  compaction's summary, an import's messages; those hits have seq 0), so history that a clear
  or compaction left behind stays findable;
* the query is words, never syntax: a hit contains every term; a term of several tokens
  (``don't``, a CJK word) must appear as that sequence. Matching ignores case and accents.
  A query with no letter or digit raises :class:`InvalidQuery`;
* hits are ranked by bm25 (as SQLite FTS5 computes it), best first. (``FsStore``'s index
  ranks queries with very many matches among their most recent ones, and ignores words that
  are in most messages when rarer ones are given: see :mod:`terrarium.stores.fs.search`.)
"""

from __future__ import annotations

import heapq
import logging
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from terrarium.errors import IndexUnavailable, InvalidQuery
from terrarium.model import HISTORY_KINDS, ContextId, item_role, item_text
from terrarium.stores.base import Lifecycle, Searchable, SearchHit, SearchQuery, Store
from terrarium.stores.fts import (
    TAG_TOKENS,
    bm25,
    check_query,
)
from terrarium.text import (
    phrase_count,
    query_terms,
    scan_snippet,
    tokenize,
)

__all__ = ["InvalidQuery", "SearchHit", "SearchQuery", "scan", "search"]

log = logging.getLogger(__name__)


def search(store: Store, query: SearchQuery | str) -> list[SearchHit]:
    """Ranked hits for ``query`` in ``store``: its own index if it has one, else a scan.

    Args:
        store: any store.
        query: a :class:`SearchQuery`, or just the words to find.

    Raises:
        InvalidQuery: nothing to search for (an empty query, only punctuation or emoji), or
            an invalid ``limit``, ``role`` or ``since``.
        InvalidContextId: ``query.context`` is not ``type:name``.
    """
    if isinstance(query, str):
        query = SearchQuery(query)
    if isinstance(store, Searchable):
        try:
            return store.search(query)
        except IndexUnavailable as exc:
            check_query(query)  # a bad query is the caller's error, whatever the index
            log.warning("%s; searching the session files instead", exc)
    return scan(store, query)


@dataclass(slots=True)
class _Doc:
    context: ContextId
    date: str
    head: Any
    segment_id: Any
    seq: int
    role: str
    ts: str
    text: str
    tokens: list[str]


def scan(store: Store, query: SearchQuery | str) -> list[SearchHit]:
    """Search by reading every segment of every context (for stores without an index).

    Costs a full read of the store per query: fine for a ``MemoryStore`` or a small store,
    not for 100k sessions.
    """
    if isinstance(query, str):
        query = SearchQuery(query)
    q = check_query(query)
    phrases = [tokenize(term) for term in query_terms(q.text)]
    docs: list[_Doc] = []
    heads = store.list_contexts()
    if q.archived and isinstance(store, Lifecycle):
        archived = (store.get_head(ContextId.parse(a.context)) for a in store.archived_contexts())
        heads += [head for head in archived if head is not None]
    for head in heads:
        context = ContextId.parse(head.context)
        for segment_id in store.list_segments(head.session_id):
            read = store.read_segment(head.session_id, segment_id)
            header = read.header
            history = header.get("history")
            for item in history if isinstance(history, list) else ():
                docs.append(_doc(context, head, segment_id, 0, item, str(header.get("ts", ""))))
            for line in read.entries:
                if line.get("kind") in HISTORY_KINDS:
                    docs.append(
                        _doc(context, head, segment_id, line["seq"], line.get("item"), line["ts"])
                    )
    docs = [doc for doc in docs if doc.text]  # empty items are not in an index either
    if not docs:
        return []
    # Statistics over the whole corpus, as FTS5 keeps them, before any filter.
    rows = len(docs)
    average = sum(len(doc.tokens) + TAG_TOKENS for doc in docs) / rows
    freqs = [[phrase_count(doc.tokens, phrase) for phrase in phrases] for doc in docs]
    doc_freqs = [sum(1 for f in freqs if f[i]) for i in range(len(phrases))]
    scored: list[tuple[float, int]] = []
    for index, (doc, freq) in enumerate(zip(docs, freqs, strict=True)):
        if not all(freq) or not _wanted(doc, q):
            continue
        score = bm25(freq, doc_freqs, rows, len(doc.tokens) + TAG_TOKENS, average)
        scored.append((score, index))
    best = heapq.nlargest(q.limit, scored, key=lambda pair: (pair[0], pair[1]))
    hits = []
    for score, index in best:
        doc = docs[index]
        snippet, spans = scan_snippet(doc.text, phrases)
        hits.append(
            SearchHit(
                context=str(doc.context),
                date=doc.date,
                session_id=doc.head.session_id,
                segment_id=doc.segment_id,
                seq=doc.seq,
                role=doc.role,
                ts=doc.ts,
                snippet=snippet,
                highlights=spans,
                score=score,
            )
        )
    return hits


def _doc(context: ContextId, head: Any, segment_id: Any, seq: int, item: Any, ts: str) -> _Doc:
    if isinstance(item, Mapping):
        try:
            role, text = item_role(item), item_text(item)
        except (AttributeError, TypeError):
            role, text = None, ""
    else:
        role, text = None, ""
    text = text if isinstance(text, str) else ""
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)  # as the index stores it
    role = role if isinstance(role, str) else "other"
    return _Doc(context, head.date, head, segment_id, seq, role, ts, text, tokenize(text))


def _wanted(doc: _Doc, q: SearchQuery) -> bool:
    if q.type is not None and doc.context.type != q.type:
        return False
    if q.context is not None and str(doc.context) != q.context:
        return False
    if q.role is not None and doc.role != q.role:
        return False
    return q.since is None or doc.ts >= q.since
