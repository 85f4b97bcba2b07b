"""Search the history of every context in a store.

The derived index (or a store's own) answers; without a usable one :func:`scan` reads every
segment, so a search never misses an acknowledged entry. Both agree
(``tests/contract/test_scan.py``). Each message is then found once, in the conversation a user
would open: a hit off it is ``branch="off"``, kept only with ``all_branches``, and a copy is
dropped when its original is a hit. The store is asked for more hits to make up for those.
"""

from __future__ import annotations

import heapq
import logging
import unicodedata
from collections.abc import Mapping
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import msgspec

from terrarium import index as derived
from terrarium import sessions, states
from terrarium.errors import CorruptLog, IndexUnavailable, InvalidQuery
from terrarium.index._fts import TAG_TOKENS, bm25, merge_hits, role_text
from terrarium.index._query import MAX_LIMIT, Searchable, SearchHit, SearchQuery, check_query
from terrarium.model import HISTORY_KINDS, ContextId, SegmentId, SessionId
from terrarium.stores.base import Lifecycle, PodMetadata, Store
from terrarium.text import (
    ELLIPSIS,
    phrase_count,
    query_terms,
    scan_snippet,
    tokenize,
)

__all__ = ["InvalidQuery", "SearchHit", "SearchQuery", "hit_json", "scan", "search"]

log = logging.getLogger(__name__)


def search(store: Store, query: SearchQuery | str) -> list[SearchHit]:
    """Ranked hits for ``query`` in ``store``, each message once, placed in its conversation.

    Raises:
        InvalidQuery: nothing to search for, or an invalid ``limit``, ``role`` or ``since``.
        InvalidContextId: ``query.context`` is not ``type:name``.
    """
    if isinstance(query, str):
        query = SearchQuery(query)
    if not (isinstance(query.limit, int) and 1 <= query.limit <= MAX_LIMIT):
        return _search_store(store, query)  # the store names the bad limit
    places = _Places(store, [tokenize(term) for term in query_terms(query.text)])
    # Hits off the head and copies are left out after the store answers, so it is asked for
    # a few more than the limit, and again for more when those were not enough.
    asked = min(MAX_LIMIT, query.limit + 10)
    while True:
        hits = _search_store(store, msgspec.structs.replace(query, limit=asked))
        found, decided = places.place(hits, limit=query.limit, all_branches=query.all_branches)
        if decided or len(hits) < asked or asked == MAX_LIMIT:
            return found
        asked = min(MAX_LIMIT, asked * 4 + 10)


WIDER_LIMIT = 1000
"""The most hits :func:`wider` counts."""


def wider(store: Store, query: SearchQuery) -> tuple[str, int] | None:
    """For a search that found nothing, what a wider one would find: ``("all_branches", n)``,
    the messages (up to :data:`WIDER_LIMIT`) ``all_branches`` finds, which the index answers
    at once; else ``("archived", n)``, the archived contexts of the query's type or context
    that were not searched (counted, not read: searching the archive reads it); else None."""
    if not query.all_branches:
        found = search(store, msgspec.structs.replace(query, limit=WIDER_LIMIT, all_branches=True))
        if found:
            return "all_branches", len(found)
    if not query.archived and isinstance(store, Lifecycle):
        cold = [
            entry
            for entry in states.archived_contexts(store, query.type)
            if query.context in (None, entry.context)
        ]
        if cold:
            return "archived", len(cold)
    return None


def _search_store(store: Store, query: SearchQuery) -> list[SearchHit]:
    """The store's hits from its index, else a scan (``archived``: the archive's scanned too)."""
    source = derived.listing(store)
    if isinstance(source, Searchable):
        try:
            hits = source.search(query)
        except IndexUnavailable as exc:
            check_query(query)  # a bad query is the caller's error, whatever the index
            log.warning("%s; searching the session files instead", exc)
        else:
            if not query.archived:
                return hits
            cold = _scan(store, check_query(query), _archived_heads(store, query))
            return merge_hits(hits, cold, query.limit)
    return scan(store, query)


def hit_json(hit: SearchHit) -> dict[str, Any]:
    """One hit as ``search --json`` prints it and the dashboard's ``/api/search`` gives it: its
    fields in their order as JSON values, ``context`` named ``context_id``, without the session."""
    found = msgspec.to_builtins(hit)
    del found["session_id"]
    return {"context_id": found.pop("context"), **found}


@dataclass(slots=True)
class _Doc:
    context: ContextId
    head: Any
    segment_id: Any
    seq: int
    role: str
    ts: str
    text: str
    tokens: list[str]


