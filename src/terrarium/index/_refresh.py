"""One refresh of the derived index: what changed in a store, applied in SQL.

:class:`IndexUpdate` works inside the caller's write transaction, reading through a
:class:`Source`. What cannot be read is recorded, not skipped: a session's first problem (one
line naming the file) is its summary's ``problem``; its counts cover what could be read.
"""

from __future__ import annotations

import logging
import sqlite3
import uuid
from collections.abc import Container, Iterator, Mapping
from typing import Any, Protocol

import msgspec

from terrarium.errors import CorruptLog, StoreError
from terrarium.index import _figures
from terrarium.index import _sql as sql
from terrarium.index._fts import role_text
from terrarium.model import HISTORY_KINDS, ContextId, SessionId
from terrarium.stores.base import PodMetadata, SegmentRead, SegmentStat
from terrarium.text import prepare_text

log = logging.getLogger(__name__)


class IndexStats(msgspec.Struct):
    """Counters of the work refreshes did, for tests and benchmarks."""

    sessions: int = 0
    """Sessions examined."""
    segments_read: int = 0
    """Segment files read (only their new bytes)."""
    bytes_read: int = 0
    items: int = 0
    """History items indexed."""


class SegmentRow(msgspec.Struct):
    """A segment row, as the refresh works on it (``sql.SELECT_SEGMENTS`` reads its fields)."""

    id: int
    session: int
    segment_id: str
    ino: int
    size_seen: int
    offset: int
    next_seq: int
    items: int
    continues: bool
    parent: str | None = None
    at_seq: int | None = None
    last_ts: str | None = None
    problem: str | None = None
    """Why the segment cannot be read (one line, naming its file), or None."""
    fork_source: str | None = None
    """The context its header says it was forked from (``fork_context``), or None."""


class SessionRow(msgspec.Struct):
    """A session row, as the refresh works on it."""

    id: int
    session_id: str
    folder: str
    tid: int
    values: tuple[Any, ...] = ()
    """The head-derived columns as stored (see ``IndexUpdate.index_folder``)."""
    segments: dict[str, SegmentRow] = msgspec.field(default_factory=dict)


class Source(Protocol):
    """What a refresh reads of a store. A session is found by its *folder*: a path relative
    to a filesystem store's root, the session id elsewhere."""

    def pointer(self, session_id: str) -> str | None:
        """The session's folder, or None if it is gone."""

    def segments(self, folder: str) -> dict[str, SegmentStat]:
        """The session's segments (none if it is gone)."""

    def stat_segment(self, folder: str, segment_id: str) -> SegmentStat | None:
        """One segment's stat, or None if it is gone."""

    def head(self, folder: str) -> tuple[PodMetadata | None, str | None]:
        """The session's head and what is wrong with it (None, None: gone or detached)."""

    def frozen(self, session_id: str | SessionId) -> bool:
        """Whether the session is archived (frozen): out of the index."""

    def salvaged(self, folder: str) -> set[str]:
        """The damaged segments of the session that a salvage replaced already."""

    def segment_path(self, folder: str, segment_id: str) -> str:
        """How problems name a segment."""

    def head_path(self, folder: str) -> str:
        """How problems name a session's head record."""

    def read_lines(
        self, folder: str, segment_id: str, offset: int, seq: int
    ) -> tuple[list[dict[str, Any]], int, int]:
        """The segment's complete lines from ``offset`` (its line ``seq``) on, the offset
        after them and the segment's size (OSError: unreadable; StoreError: a bad line)."""

    def walk(self) -> Iterator[tuple[str, dict[str, SegmentStat]]]:
        """Every session's folder with its segments (a full refresh)."""

    def count_sessions(self) -> int:
        """How many sessions a walk finds (cheaper than walking)."""


class _Owner(Protocol):
    """What a refresh uses of its index (:class:`terrarium.index.SearchIndex`): named here, so
    this module does not import the one that imports it."""

    source: Source
    stats: IndexStats
    root: str

    def warn_once(self, key: str, message: str, *args: object) -> None: ...


