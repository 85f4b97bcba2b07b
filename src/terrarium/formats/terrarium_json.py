"""The legacy Terrarium JSON session file: read it, write it, import it into the log, export to it.

The format (``seeds/004``) is one JSON object per context, rewritten after every message::

    {"session_id": "main", "context_type": "cli", "system_prompt": "...",
     "messages": [{"role": "user", "content": "Hello!", "timestamp": "2025-11-06T14:30:00"}],
     "metadata": {"created_at": ..., "last_active": ..., "message_count": 2,
                  "session_id": "main", "context_type": "cli", "session_date": "2025-11-06"}}

It lives at ``{type}/{date}/{name}.json`` (or flat: ``{type}/{name}.json``, ``{name}.json``).
:func:`load` is forgiving where the data is and strict where it is not
(:class:`LegacyFormatError`); :func:`dump` gives the seed's exact structure, so
``dump(load(f))`` is ``f``. :func:`import_session` makes a native context, keeping what the
log has no place for under :data:`LEGACY_HEADER_KEY`; :func:`export_context` writes any
context back. The legacy file is never modified.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar, cast

from terrarium import codec, sessions
from terrarium.errors import InvalidEntry
from terrarium.formats import iter_legacy_files as iter_legacy_files  # public here too
from terrarium.model import (
    DATE_RE,
    TYPE_RE,
    ContextId,
    LogEntry,
    LoggedItem,
    RestoredState,
    SegmentId,
    SegmentOrigin,
    SegmentStartState,
    SessionId,
    chat_view,
    item_text,
    new_segment_id,
    new_session_id,
    parse_timestamp,
    printable,
    short_repr,
)
from terrarium.stores._files import write_atomic
from terrarium.stores.base import PodMetadata, SegmentRead, Store

LEGACY_HEADER_KEY = "legacy"
"""The root header key under which :func:`import_session` keeps what the log has no place for."""

MESSAGE_ROLES: frozenset[str] = frozenset(("user", "assistant", "system"))
"""Roles a legacy message may have (the seed writes ``user`` and ``assistant``)."""


T = TypeVar("T")


class LegacyFormatError(InvalidEntry):
    """A file is not a legacy Terrarium JSON session, or a field has the wrong type."""


@dataclass(frozen=True, slots=True)
class LegacyMessage:
    """One message of a legacy session."""

    role: str
    """``user`` or ``assistant`` (``system`` is accepted too)."""
    content: str
    timestamp: str
    """ISO 8601, as written (derived when the file had none)."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Unknown keys, kept as they were."""


@dataclass(frozen=True, slots=True)
class LegacyMetadata:
    """The ``metadata`` object of a legacy session."""

    created_at: str
    """Creation time, exactly as written (or derived, see :func:`load`)."""
    last_active: str
    """Time of the last activity, exactly as written (or derived)."""
    message_count: int
    """Number of messages, as written (or derived from the messages)."""
    session_id: str
    """The context name, as the metadata repeats it."""
    context_type: str
    """The context type, as the metadata repeats it."""
    session_date: str
    """The date folder, ``YYYY-MM-DD``."""
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Unknown keys, kept as they were."""


@dataclass(frozen=True, slots=True)
class LegacySession:
    """A legacy Terrarium JSON session file, every field filled in."""

    session_id: str
    """The context *name* (``main`` in ``cli:main``), not a session UUID."""
    context_type: str
    """The context type (``cli``, ``irc``, ...)."""
    system_prompt: str
    """The system prompt (empty when the file had none)."""
    messages: tuple[LegacyMessage, ...]
    """The conversation, oldest first."""
    metadata: LegacyMetadata
    extra: Mapping[str, Any] = field(default_factory=dict)
    """Unknown top-level keys, kept as they were."""
    path: Path | None = field(default=None, compare=False)
    """The file it was read from."""
    derived: frozenset[str] = field(default=frozenset(), compare=False)
    """Fields the file lacked and :func:`load` derived (``metadata.created_at``, ...)."""

    @property
    def context(self) -> ContextId:
        """The context id ``type:name`` (raises InvalidContextId for an unusable name)."""
        return ContextId(self.context_type, self.session_id)


_KEYS: dict[type, tuple[str, ...]] = {
    record: tuple(f.name for f in fields(record) if f.compare and f.name != "extra")
    for record in (LegacySession, LegacyMetadata, LegacyMessage)
}
"""Each record's keys in the seed's order: its fields but ``extra`` and those :func:`load` adds."""


def to_log_ts(text: str) -> str:
    """A legacy timestamp in the log's form: UTC, microseconds, ``Z``."""
    return to_legacy_ts(text) + "Z"