def scan(store: Store, query: SearchQuery | str) -> list[SearchHit]:
    """Search by reading every segment of every context: a full read per query, for small stores."""
    if isinstance(query, str):
        query = SearchQuery(query)
    heads = store.list_contexts()
    if query.archived:
        heads += _archived_heads(store, query)
    return _scan(store, check_query(query), heads)


def _scan(store: Store, q: SearchQuery, heads: list[PodMetadata]) -> list[SearchHit]:
    """:func:`scan` over the contexts of ``heads``."""
    phrases = [tokenize(term) for term in query_terms(q.text)]
    docs: list[_Doc] = []
    for head in heads:
        context = ContextId.parse(head.context)
        for segment_id in store.list_segments(head.session_id):
            read = store.read_segment(head.session_id, segment_id)
            history, ts = read.header.get("history"), str(read.header.get("ts", ""))
            items = [(0, item, ts) for item in history] if isinstance(history, list) else []
            entries = [line for line in read.entries if line.get("kind") in HISTORY_KINDS]
            items += [(line["seq"], line.get("item"), line["ts"]) for line in entries]
            docs += [_doc(context, head, segment_id, *item) for item in items]
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
        where = (str(doc.context), doc.head.date, doc.head.session_id, doc.segment_id, doc.seq)
        hits.append(SearchHit(*where, doc.role, doc.ts, snippet, spans, score))
    return hits


def _archived_heads(store: Store, q: SearchQuery) -> list[PodMetadata]:
    """The heads of the archived contexts (of the query's type or context) a search reads."""
    entries = states.archived_contexts(store, q.type) if isinstance(store, Lifecycle) else []
    wanted = [entry.context for entry in entries if q.context in (None, entry.context)]
    heads = [store.get_head(ContextId.parse(context)) for context in wanted]
    return [head for head in heads if head is not None]


def _doc(context: ContextId, head: Any, segment_id: Any, seq: int, item: Any, ts: str) -> _Doc:
    role, text = _role_text(item)
    return _Doc(context, head, segment_id, seq, role, ts, text, tokenize(text))


def _role_text(item: Any) -> tuple[str, str]:
    """An item's role (``other`` for none) and its text as the indexes hold it."""
    role, text = role_text(item)
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)  # as the index stores it
    return role, text


def _wanted(doc: _Doc, q: SearchQuery) -> bool:
    return (
        q.type in (None, doc.context.type)
        and q.context in (None, str(doc.context))
        and q.role in (None, doc.role)
        and (q.since is None or doc.ts >= q.since)
    )


# ---- placing hits in their conversation ----------------------------------------------------
# The indexes hold every history item of every segment; what a user opens is a context's
# conversation, its head's lineage (sessions.messages, the one rule). Placing reads that
# lineage once per context a query's hits are in, headers as stored (blobs are not read).

_Key = tuple[str, str, int, int | None]
"""A message's identity: (session, segment, seq, place in a header's history or None)."""


@dataclass(slots=True)
class _Placed:
    hit: SearchHit
    key: _Key
    """The original's identity: the hit's own place, or where its copy comes from."""
    own: bool
    """The hit is the original, not a copy (a fork's or a compaction's)."""