class IndexUpdate:
    """The changes of one refresh, applied in the caller's transaction."""

    def __init__(
        self,
        index: _Owner,
        conn: sqlite3.Connection,
        *,
        defer_recent: bool,
        recent_size: int,
    ) -> None:
        self.index = index
        # A full pass rebuilds fts_recent at the end instead of feeding it item by item.
        self.defer_recent = defer_recent
        self.recent_size = recent_size  # read by the caller, where tests can set it
        self.source = index.source
        self.conn = conn
        self.stats = index.stats
        self.types: dict[str, int] = {name: tid for tid, name in conn.execute(sql.TYPES)}
        self.recent_floor = int(conn.execute(sql.RECENT_FLOOR).fetchone()[0])
        # New items always land in fts_recent's range, even after the newest were deleted.
        (last,) = conn.execute(sql.LAST_DOC).fetchone()
        self.next_doc = max(int(last) + 1, self.recent_floor)
        self.pending: list[tuple[int, int, int, int, int, str, str, str]] = []
        self.changed: dict[int, SessionRow] = {}
        self.gained: dict[int, tuple[int, list[dict[str, Any]]]] = {}
        """The lines this refresh read, per segment row: its first seq, the lines (kept
        until their session's figures are folded, see :meth:`_figure`)."""
        self.recent_stale = False
        # A full pass looks at every session: load them all at once, not two queries each.
        # Otherwise each session is loaded once, when first asked for (None: not indexed).
        self.cache: dict[str, SessionRow | None] = self._rows() if defer_recent else {}
        row = conn.execute(sql.META, ("recent_count",)).fetchone()
        self.recent_count = int(row[0]) if row else 0

    # ---------------------------------------------------------------- sessions

    def _rows(self, sid: str | None = None) -> dict[str, SessionRow | None]:
        """The session rows with their segments: every one, or only ``sid``'s."""
        params = () if sid is None else (sid,)
        sessions: dict[str, SessionRow | None] = {}
        by_id: dict[int, SessionRow] = {}
        for row in self.conn.execute(sql.SESSIONS if sid is None else sql.SESSION, params):
            session = SessionRow(row[0], row[11], row[6], row[4], tuple(row[1:11]))  # SESSIONS
            sessions[session.session_id] = by_id[session.id] = session
        segments = sql.SELECT_SEGMENTS if sid is None else sql.SEGMENTS_OF_SESSION
        for seg in self.conn.execute(segments, params):
            segment = SegmentRow(*seg)
            segment.continues = bool(segment.continues)
            if segment.session in by_id:
                by_id[segment.session].segments[segment.segment_id] = segment
        return sessions

    def _load(self, sid: str) -> SessionRow | None:
        if not self.defer_recent and sid not in self.cache:
            self.cache[sid] = self._rows(sid).get(sid)
        return self.cache.get(sid)

    def index_session(self, sid: str, *, watched_only: bool = False) -> None:
        """Bring one session up to date (after a marker, or while it is watched)."""
        session = self._load(sid)
        folder = session.folder if session is not None else self.source.pointer(sid)
        if folder is None:
            return  # deleted before it was ever indexed
        if watched_only and session is not None:  # ``stat`` the segments it has
            for segment in list(session.segments.values()):
                st = self.source.stat_segment(folder, segment.segment_id)
                if st is None:
                    break  # one is gone: read the session afresh
                if self._index_segment(session, folder, segment.segment_id, st):
                    self.changed[session.id] = session
            else:
                if session.id in self.changed:
                    self._figure(session, folder)
                return
        self.index_folder(folder, self.source.segments(folder), hint=sid)

    def index_folder(
        self, folder: str, segments: dict[str, SegmentStat], *, hint: str | None
    ) -> str | None:
        """Index the session whose folder is ``folder``; return its session id, or None."""
        self.stats.sessions += 1
        head, problem = self.source.head(folder)
        if hint is not None and (head is None or str(head.session_id) != hint):
            self.drop_session(hint)  # deleted (its folder is gone or holds a newer session)
        if head is None:
            if problem is not None:
                self.index.warn_once(folder, "search index: skipping %s", problem)
            return None
        if self.source.frozen(head.session_id):  # archived: out of the index
            self.drop_session(str(head.session_id))
            return None
        if problem is not None:
            log.info("search index: %s", problem)  # ``list`` reports it (ContextSummary)
        try:
            context = ContextId.parse(head.context)
        except ValueError:
            self.index.warn_once(folder, "search index: skipping %s: bad context in head", folder)
            return None
        session, changed = self._head_row(folder, head, context, self._kept(problem))
        for segment_id in [g for g in session.segments if g not in segments]:  # gone
            self._drop_segment(session.segments.pop(segment_id))
            changed = True
        for segment_id, st in sorted(segments.items()):
            changed = self._index_segment(session, folder, segment_id, st) or changed
        if changed:
            self.changed[session.id] = session
            self._figure(session, folder)
        return str(head.session_id)

    def _head_row(
        self, folder: str, head: PodMetadata, context: ContextId, problem: str | None
    ) -> tuple[SessionRow, bool]:
        """The session's row, inserted or brought up to date with ``head``; whether it changed."""
        sid = str(head.session_id)
        session = self._load(sid)
        tid = self.types.get(context.type)
        if tid is None:
            cur = self.conn.execute(sql.INSERT_TYPE, (context.type,))
            tid = self.types[context.type] = int(cur.lastrowid or 0)
        values = (
            str(context),
            context.type,
            context.name,
            tid,
            head.created_at[:10],
            folder,
            str(head.segment_id),
            head.created_at,
            head.updated_at,
            problem,
        )
        if session is None:
            cur = self.conn.execute(sql.INSERT_SESSION, (*values, head.updated_at, sid))
            session = SessionRow(int(cur.lastrowid or 0), sid, folder, tid, values)
            self.cache[sid] = session
            # Another session row claiming the same context is stale if its folder's head
            # is not that session's any more: drop it.
            claimants = (context.type, context.name, session.id)
            for (other,) in self.conn.execute(sql.CLAIMANTS, claimants).fetchall():
                row = self.conn.execute(sql.SESSION_FOLDER, (other,)).fetchone()
                found = self.source.head(row[0])[0] if row is not None else None
                if found is None or str(found.session_id) != other:
                    self.drop_session(other)
            return session, True
        if session.values == values:
            return session, False
        self.conn.execute(sql.UPDATE_SESSION_HEAD, (*values, session.id))
        session.values = values
        return session, True

    def _figure(self, session: SessionRow, folder: str) -> None:
        """Bring the session's figures up to date (new head lines, or the lineage afresh)."""
        gained = {
            segment.segment_id: self.gained.pop(segment.id)
            for segment in session.segments.values()
            if segment.id in self.gained
        }
        head = session.segments.get(session.values[6])
        folded = self.conn.execute(sql.FOLDED, (session.id,)).fetchone()
        lines = gained.get(head.segment_id) if head is not None else None
        try:
            if head is None:
                raise CorruptLog(f"{session.session_id}: its head segment is missing")
            if folded == (head.id, lines[0] if lines else folded[1]) and folded[1] is not None:
                if lines:
                    found = _figures.of_lines(lines[1], session.session_id, head.segment_id)
                    _figures.write(self.conn, session.id, session.tid, found)
                    added = (found.turns, found.total_tokens, head.next_seq, session.id)
                    self.conn.execute(sql.ADD_FIGURES, added)
                return
            reads = self._lineage(session, folder, head, gained)
            found = _figures.of_lineage(reads, uuid.UUID(session.session_id))
        except (StoreError, OSError, KeyError, TypeError, ValueError) as exc:
            log.info("search index: no figures for %s: %s", session.session_id, exc)
            head, found = None, _figures.Figures()
        # Replace the session's figures with ``found``, folded up to ``head``'s end.
        for statement in sql.DELETE_FIGURES:
            self.conn.execute(statement, (session.id,))
        _figures.write(self.conn, session.id, session.tid, found)
        root = session.segments.get(min(session.segments)) if session.segments else None
        fork_source = root.fork_source if root is not None else None
        folded = (head.id, head.next_seq) if head is not None else (None, None)
        figures = (found.turns, found.total_tokens, fork_source, *folded, session.id)
        self.conn.execute(sql.SET_FIGURES, figures)

    def _lineage(
        self,
        session: SessionRow,
        folder: str,
        head: SegmentRow,
        gained: Mapping[str, tuple[int, list[dict[str, Any]]]],
    ) -> list[SegmentRead]:
        """The head lineage's reads, oldest first, as far as the index has read the head."""
        reads: list[SegmentRead] = []
        for segment, stop in _chain(session, head):
            if segment is None:
                raise CorruptLog(f"{session.session_id}: a segment of its lineage is missing")
            end = head.next_seq - 1 if stop is None else stop
            found = gained.get(segment.segment_id)
            if found is None or found[0] != 0:
                found = (0, self.source.read_lines(folder, segment.segment_id, 0, 0)[0])
            lines = [line for line in found[1] if line["seq"] <= end]
            if not lines or lines[0]["kind"] != "header":
                where = self.source.segment_path(folder, segment.segment_id)
                raise CorruptLog(f"{where}: no header")
            reads.append(SegmentRead(lines[0], lines[1:], lines[-1]["seq"] + 1, None))
        reads.reverse()
        return reads

    def drop_session(self, sid: str) -> None:
        """Remove a session that no longer exists, with its segments and items."""
        session = self._load(sid)
        if session is None:
            return
        for segment in session.segments.values():
            self._drop_segment(segment)
        for statement in sql.DELETE_FIGURES:
            self.conn.execute(statement, (session.id,))
        self.conn.execute(sql.DELETE_SESSION, (session.id,))
        self.changed.pop(session.id, None)
        self.cache.pop(sid, None)

    def drop_unseen(self, seen: Container[str | None]) -> None:
        """Drop every session but those a walk of the whole store has ``seen``."""
        for (sid,) in self.conn.execute(sql.SESSION_IDS).fetchall():
            if sid not in seen:
                self.drop_session(sid)

    # ---------------------------------------------------------------- segments

    def _drop_segment(self, segment: SegmentRow) -> None:
        """Remove a segment's items from both FTS tables, then from ``docs``, then its row."""
        self.flush()
        self.conn.execute(sql.FTS_DELETE_SEGMENT.format(table=sql.FTS), (segment.id, 0))
        self.recent_stale = True
        if not self.defer_recent:
            recent = (segment.id, self.recent_floor)
            (count,) = self.conn.execute(sql.COUNT_RECENT_OF_SEGMENT, recent).fetchone()
            self.conn.execute(sql.FTS_DELETE_SEGMENT.format(table=sql.FTS_RECENT), recent)
            self.recent_count -= count
        self.conn.execute(sql.DELETE_DOCS, (segment.id,))
        self.conn.execute(sql.DELETE_SEGMENT, (segment.id,))

    def _index_segment(
        self, session: SessionRow, folder: str, segment_id: str, st: SegmentStat
    ) -> bool:
        """Read the segment's new complete lines (a torn tail once it is complete, a shrunk or
        replaced segment again); return whether anything changed."""
        segment = self._segment_row(session, segment_id, st)
        if st.size == segment.size_seen and segment.size_seen:
            return False
        where = self.source.segment_path(folder, segment_id)
        size, read = segment.size_seen, 0
        problem: str | None = None
        try:
            lines, offset, size = self.source.read_lines(
                folder, segment_id, segment.offset, segment.next_seq
            )
            read = offset - segment.offset
            self.stats.segments_read += 1
            self.stats.bytes_read += read
            if lines:
                self._index_lines(session, segment, lines, where)
                segment.offset = offset
        except FileNotFoundError:
            return False
        except OSError as exc:
            problem = f"{where}: unreadable ({exc.strerror or exc})"
        except StoreError as exc:  # unreadable lines: what came before them stays indexed
            problem = _problem(exc, where)
        segment.size_seen = size  # unchanged if it could not be read
        if segment.offset == 0 and problem is None:  # not even a whole header line yet
            problem = f"{where}: {'torn header line' if size else 'empty file, no header'}"
        kept = self._kept(problem)
        if kept is not None and kept != segment.problem:
            log.info("search index: %s", problem)  # ``list`` reports it (ContextSummary)
        changed = bool(read) or kept != segment.problem
        segment.problem = kept
        # What it has read of the file: every field from ``size_seen`` on, then the row's id.
        progress = (*msgspec.structs.astuple(segment)[4:], segment.id)
        self.conn.execute(sql.UPDATE_SEGMENT, progress)
        return changed

    def _segment_row(self, session: SessionRow, segment_id: str, st: SegmentStat) -> SegmentRow:
        """The segment's row; a new one if it is new, or was replaced or shrunk under us."""
        segment = session.segments.get(segment_id)
        if segment is not None and (st.ino != segment.ino or st.size < segment.offset):
            # Replaced or shrunk under us (a repair): read it again from the start.
            self._drop_segment(segment)
            del session.segments[segment_id]
            segment = None
        if segment is None:
            cur = self.conn.execute(sql.INSERT_SEGMENT, (session.id, segment_id, st.ino))
            segment = SegmentRow(
                int(cur.lastrowid or 0), session.id, segment_id, st.ino, 0, 0, 0, 0, False
            )
            session.segments[segment_id] = segment
        return segment

    def _index_lines(
        self, session: SessionRow, segment: SegmentRow, lines: list[dict[str, Any]], where: str
    ) -> None:
        docs: list[tuple[int, str, str, str]] = []  # seq, role, ts, text
        seq = segment.next_seq
        last_ts = segment.last_ts
        for line in lines:
            if line["seq"] != seq:
                raise CorruptLog.seq_out_of_order(where, line["seq"], seq)
            ts = str(line.get("ts", ""))
            kind = line["kind"]
            if seq == 0:
                if kind != "header":
                    raise CorruptLog(f"{where}:1: the first line is not a segment header")
                origin = line.get("origin")
                origin = origin if isinstance(origin, dict) else {}
                history = line.get("history")
                segment.continues = origin.get("kind") == "fork" and history is None
                if segment.continues:
                    parent, at_seq = origin.get("parent"), origin.get("at_seq")
                    segment.parent = str(parent) if parent is not None else None
                    segment.at_seq = at_seq if isinstance(at_seq, int) else None
                source = origin.get("source")
                forked = origin.get("kind") == "fork" and isinstance(source, str)
                segment.fork_source = source if forked else None
                for item in history if isinstance(history, list) else ():
                    docs.append(_doc(0, item, ts))
            elif kind in HISTORY_KINDS:
                docs.append(_doc(seq, line.get("item"), ts))
            last_ts = ts
            seq += 1
        rows = enumerate(docs, self.next_doc)
        self.pending += [(doc, segment.id, session.id, session.tid, *d) for doc, d in rows]
        self.next_doc += len(docs)
        self.gained.setdefault(segment.id, (segment.next_seq, []))[1].extend(lines)
        self.stats.items += len(docs)
        segment.items += len(docs)
        segment.next_seq = seq
        segment.last_ts = last_ts
        if len(self.pending) >= 5000:
            self.flush()

    def flush(self) -> None:
        """Write pending items to ``docs`` and both FTS tables."""
        if not self.pending:
            return
        first, last = self.pending[0][0], self.pending[-1][0]
        texts = sum(1 for row in self.pending if row[-1])
        self.conn.executemany(sql.INSERT_DOCS, self.pending)
        self.pending.clear()
        self.recent_stale = True
        for table in (sql.FTS,) if self.defer_recent else sql.FTS_TABLES:
            self.conn.execute(sql.FTS_ADD.format(table=table), (first, last))
        if not self.defer_recent:
            self.recent_count += texts

    def finish(self) -> None:
        """Flush, recompute the changed sessions' summaries and trim ``fts_recent``."""
        self.flush()
        for session in self.changed.values():
            self._summarise(session)
        if (self.defer_recent and self.recent_stale) or self.recent_count > 2 * self.recent_size:
            row = self.conn.execute(sql.RECENT_FLOOR_AT, (self.recent_size - 1,)).fetchone()
            self.recent_floor = int(row[0]) if row else 1
            self.conn.execute(sql.SET_RECENT_FLOOR, (self.recent_floor,))
            self.conn.execute(sql.FTS_REBUILD.format(table=sql.FTS_RECENT))
            (self.recent_count,) = self.conn.execute(sql.COUNT_RECENT).fetchone()
        self.conn.execute(sql.SET_META, ("recent_count", str(self.recent_count)))

    def _kept(self, problem: str | None) -> str | None:
        """``problem`` as the index keeps it: the root named by ``sql.ROOT``."""
        return problem and problem.replace(self.index.root, sql.ROOT)

    def _summarise(self, session: SessionRow) -> None:
        """Store the head's message count, last activity and the session's first problem."""
        head_id, folder, head_problem = session.values[6], session.values[5], session.values[9]
        problems = [head_problem or ""]
        head = session.segments.get(head_id)
        if head is None:
            where = self.source.head_path(folder)
            problems.append(self._kept(f"{where}: its segment {head_id} does not exist"))
        damaged = [sid for sid in sorted(session.segments) if session.segments[sid].problem]
        if damaged:  # rare: a damaged segment that a salvage replaced is no problem now
            done = self.source.salvaged(folder)
            problems += [session.segments[sid].problem or "" for sid in damaged if sid not in done]
        count, child = 0, head
        for segment, stop in _chain(session, head):
            if segment is None:
                if stop is not None and child is not None:  # a parent, not the head, is lost
                    where = self.source.segment_path(folder, child.segment_id)
                    lost = f"{where}: continues segment {child.parent}, which is lost"
                    problems.append(self._kept(lost))
                break
            child = segment
            if stop is None:
                count += segment.items
            else:
                count += self.conn.execute(sql.COUNT_DOCS_TO, (segment.id, stop)).fetchone()[0]
        last_active = head.last_ts if head is not None else None
        problem = next((p for p in problems if p), None)
        self.conn.execute(sql.SET_SUMMARY, (count, last_active, problem, session.id))


# --------------------------------------------------------------------------- helpers


def _chain(
    session: SessionRow, head: SegmentRow | None
) -> Iterator[tuple[SegmentRow | None, int | None]]:
    """The head's lineage, newest first: each segment (None: missing), with the last seq of it
    that its child continues (None for the head)."""
    segment, stop = head, None
    for _ in range(10_000):  # bounded in case of a cycle in damaged headers
        yield segment, stop
        if segment is None or not segment.continues or segment.parent is None:
            return
        stop = segment.at_seq if segment.at_seq is not None else -1
        segment = session.segments.get(segment.parent)


def _problem(exc: StoreError, where: str) -> str:
    """``exc`` in one line that names the segment."""
    reason = " ".join(str(exc).split())
    return reason if where in reason else f"{where}: {reason}"


def _doc(seq: int, item: Any, ts: str) -> tuple[int, str, str, str]:
    """(seq, role, ts, text as indexed) for one history item."""
    role, text = role_text(item)
    return seq, role, ts, prepare_text(text)
