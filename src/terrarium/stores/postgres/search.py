"""``PostgresStore``'s derived state: the search index and the counts the listing reads.

Search finds what FsStore's index finds (:mod:`terrarium.index`): every history item
with text, a header's history with seq 0, the user's words as data, every term required, a
term of several words as a phrase, case and accents folded, CJK characters found inside words.
Each item is a ``search_docs`` row; ``tsv`` is ``to_tsvector('simple', words)`` under a GIN
index, and a query is one ``phraseto_tsquery('simple', ...)`` per term, ANDed. A row keeps no
copy of the item's text: a hit reads it from its entry's line, and ``ts_headline``
runs on the folded text of the hits alone.

Like the other stores' indexes it is brought up to the entries in batches: a segment's row
records how far the index has read it (``indexed_seq``) and whether entries wait (``dirty``,
under a partial index). :func:`index_segments` reads the waiting entries of dirty segments and
copies their listing counts onto the heads; the store runs it before every search and listing,
and every ``SEARCH_BATCH`` entries it appends.

Usage::

    with pool.connection() as conn:
        index_segments(conn, [(session_id, segment_id)])
        hits = find(conn, check_query(SearchQuery("deploy")), window=RANK_WINDOW)
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
import psycopg

from terrarium import codec
from terrarium.model import HISTORY_KINDS, SegmentId, SessionId
from terrarium.stores.base import SearchHit, SearchQuery
from terrarium.stores.postgres import _sql
from terrarium.text import (
    ELLIPSIS,
    HIGHLIGHT_CLOSE,
    HIGHLIGHT_OPEN,
    SEPARATOR,
    SNIPPET_TOKENS,
    fold,
    indexed_item,
    match_spans,
    query_terms,
    snippet_spans,
    token_re,
    tokenize,
)

# ts_headline: the same markers and about the same length as FsStore's FTS5 snippets.
HEADLINE_OPTIONS = (
    f'StartSel="{HIGHLIGHT_OPEN}", StopSel="{HIGHLIGHT_CLOSE}", MaxWords={SNIPPET_TOKENS}, '
    f"MinWords={SNIPPET_TOKENS // 2}, ShortWord=0, MaxFragments=1, HighlightAll=false"
)

# A history item as indexed: (place in a header's history or 0, seq, role, body).
_Doc = tuple[int, int, str, str]
# A history item with its place: (session, segment, ts, context type, item).
_PlacedDoc = tuple[SessionId, SegmentId, str, str, _Doc]

# --------------------------------------------------------------------------- queries


def find(conn: psycopg.Connection[Any], q: SearchQuery, *, window: int) -> list[SearchHit]:
    """Ranked hits for the checked query ``q``, ranked among its ``window`` newest matches.

    Ranking is ``ts_rank`` among the most recent matches (``id`` orders items by arrival: each
    batch is indexed in time order): the planner reads a rare word's matches from the GIN index
    and a common word's newest rows backwards by ``id`` until enough match, so neither costs
    more than the window.
    """
    prepared = query_terms(q.text)
    phrases = [tokenize(term) for term in prepared]
    params: dict[str, Any] = {f"t{i}": search_words(term) for i, term in enumerate(prepared)}
    params.update(window=window, limit=q.limit, options=HEADLINE_OPTIONS)
    filters = ""
    if q.context is not None:
        row = conn.execute(_sql.CONTEXT_SESSION, (q.context,)).fetchone()
        if row is None:
            return []
        filters += " AND d.session_id = %(session)s"
        params["session"] = row[0]
    for name in ("type", "role", "since"):
        value = getattr(q, name)
        if value is not None:
            column = "ts" if name == "since" else name
            filters += f" AND d.{column} {'>=' if name == 'since' else '='} %({name})s"
            params[name] = value
    # Never prepared: a generic plan cannot see how common the words are, and the best plan
    # differs (GIN bitmap for rare words, newest-first scan for common ones).
    statement = _sql.search(len(prepared), filters)
    rows = conn.execute(statement, params, prepare=False).fetchall()
    bodies = _hit_bodies(rows)
    found = [(row, body) for row, body in zip(rows, bodies, strict=True) if body is not None]
    if not found:
        return []
    params["words"] = [search_words(body) for _, body in found]
    marks = conn.execute(_sql.headlines(len(prepared)), params, prepare=False).fetchall()
    hits = []
    for (row, body), (marked,) in zip(found, marks, strict=True):
        session_id, segment_id, seq, _, score, context, created_at, role, ts, _ = row
        text, spans = _headline_spans(body, marked, phrases)
        date = created_at[:10]
        hits.append(
            SearchHit(
                context, date, session_id, segment_id, seq, role, ts, text, spans, float(score)
            )
        )
    return hits


def _hit_bodies(rows: Sequence[Sequence[Any]]) -> list[str | None]:
    """The indexed text of each hit's item, from its entry's line as the catch-up read it
    (:func:`line_docs`): a search row keeps no copy of it. None if the line holds no
    such item (lines are never rewritten: only a damaged line, which the catch-up skipped)."""
    items: dict[tuple[Any, Any, int], dict[int, str]] = {}  # a header's hits share its line
    bodies: list[str | None] = []
    for session_id, segment_id, seq, n, *_, text in rows:
        key = (session_id, segment_id, seq)
        if key not in items:
            try:
                line = codec.decode(text)
            except msgspec.DecodeError:
                line = None
            items[key] = {doc[0]: doc[3] for doc in line_docs(seq, line)}
        bodies.append(items[key].get(n))
    return bodies


class _FoldTable(dict[int, str]):
    """``str.translate`` table: a word character to its folded self, anything else to a space.

    Filled as characters are met (the table of all of Unicode would be large).
    """

    def __missing__(self, code: int) -> str:
        char = chr(code)
        if not token_re().fullmatch(char):
            folded = " "
        else:
            folded = fold(char)
            if len(folded) != 1:  # keep the text's length: positions map back onto it
                lower = char.lower()
                folded = lower if len(lower) == 1 else char
        self[code] = folded
        return folded


_FOLD = _FoldTable()
_ASCII_FOLD = bytes(
    c + 32 if 65 <= c <= 90 else c if 48 <= c <= 57 or 97 <= c <= 122 else 32 for c in range(128)
) + bytes(128)


def search_words(text: str) -> str:
    """What PostgreSQL indexes of ``text`` (as ``prepare_text`` left it): its words.

    Word characters (as FsStore's FTS5 tokenizer sees them) lower-cased without accents,
    everything else a space, one character for one, so that a ``ts_headline`` of the words is
    a slice of the text at the same offsets. PostgreSQL's parser, which is locale-dependent
    and finds e-mail addresses, URLs and numbers, thus sees only plain words, and accents
    are folded without the ``unaccent`` extension. CJK characters are words of their own
    (``prepare_text`` set them apart).
    """
    if text.isascii():
        return text.encode().translate(_ASCII_FOLD).decode()
    return text.translate(_FOLD)


def _headline_spans(
    body: str, marked: str, phrases: Sequence[Sequence[str]]
) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The snippet of ``body`` that ``ts_headline`` chose in its words, with highlights.

    ``ts_headline`` marks single words; FsStore's FTS5 snippets mark whole phrase matches
    (``don't``, a CJK word) and fold accents. So only the slice comes from the headline, and
    the phrase matches in it are found again here, with FsStore's tokens.
    """
    plain = marked.replace(HIGHLIGHT_OPEN, "").replace(HIGHLIGHT_CLOSE, "")
    words = search_words(body)
    start = words.find(plain)
    if start < 0:  # cannot happen for a headline of these words; show the words then
        return snippet_spans(marked)
    end = start + len(plain)
    fragment = body[start:end]
    merged = match_spans(fragment, phrases)
    out = [ELLIPSIS] if words[:start].strip() else []
    at = 0
    for first, last in merged:
        out += [fragment[at:first], HIGHLIGHT_OPEN, fragment[first:last], HIGHLIGHT_CLOSE]
        at = last
    out.append(fragment[at:])
    if words[end:].strip():
        out.append(ELLIPSIS)
    return snippet_spans("".join(out))


# --------------------------------------------------------------------------- the catch-up


def index_segments(
    conn: psycopg.Connection[Any], segments: Sequence[tuple[SessionId, SegmentId]]
) -> None:
    """Index the unread entries of ``segments`` in one transaction, holding their rows (their
    appends wait; another catch-up of them waits, then finds nothing to do), and copy their
    listing counts onto their heads (so it locks segments, then heads, as a delete does)."""
    with conn.transaction():
        rows = conn.execute(
            _sql.DIRTY, ([s for s, _ in segments], [g for _, g in segments])
        ).fetchall()
        if not rows:
            return
        sessions, ids = [row[0] for row in rows], [row[1] for row in rows]
        types = {(s, g): type for s, g, _, _, type in rows}
        bounds = (sessions, ids, [row[2] for row in rows], [row[3] for row in rows])
        docs: list[_PlacedDoc] = []
        for s, g, seq, text in conn.execute(_sql.UNREAD, bounds):
            try:
                line = codec.decode(text)
            except msgspec.DecodeError:
                continue  # a damaged line holds nothing to find; reading it reports it
            ts = str(line.get("ts", "")) if isinstance(line, dict) else ""
            if types[s, g]:  # '': a detached session's, indexed once a context adopts it
                docs += [(s, g, ts, types[s, g], doc) for doc in line_docs(seq, line)]
        # In time order, so that ``id`` follows arrival within the batch too.
        docs.sort(key=lambda doc: doc[2])
        insert_docs(conn, docs)
        conn.execute(_sql.MARK_READ, (sessions, ids, [row[3] for row in rows]))
        conn.execute(_sql.COUNT_HEADS, (sessions, ids))


def insert_docs(conn: psycopg.Connection[Any], docs: Sequence[_PlacedDoc]) -> None:
    """Add ``docs`` to the search index, as binary arrays in one statement."""
    if not docs:
        return
    columns = [
        [session for session, _, _, _, _ in docs],
        [segment for _, segment, _, _, _ in docs],
        [doc[1] for _, _, _, _, doc in docs],
        [doc[0] for _, _, _, _, doc in docs],
        [type for _, _, _, type, _ in docs],
        [doc[2] for _, _, _, _, doc in docs],
        [ts for _, _, ts, _, _ in docs],
        [search_words(doc[3]) for _, _, _, _, doc in docs],
    ]
    conn.execute(_sql.INSERT_DOCS, columns)


def line_docs(seq: int, line: Any) -> list[_Doc]:
    """The history items with text that an entry line holds: a header's history (all with
    seq 0: a compaction's summary, an import), or one item."""
    if not isinstance(line, Mapping):
        return []
    if seq == 0:
        history = line.get("history")
        if not isinstance(history, list):
            return []
        docs = (_item_doc(n, 0, item) for n, item in enumerate(history))
        return [doc for doc in docs if doc is not None]
    if line.get("kind") not in HISTORY_KINDS:
        return []
    doc = _item_doc(0, seq, line.get("item"))
    return [] if doc is None else [doc]


def _item_doc(n: int, seq: int, item: Any) -> _Doc | None:
    """The indexed form of one history item, or None when it has no text to find."""
    found = indexed_item(item)
    return None if found is None else (n, seq, found[0], _pg_text(found[1]))


def _pg_text(text: str) -> str:
    """``text`` as PostgreSQL can store it: no NUL, no lone surrogates (not UTF-8: ``?``).

    A NUL becomes the separator that ``prepare_text`` puts around CJK characters: it parts
    words, as in FTS5, and snippets leave it out, as FTS5's leave out the NUL.
    """
    if "\x00" in text:
        text = text.replace("\x00", SEPARATOR)
    if not text.isascii():
        try:
            text.encode()
        except UnicodeEncodeError:
            text = text.encode(errors="replace").decode()
    return text


# --------------------------------------------------------------------------- listing counts


def base_items(
    header: Mapping[str, Any], prefix: Callable[[SegmentId, int | None], int | None]
) -> int:
    """The history items a segment starts with, as a restore counts them: its header's
    history, or, for a fork that continues its parent, the parent's restored items up to the
    fork point, which ``prefix(parent, at_seq)`` gives (None: no such parent).

    A segment's message count is this base (set when the segment is made) plus its own items,
    kept by every append; the heads carry a copy, made when a head moves and by every catch-up.
    """
    history = header.get("history")
    if isinstance(history, list):
        return len(history)
    origin = header.get("origin")
    if not isinstance(origin, Mapping) or origin.get("kind") != "fork":
        return 0
    try:
        parent = uuid.UUID(str(origin.get("parent")))
    except ValueError:
        return 0
    at_seq = origin.get("at_seq")
    found = prefix(parent, at_seq if isinstance(at_seq, int) else None)
    return found or 0