class _Places:
    """Places a query's hits, reading each context's conversation and each header once."""

    def __init__(self, store: Store, phrases: list[list[str]]) -> None:
        self.store = store
        self.phrases = phrases
        self.conversations: dict[str, tuple[str, dict[tuple[str, int, int | None], int]]] = {}
        self.headers: dict[tuple[str, str], Mapping[str, Any]] = {}
        self.items: dict[tuple[str, str], list[tuple[str, str, list[str]]]] = {}
        """Each header's items: role, text and tokens."""
        self.used: dict[tuple[str, str], set[int]] = {}

    def place(
        self, hits: list[SearchHit], *, limit: int, all_branches: bool
    ) -> tuple[list[SearchHit], bool]:
        """The best ``limit`` hits placed, each message once; whether that is decided.

        Past ``limit``, only ties with the last that share a placed snippet are placed (a copy
        has its original's text and score): the rest (ties are common) are never read.
        """
        self.used.clear()  # which header items hits took: afresh for each list of hits
        placed: list[_Placed] = []
        snippets: set[str] = set()
        for i, hit in enumerate(hits):
            keep = _representatives(placed, all_branches) if len(placed) >= limit else set()
            if len(keep) >= limit:
                if hit.score != hits[i - 1].score:
                    return [placed[j].hit for j in sorted(keep)][:limit], True
                if hit.snippet not in snippets:
                    continue
            placed.append(self._one(hit))
            snippets.add(hit.snippet)
        keep = _representatives(placed, all_branches)
        # The hits ran out: more may be needed, or a copy's original may come after them.
        decided = len(keep) >= limit and all(placed[i].own for i in keep)
        return [placed[i].hit for i in sorted(keep)][:limit], decided

    def _one(self, hit: SearchHit) -> _Placed:
        session, segment = str(hit.session_id), str(hit.segment_id)
        index = self._header_index(hit) if hit.seq == 0 else None
        own: _Key = (session, segment, hit.seq, index)
        key = own
        if index is not None:
            sources = self._header(session, segment).get("history_from")
            source = sources[index] if isinstance(sources, list) and index < len(sources) else None
            if isinstance(source, Mapping):
                at = source.get("index")
                ids = str(source.get("session_id")), str(source.get("segment_id"))
                key = (*ids, int(source.get("seq") or 0), at if isinstance(at, int) else None)
        head_session, positions = self._conversation(hit.context)
        message = positions.get((segment, hit.seq, index)) if session == head_session else None
        branch = "off" if message is None else "head"
        placed = msgspec.structs.replace(hit, message=message, branch=branch)
        return _Placed(placed, key, key == own)

    def _conversation(self, context: str) -> tuple[str, dict[tuple[str, int, int | None], int]]:
        """The context's head session and the place of each message of its conversation."""
        found = self.conversations.get(context)
        if found is None:
            head = self.store.get_head(ContextId.parse(context))
            found = ("", {})
            if head is not None:
                with suppress(CorruptLog):  # damaged: its hits are placed off its head
                    found = self._places(head)
            self.conversations[context] = found
        return found

    def _places(self, head: PodMetadata) -> tuple[str, dict[tuple[str, int, int | None], int]]:
        """The head's session and the place of each message of its conversation."""
        session = head.session_id
        reads = sessions.lineage(self.store, session, head.segment_id, blobs="stored")
        for read in reads:
            self.headers[(str(session), str(read.header.get("segment_id", "")))] = read.header
        conversation = sessions.messages(reads)
        return str(session), {(m.segment_id, m.seq, m.index): i for i, m in enumerate(conversation)}

    def _header(self, session: str, segment: str) -> Mapping[str, Any]:
        header = self.headers.get((session, segment))
        if header is None:
            read = self.store.read_segment(SessionId(session), SegmentId(segment), stop_seq=0)
            header = self.headers[(session, segment)] = read.header
        return header

    def _header_index(self, hit: SearchHit) -> int | None:
        """Which header item a seq-0 hit is: the unclaimed one with the words and snippet."""
        session, segment = str(hit.session_id), str(hit.segment_id)
        items = self.items.get((session, segment))
        if items is None:
            history = self._header(session, segment).get("history")
            texts = [_role_text(item) for item in history] if isinstance(history, list) else []
            items = self.items[(session, segment)] = [(r, t, tokenize(t)) for r, t in texts]
        used = self.used.setdefault((session, segment), set())
        core = hit.snippet.strip(ELLIPSIS + " \n")
        best: tuple[int, int, int, int] | None = None
        for index, (role, text, tokens) in enumerate(items):
            if index in used:
                continue
            terms = sum(1 for phrase in self.phrases if phrase_count(tokens, phrase))
            rank = (int(role == hit.role), int(core in text), terms, -index)
            best = rank if best is None or rank > best else best
        if best is None:
            return None
        used.add(-best[3])
        return -best[3]


def _representatives(placed: list[_Placed], all_branches: bool) -> set[int]:
    """Which hits stay: each message once, by default.

    Its original where the conversation holds it; else one copy there (a compaction's kept turn
    first, else the best fork copy, or each with ``all_branches``); else, with ``all_branches``,
    its best hit off the head.
    """
    groups: dict[_Key, list[int]] = {}
    for i, p in enumerate(placed):
        groups.setdefault(p.key, []).append(i)
    keep: set[int] = set()
    for key, members in groups.items():
        head = [i for i in members if placed[i].hit.branch == "head"]
        original = [i for i in head if placed[i].own]
        same_session = [i for i in head if str(placed[i].hit.session_id) == key[0]]
        if original or same_session:
            keep.add((original or same_session)[0])
        elif head:
            keep.update(head if all_branches else head[:1])
        elif all_branches:
            keep.add(min(members, key=lambda i: (not placed[i].own, i)))
    return keep