def to_legacy_ts(text: str) -> str:
    """A log timestamp in the seed's form: naive UTC with microseconds, no ``Z``."""
    return _seed_ts(parse_timestamp(text))


def _seed_ts(moment: dt.datetime) -> str:
    return moment.replace(tzinfo=None).isoformat(timespec="microseconds")


def _mtime_ts(path: Path) -> str:
    ns = path.stat().st_mtime_ns
    return _seed_ts(dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=ns // 1000))


class _Checker:
    """Type checks that raise one-line errors naming the file, and the fields it lacks."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.derived: set[str] = set()

    def fail(self, problem: str) -> LegacyFormatError:
        return LegacyFormatError(f"{self.where}: {problem}")

    def given(self, raw: Mapping[str, Any], name: str, kind: Callable[[Any, str], T]) -> T | None:
        """Field ``name`` (``metadata.x``: the metadata's ``x``) checked by ``kind``, else None."""
        value = raw.get(name.rpartition(".")[2])
        if value is None:
            self.derived.add(name)
            return None
        return kind(value, f"'{name}'")

    def string(self, value: Any, what: str) -> str:
        if not isinstance(value, str):
            raise self.fail(f"{what} must be a string, not {type(value).__name__}")
        return value

    def name(self, value: Any, what: str) -> str:
        text = self.string(value, what)
        if not text:
            raise self.fail(f"{what} is empty")
        return text

    def count(self, value: Any, what: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise self.fail(f"{what} must be a count, not {short_repr(value)}")
        return value

    def timestamp(self, value: Any, what: str) -> str:
        text = self.string(value, what)
        try:
            to_log_ts(text)
        except (ValueError, OverflowError):
            raise self.fail(f"{what} {short_repr(text)} is not an ISO 8601 time") from None
        return text

    def date(self, value: Any, what: str) -> str:
        text = self.string(value, what)
        try:
            if not DATE_RE.fullmatch(text):
                raise ValueError
            dt.date.fromisoformat(text)
        except ValueError:
            raise self.fail(f"{what} {short_repr(text)} is not a YYYY-MM-DD date") from None
        return text


def load(
    path: str | os.PathLike[str],
    *,
    root: str | os.PathLike[str] | None = None,
    raw: bytes | None = None,
) -> LegacySession:
    """Read a legacy session file.

    ``root`` is the sessions folder: it tells a top-level ``{name}.json`` from a flat
    ``{type}/{name}.json``; without it the type comes from the folders. Missing metadata is
    derived (from the messages, the date folder, else the file's mtime); a message without a
    timestamp takes the one before it; naive times are UTC; unknown keys are kept. A file that is
    not a session, a field of the wrong type, or anything an import could not log (a lone
    surrogate, nesting past the log's limit) is refused with LegacyFormatError; OSError if the
    file cannot be read. ``raw``: the file's bytes, when the caller read them (an import does,
    within its limit).
    """
    file = Path(path)
    where = printable(str(file))
    raw = file.read_bytes() if raw is None else raw
    try:
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise LegacyFormatError(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise LegacyFormatError(
            f"{where}: not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
        ) from None
    except RecursionError:
        raise LegacyFormatError(f"{where}: {_TOO_DEEP}") from None
    folder_type, folder_date = _from_folders(file, None if root is None else Path(root))
    return from_dict(
        data,
        path=file,
        context_type=folder_type,
        session_date=folder_date,
        fallback_time=lambda: _mtime_ts(file),
    )


def failure(path: Path, exc: BaseException) -> str:
    """Why ``path`` could not be read (:func:`load`'s error), in one line without the path."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return (str(exc) or type(exc).__name__).removeprefix(f"{printable(str(path))}: ")


def _from_folders(file: Path, root: Path | None) -> tuple[str | None, str | None]:
    """The context type and date that a file's folders name, if they name them."""
    if root is not None:
        try:
            parts = file.absolute().relative_to(root.absolute()).parts
        except ValueError:
            parts = ()
        if len(parts) == 2:
            return parts[0], None
        if len(parts) == 3 and DATE_RE.fullmatch(parts[1]):
            return parts[0], parts[1]
        if len(parts) == 1:
            return None, None
    parent = file.absolute().parent
    if DATE_RE.fullmatch(parent.name):
        return parent.parent.name, parent.name
    return parent.name, None


def from_dict(
    data: Any,
    *,
    path: Path | None = None,
    context_type: str | None = None,
    session_date: str | None = None,
    fallback_time: Callable[[], str] | None = None,
) -> LegacySession:
    """Check and complete a decoded legacy session (see :func:`load`; LegacyFormatError).

    ``context_type`` and ``session_date`` are the folders', used when the file has none;
    ``fallback_time()`` is the ``created_at`` of a file with no time (default: now).
    """
    check = _Checker(printable(str(path)) if path is not None else "<legacy session>")
    raw_messages, meta_raw = _session_parts(data, check)
    session_id, ctype, meta_names = _names(data, meta_raw, check, path, context_type)
    prompt = check.given(data, "system_prompt", check.string)
    parsed = _parse_messages(raw_messages, check)
    created = _created_at(meta_raw, parsed, check, fallback_time)
    messages: list[LegacyMessage] = []
    previous = created
    for index, (role, content, stamp, extra) in enumerate(parsed):
        if stamp is None:  # a message without a time takes the one before it
            check.derived.add(f"messages[{index}].timestamp")
            stamp = previous
        messages.append(LegacyMessage(role, content, stamp, extra))
        previous = stamp
    return LegacySession(
        session_id=session_id,
        context_type=ctype,
        system_prompt=prompt or "",
        messages=tuple(messages),
        metadata=_metadata(meta_raw, messages, created, check, meta_names, session_date),
        extra={k: v for k, v in data.items() if k not in _KEYS[LegacySession]},
        path=path,
        derived=frozenset(check.derived),
    )


_Parsed = tuple[str, str, str | None, dict[str, Any]]
"""A checked message: role, content, timestamp as written (None: none), unknown keys."""


def _session_parts(data: Any, check: _Checker) -> tuple[list[Any], dict[str, Any]]:
    """The ``messages`` list and the ``metadata`` object of a decoded session, checked."""
    if not isinstance(data, dict):
        raise check.fail(f"not a session: the top level is {_json_type(data)}, not an object")
    _check_loggable(data, check)
    raw_messages = data.get("messages")
    if not isinstance(raw_messages, list):
        if "messages" not in data:
            raise check.fail("not a session: it has no 'messages' list")
        raise check.fail(f"'messages' must be a list, not {_json_type(raw_messages)}")
    meta_raw = data.get("metadata")
    if meta_raw is None:
        meta_raw = {}
    elif not isinstance(meta_raw, dict):
        raise check.fail(f"'metadata' must be an object, not {_json_type(meta_raw)}")
    return raw_messages, meta_raw


def _names(
    data: Mapping[str, Any],
    meta_raw: Mapping[str, Any],
    check: _Checker,
    path: Path | None,
    folder_type: str | None,
) -> tuple[str, str, tuple[str, str]]:
    """The context name and type, and the metadata's copies of them, derived where missing."""
    session_id = check.given(data, "session_id", check.name)
    meta_session_id = check.given(meta_raw, "metadata.session_id", check.name)
    if session_id is None:
        session_id = meta_session_id or (path.stem if path is not None else None)
        if not session_id:
            raise check.fail("not a session: it names no session_id")
    ctype = check.given(data, "context_type", check.name)
    meta_type = check.given(meta_raw, "metadata.context_type", check.name)
    if ctype is None:
        ctype = meta_type or folder_type
        if not ctype:
            raise check.fail("it names no context_type and no type folder holds it")
        if not TYPE_RE.fullmatch(ctype):
            raise check.fail(
                f"it names no context_type and its folder {short_repr(ctype)} is no type"
            )
    return session_id, ctype, (meta_session_id or session_id, meta_type or ctype)


def _parse_messages(raw_messages: list[Any], check: _Checker) -> list[_Parsed]:
    """Check each message; timestamps stay as written (None where missing)."""
    parsed: list[_Parsed] = []
    for index, message in enumerate(raw_messages):
        what = f"message {index}"
        if not isinstance(message, dict):
            raise check.fail(f"{what} must be an object, not {_json_type(message)}")
        role = check.string(message.get("role"), f"{what} 'role'")
        if role not in MESSAGE_ROLES:
            raise check.fail(f"{what} has role {short_repr(role)}: expected user or assistant")
        content = check.string(message.get("content"), f"{what} 'content'")
        stamp = message.get("timestamp")
        if stamp is not None:
            stamp = check.timestamp(stamp, f"{what} 'timestamp'")
        extra = {k: v for k, v in message.items() if k not in _KEYS[LegacyMessage]}
        parsed.append((role, content, stamp, extra))
    return parsed


def _created_at(
    meta_raw: Mapping[str, Any],
    parsed: list[_Parsed],
    check: _Checker,
    fallback_time: Callable[[], str] | None,
) -> str:
    """``metadata.created_at``, else the first message's time, else the fallback, else now."""
    created = check.given(meta_raw, "metadata.created_at", check.timestamp)
    if created is not None:
        return created
    first = next((stamp for _, _, stamp, _ in parsed if stamp is not None), None)
    if first is not None:
        return first
    return fallback_time() if fallback_time is not None else _seed_ts(dt.datetime.now(dt.UTC))


def _metadata(
    meta_raw: Mapping[str, Any],
    messages: list[LegacyMessage],
    created: str,
    check: _Checker,
    names: tuple[str, str],
    folder_date: str | None,
) -> LegacyMetadata:
    """The metadata object, each missing field derived (see :func:`load`)."""
    last_active = check.given(meta_raw, "metadata.last_active", check.timestamp)
    count = check.given(meta_raw, "metadata.message_count", check.count)
    date = check.given(meta_raw, "metadata.session_date", check.date)
    return LegacyMetadata(
        created_at=created,
        last_active=last_active or (messages[-1].timestamp if messages else created),
        message_count=len(messages) if count is None else count,
        session_id=names[0],
        context_type=names[1],
        session_date=date or folder_date or dt.datetime.fromisoformat(created).date().isoformat(),
        extra={k: v for k, v in meta_raw.items() if k not in _KEYS[LegacyMetadata]},
    )


_MAX_DEPTH = codec.MAX_DEPTH - 2
"""How deep a legacy file may nest: an import keeps its unknown keys two levels deeper, in
the root header's legacy record, and the log's limit must still hold."""
_TOO_DEEP = f"arrays and objects nest more than {_MAX_DEPTH} levels deep"


def _check_loggable(data: dict[str, Any], check: _Checker) -> None:
    """Refuse, naming the file, what an import could not log: lone surrogates, deep nesting."""
    try:
        codec.encode(data)
    except InvalidEntry as exc:
        raise check.fail(str(exc)) from None
    if codec.deeper_than(data, _MAX_DEPTH):
        raise check.fail(_TOO_DEEP)


_JSON_TYPES: tuple[tuple[Any, str], ...] = (
    (type(None), "null"),
    (bool, "a boolean"),
    (int | float, "a number"),
    (str, "a string"),
    (list, "a list"),
)


def _json_type(value: Any) -> str:
    return next((name for kind, name in _JSON_TYPES if isinstance(value, kind)), "an object")


def _with_extra(known: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``known``, then the keys of ``extra`` it lacks: unknown keys follow the known."""
    return {**known, **{key: value for key, value in extra.items() if key not in known}}


def _as_json(value: Any) -> Any:
    """A record (and the records in it) as the seed's JSON: its known keys, then its unknown."""
    if isinstance(value, tuple):
        return [_as_json(v) for v in value]
    keys = _KEYS.get(type(value))
    if keys is None:
        return value
    return _with_extra({key: _as_json(getattr(value, key)) for key in keys}, value.extra)


def dump(session: LegacySession) -> dict[str, Any]:
    """The session as the seed's JSON object, field for field; unknown keys follow the known."""
    return cast(dict[str, Any], _as_json(session))


def dumps(data: LegacySession | Mapping[str, Any]) -> str:
    """The file's text: a session (or a dict from :func:`dump`) as the old tool wrote it."""
    obj = dump(data) if isinstance(data, LegacySession) else data
    return json.dumps(obj, indent=2, ensure_ascii=False)


def write(path: str | os.PathLike[str], session: LegacySession) -> None:
    """Write the session to ``path`` atomically (temporary file, ``fsync``, ``os.replace``)."""
    write_atomic(Path(path), dumps(session).encode(), sync=True)


def import_session(
    store: Store, session: LegacySession, *, context: ContextId | str | None = None
) -> PodMetadata:
    """Create a native context holding ``session``.

    The root header's ``ts`` is the session's ``created_at``; what the log has no place for
    (timestamps, metadata, unknown keys) is kept under :data:`LEGACY_HEADER_KEY`, so
    :func:`export_context` gives the file back. ``context`` defaults to the file's own; another
    must be fit for a new context (:meth:`ContextId.check_new`). ContextExists if the context
    exists already; InvalidContextId if the session's name cannot be a context name.
    """
    ctx = ContextId.parse(context) if context is not None else session.context
    if (ctx.type, ctx.name) != (session.context_type, session.session_id):
        ctx.check_new()  # a name of the caller's, not the file's own
    record: dict[str, Any] = {
        "session_id": session.session_id,
        "context_type": session.context_type,
        "item_ts": [m.timestamp for m in session.messages],
        "metadata": _as_json(session.metadata),
    }
    if any(m.extra for m in session.messages):
        record["item_extra"] = [dict(m.extra) for m in session.messages]
    if session.extra:
        record["extra"] = dict(session.extra)
    start = SegmentStartState(
        system_prompt=session.system_prompt,
        history=[{"role": m.role, "content": m.content} for m in session.messages],
    )
    source = str(session.path.absolute()) if session.path is not None else None
    origin = SegmentOrigin("import", source=source)
    return sessions.create_segment_with_ids(
        store,
        new_session_id(),
        new_segment_id(),
        start,
        context=ctx,
        origin=origin,
        ts=to_log_ts(session.metadata.created_at),
        header_extra={LEGACY_HEADER_KEY: record},
    )


def _legacy_record(header: Mapping[str, Any]) -> dict[str, Any] | None:
    origin = header.get("origin") or {}
    record = header.get(LEGACY_HEADER_KEY)
    if origin.get("kind") != "import" or not isinstance(record, dict):
        return None
    return record


def _item_ts(record: Mapping[str, Any] | None, count: int) -> list[str] | None:
    stamps = record.get("item_ts") if record is not None else None
    if isinstance(stamps, list) and len(stamps) == count:
        return stamps if all(isinstance(s, str) for s in stamps) else None
    return None


def _native_message(item: LoggedItem, ts: str) -> dict[str, Any] | None:
    """A user or assistant message with text as a legacy message, else None."""
    view = chat_view(item)
    role = view.get("role") if view is not None else None
    if view is None or role not in ("user", "assistant"):
        return None
    text = item_text(item)
    if view.get("content") is None or (view.get("tool_calls") and not text):
        return None
    out: dict[str, Any] = {"role": role, "content": text, "timestamp": to_legacy_ts(ts)}
    if isinstance(view.get("name"), str):
        out["name"] = view["name"]
    return out


def export_dict(
    store: Store, context: ContextId | str, *, pending: Sequence[LogEntry] = ()
) -> dict[str, Any]:
    """Any native context as a legacy session dict, field for field (see :func:`dump`).

    Imported messages keep role, text, timestamp and unknown keys as the file had them. Native
    user and assistant messages are written with their text and time (naive UTC); runtime events,
    tool results and tool-only messages are left out (the old tool would send them as chat). The
    metadata is the file's, with ``last_active`` and ``message_count`` following the log once
    anything was logged; for a native context it all comes from the log. ``pending`` are unsaved
    entries, taken as following the head: the file a PersistentSession would save.
    ContextNotFound if there is no such context.
    """
    ctx = ContextId.parse(context)
    head = sessions.require_head(store, ctx)
    reads = sessions.lineage(store, head.session_id, head.segment_id)
    if pending:
        last = reads[-1]
        entries = [*last.entries, *(entry.to_dict() for entry in pending)]
        reads[-1] = SegmentRead(last.header, entries, last.next_seq, last.torn)
    lines = sessions.lines_of(reads)
    state = sessions.collect_state(lines)
    root_id, root_header = _session_root(store, head.session_id, lines[0])
    record = _legacy_record(root_header)
    messages = _export_messages(reads, record)
    logged = head.segment_id != root_id or state.next_seq != 1  # since an import, if any
    metadata = _export_metadata(ctx, head, state, record, len(messages), logged=logged)
    extra_top: Mapping[str, Any] = (record.get("extra") or {}) if record is not None else {}
    known = {
        "session_id": ctx.name,
        "context_type": ctx.type,
        "system_prompt": state.system_prompt or "",
        "messages": messages,
        "metadata": metadata,
    }
    return _with_extra(known, extra_top)


def _export_metadata(
    ctx: ContextId,
    head: PodMetadata,
    state: RestoredState,
    record: Mapping[str, Any] | None,
    count: int,
    *,
    logged: bool,
) -> dict[str, Any]:
    """:func:`export_dict`'s ``metadata``: an imported file's, updated once ``logged`` to."""
    if record is None:
        return {
            "created_at": to_legacy_ts(head.created_at),
            "last_active": to_legacy_ts(state.last_active),
            "message_count": count,
            "session_id": ctx.name,
            "context_type": ctx.type,
            "session_date": head.date,
        }
    metadata = dict(record.get("metadata") or {})
    if (record.get("session_id"), record.get("context_type")) != (ctx.name, ctx.type):
        metadata.update(session_id=ctx.name, context_type=ctx.type)  # imported as another
    if logged:
        metadata["last_active"] = to_legacy_ts(state.last_active)
        metadata["message_count"] = count
    return metadata


def _session_root(
    store: Store, session_id: SessionId, first_header: Mapping[str, Any]
) -> tuple[SegmentId, Mapping[str, Any]]:
    """The id and header of the session's first segment (``first_header`` is the lineage's)."""
    first = SegmentId(str(first_header["segment_id"]))
    root_id = next(iter(store.list_segments(session_id)), first)
    if root_id != first:
        return root_id, store.read_segment(session_id, root_id, stop_seq=0).header
    return root_id, first_header


def _export_messages(
    reads: Sequence[SegmentRead], record: Mapping[str, Any] | None
) -> list[dict[str, Any]]:
    """The legacy messages: imported ones as the file had them, native ones converted."""
    item_extra = record.get("item_extra") if record is not None else None
    # The history starts at the last header that holds one; an import header's items keep the
    # file's timestamps.
    start = next((r.header for r in reversed(reads) if r.header.get("history") is not None), {})
    stamps = _item_ts(_legacy_record(start), len(start.get("history") or ()))
    messages: list[dict[str, Any]] = []
    for found in sessions.messages(reads):
        if found.index is None or stamps is None:
            message = _native_message(found.item, found.ts)
            if message is not None:
                messages.append(message)
            continue
        extra: Mapping[str, Any] = {}
        if isinstance(item_extra, list) and found.index < len(item_extra):
            extra = item_extra[found.index] or {}
        item = found.item
        kept = LegacyMessage(item["role"], item_text(item), stamps[found.index], extra)
        messages.append(_as_json(kept))
    return messages


def export_context(store: Store, context: ContextId | str) -> str:
    """Any native context as the text of a legacy session file (ContextNotFound if none)."""
    return dumps(export_dict(store, context))
