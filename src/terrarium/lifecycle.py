"""Archive, trash and retention above the stores: what to move, why, and a log of every removal.

:mod:`terrarium.states` moves contexts; this module decides which, for every backend alike:
plans (by age, type or name; an age skips pinned contexts), the retention policy
(:func:`load_policy`), and the store's :class:`MaintenanceLog` of every removal. Usage::

    plan = lifecycle.plan_archive(store, older_than=lifecycle.parse_age("30d"))
    lifecycle.run_archive(store, plan, why="command: terrarium archive")
    Maintenance(store).run()  # the policy, if one is configured
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import threading
import tomllib
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec

from terrarium import contexts, legacy, states
from terrarium.errors import (
    ContextNotFound,
    CorruptLog,
    InvalidRetention,
    NotInTrash,
    SegmentNotFound,
    StoreError,
)
from terrarium.model import ContextId, parse_timestamp, utc_now
from terrarium.states import ArchivedContext, TrashedContext
from terrarium.stores._files import make_dirs, open_private, read_chunks, write_to
from terrarium.stores.base import Lifecycle, Store, context_lock

log = logging.getLogger(__name__)

#: The policy file in a store's root.
POLICY_FILE = "terrarium.toml"
#: The maintenance log beside a filesystem store (a SQLite file has ``{db}.maintenance.log``).
LOG_NAME = "maintenance.log"
#: A background maintenance runs the policy at most once per this interval.
DAILY = timedelta(days=1)

Progress = Callable[[str], None]
"""Called with each context id (or trash id) once it has been handled."""

_AGE = re.compile(r"\s*(\d+)\s*([hdw])\s*", re.I)
_UNITS = {"h": timedelta(hours=1), "d": timedelta(days=1), "w": timedelta(weeks=1)}


def parse_age(text: str | int) -> timedelta:
    """``30d``, ``12h``, ``2w`` (or a number of days) as a timedelta; else InvalidRetention."""
    if isinstance(text, int) and not isinstance(text, bool):
        amount, unit = text, "d"
    else:
        match = _AGE.fullmatch(str(text))
        if match is None:
            raise InvalidRetention(
                f"bad age {text!r}: use a number and a unit, h, d or w (30d, 12h, 2w)"
            )
        amount, unit = int(match.group(1)), match.group(2).lower()
    if amount <= 0:
        raise InvalidRetention(f"bad age {text!r}: it must be more than zero")
    try:
        return amount * _UNITS[unit]
    except OverflowError:
        raise InvalidRetention(f"bad age {text!r}: longer than {timedelta.max.days} days") from None


def _parse_time(ts: str) -> datetime | None:
    try:
        return parse_timestamp(ts)
    except (TypeError, ValueError):
        return None


def _now() -> datetime:
    return datetime.now(UTC)


def require_lifecycle(store: Store, where: str | None = None) -> Lifecycle:
    """``store`` as a :class:`Lifecycle`; StoreError in one line if its backend cannot archive."""
    if isinstance(store, Lifecycle):
        return store
    shown = where or repr(store)
    raise StoreError(f"{shown}: this backend cannot archive, trash or pin sessions")


def hot_bytes(store: Store, context: ContextId) -> int | None:
    """The context's log size as JSON lines (estimated); None if it is gone or moved meanwhile."""
    head = store.get_head(context)
    try:
        return states.log_bytes(store, head) if head is not None else None
    except (SegmentNotFound, ContextNotFound):
        return None


class Candidate(msgspec.Struct, frozen=True):
    """A hot context a plan would archive."""

    context: str
    """The context id, ``type:name``."""
    date: str
    """Its creation date, ``YYYY-MM-DD``."""
    last_active: str
    message_count: int
    hot_bytes: int
    """Its log's size in the hot store (estimated: JSON lines)."""
    pinned: bool
    """Pinned: only a context named explicitly is archived so."""


@dataclass(frozen=True, slots=True)
class ArchivePlan:
    """What an archive would move."""

    candidates: list[Candidate]
    """The contexts to archive, in listing order."""
    skipped_pinned: list[str] = field(default_factory=list)
    """Contexts the age selected but their pin kept."""
    named: frozenset[str] = frozenset()
    """The contexts named explicitly: archived even if pinned meanwhile."""
    damaged: list[tuple[str, str]] = field(default_factory=list)
    """Contexts left hot because their log is damaged, each with its problem (file and line)."""

    @property
    def hot_bytes(self) -> int:
        """Bytes the hot store would give up (estimated)."""
        return sum(c.hot_bytes for c in self.candidates)


def plan_archive(
    store: Store,
    *,
    older_than: timedelta | None = None,
    type: str | None = None,
    names: Sequence[ContextId] = (),
    now: datetime | None = None,
    rules: Callable[[str], timedelta | None] | None = None,
) -> ArchivePlan:
    """The hot contexts to archive: inactive longer than ``older_than``, of ``type``, named.

    Named contexts are taken even when pinned. ``rules`` (a policy's) gives each type its own
    age (None: never archived). ContextNotFound if a named context is neither hot, archived nor
    a legacy file; InvalidRetention for no names, no age and no rules (that would take all).
    """
    lifecycle = require_lifecycle(store)
    if not names and older_than is None and rules is None:
        raise InvalidRetention("name the sessions to archive, or give an age (--older-than 30d)")
    moment = now or _now()
    pins = states.pinned_contexts(lifecycle)
    wanted = {str(n) for n in names}
    for name in names:
        if store.get_head(name) is None and legacy.find(store, name) is None:
            raise contexts.not_found(name)
    rows = contexts.list_contexts(store, type=type).rows
    plan = ArchivePlan([], named=frozenset(wanted))
    for row in rows:
        if wanted and row.context not in wanted:
            continue
        if not _due(row.type, row.last_active or row.created_at, older_than, rules, moment):
            continue
        pinned = row.context in pins
        if pinned and row.context not in wanted:
            plan.skipped_pinned.append(row.context)
            continue
        try:
            size = _legacy_bytes(row.legacy_path) if row.legacy_path else hot_bytes(store, row.id)
        except CorruptLog as exc:  # stops none of the others
            plan.damaged.append((row.context, str(exc)))
            continue
        if size is None:
            continue  # archived or deleted meanwhile
        listed = (row.date, row.last_active, row.message_count)
        plan.candidates.append(Candidate(row.context, *listed, size, pinned))
    return plan


def _legacy_bytes(path: str) -> int | None:
    """The size of a legacy file (archiving imports it first), or None if it is gone."""
    with contextlib.suppress(FileNotFoundError):
        return os.stat(path).st_size
    return None


def _due(
    type: str,
    ts: str,
    older_than: timedelta | None,
    rules: Callable[[str], timedelta | None] | None,
    now: datetime,
) -> bool:
    """Whether an age selection takes an item of ``type`` last touched at ``ts``."""
    age = rules(type) if rules is not None else older_than
    if age is None:
        return rules is None  # no age given takes all; a rule of "never" none
    moment = _parse_time(ts)
    return moment is not None and now - moment > age


def run_archive(
    store: Store,
    plan: ArchivePlan,
    *,
    why: str,
    journal: MaintenanceLog | None = None,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[ArchivedContext]:
    """Archive and log each context of ``plan`` (skipping any moved meanwhile); their figures.

    ``stop`` is asked between contexts (a closing manager).
    """
    lifecycle = require_lifecycle(store)
    journal = journal or MaintenanceLog.of(store)
    done: list[ArchivedContext] = []
    for candidate in plan.candidates:
        if stop is not None and stop():
            break
        context = ContextId.parse(candidate.context)
        spare = candidate.context not in plan.named  # a pin meanwhile keeps it hot
        try:
            archived = archive_context(lifecycle, context, spare_pinned=spare)
        except CorruptLog as exc:  # damaged since the plan read it: the others go on
            archived = None
            plan.damaged.append((candidate.context, str(exc)))
        if archived is not None:
            done.append(archived)
            sizes: dict[str, Any] = {
                "hot_bytes": archived.hot_bytes,
                "archived_bytes": archived.archived_bytes,
            }
            journal.record("archive", why, context=archived.context, **sizes)
        if progress is not None:
            progress(candidate.context)
    return done


def find_trashed(store: Store, target: str) -> TrashedContext:
    """The trash entry ``target`` names (a trash id, or a context's latest); else NotInTrash."""
    # A trash id has no colon, so never names a context; entries are newest first.
    return plan_trash_purge(store, targets=[target])[0]


def plan_trash_purge(
    store: Store,
    *,
    older_than: timedelta | None = None,
    targets: Sequence[str] = (),
    now: datetime | None = None,
    rules: Callable[[str], timedelta | None] | None = None,
) -> list[TrashedContext]:
    """Trash entries to purge: those named, else those older than ``older_than`` or ``rules``.

    A selection that names nothing skips pinned entries. Raises NotInTrash for a bad name.
    """
    entries = states.trashed_contexts(require_lifecycle(store))
    moment = now or _now()
    if targets:
        chosen: set[str] = set()
        for target in targets:
            matched = {e.trash_id for e in entries if target in (e.trash_id, e.context)}
            if not matched:
                raise NotInTrash(f"nothing in the trash has the id {target!r}")
            chosen |= matched
        return [
            e
            for e in entries
            if e.trash_id in chosen and _due("", e.deleted_at, older_than, None, moment)
        ]
    return [
        e
        for e in entries
        if not e.pinned
        and _due(e.context.partition(":")[0], e.deleted_at, older_than, rules, moment)
    ]


def run_trash_purge(
    store: Store,
    entries: Sequence[TrashedContext],
    *,
    why: str,
    journal: MaintenanceLog | None = None,
    progress: Progress | None = None,
    stop: Callable[[], bool] | None = None,
) -> list[TrashedContext]:
    """Purge each trash entry for ever; log each with ``why``. Returns those purged."""
    lifecycle = require_lifecycle(store)
    journal = journal or MaintenanceLog.of(store)
    done = []
    for entry in entries:
        if stop is not None and stop():
            break
        if states.purge_trashed(lifecycle, entry.trash_id):
            done.append(entry)
            ids = {"context": entry.context, "trash_id": entry.trash_id}
            journal.record("purge_trash", why, **ids, bytes=entry.bytes)
        if progress is not None:
            progress(entry.trash_id)
    if done:
        collect_blobs(store, why=why, journal=journal)
    return done


def collect_blobs(store: Store, *, why: str, journal: MaintenanceLog | None = None) -> int:
    """Delete the blobs nothing refers to any more (after a purge) and log how many."""
    from terrarium.blobs import collect_garbage

    collected = collect_garbage(store)
    if collected:
        (journal or MaintenanceLog.of(store)).record("collect_blobs", why, blobs=collected)
    return collected


def archive_context(
    store: Store, context: ContextId, *, spare_pinned: bool = False
) -> ArchivedContext | None:
    """:func:`states.archive_context` under the context's lock, after importing a context only
    a legacy file holds (a migration moves such files under that lock). None: nothing hot."""
    with context_lock(store, context):
        legacy.import_legacy(store, context)
        return states.archive_context(require_lifecycle(store), context, spare_pinned=spare_pinned)


def delete_context(store: Store, context: ContextId, *, why: str = "delete_context") -> bool:
    """Move the context to the trash, logged with ``why``; False if it did not exist.

    It leaves listings at once (``terrarium trash restore`` brings it back); its legacy JSON file
    moves into ``.trash/legacy/``. StoreError if the store has no trash.
    """
    return _trash(store, context, why)[0]


def delete_to_trash(store: Store, context: ContextId, *, why: str) -> TrashedContext | None:
    """Move ``context`` to the trash; its trash entry (None for a legacy file; ContextNotFound)."""
    done, entry = _trash(store, context, why)
    if not done:
        raise contexts.not_found(context)
    return entry


def _trash(store: Store, context: ContextId, why: str) -> tuple[bool, TrashedContext | None]:
    """:func:`delete_context`, and the trash entry."""
    lifecycle = require_lifecycle(store)
    with context_lock(store, context):  # the legacy files first: the log hides them till then
        moved = legacy.trash(store, context)
        deleted = states.delete_context(lifecycle, context)
    if not (deleted or moved):
        return False, None
    entry = next((e for e in states.trashed_contexts(lifecycle) if e.context == str(context)), None)
    trash_id = entry.trash_id if entry is not None else None
    details: dict[str, Any] = {"context": str(context), "trash_id": trash_id}
    if moved:
        details["legacy_files"] = [str(path) for path in moved]
    MaintenanceLog.of(store).record("trash", why, **details)
    return True, entry


def purge(store: Store, context: ContextId, *, why: str) -> None:
    """Delete a hot or archived context for ever, bypassing the trash, and log it; its legacy
    JSON file moves into ``.trash/legacy/`` (as a delete's: a file is never unlinked).

    ContextNotFound if there is none; StoreError if the store has no state primitives.
    """
    lifecycle = require_lifecycle(store)
    with context_lock(store, context):
        moved = legacy.trash(store, context)
        if not (states.purge_context(lifecycle, context) or moved):
            raise contexts.not_found(context)
    journal = MaintenanceLog.of(store)
    details: dict[str, Any] = {"context": str(context)}
    if moved:
        details["legacy_files"] = [str(path) for path in moved]
    journal.record("purge", why, **details)
    collect_blobs(store, why=why, journal=journal)


def log_path(store: Store) -> Path | None:
    """Where ``store``'s maintenance log lives (None: in memory); docs/cli.md names each."""
    root = store_root(store)
    if root is not None:
        path = getattr(store, "path", None)
        return Path(f"{path}.maintenance.log") if path is not None else root / LOG_NAME
    schema = getattr(store, "schema", None)
    dsn = getattr(store, "_dsn", None)
    if isinstance(dsn, str):
        from psycopg.conninfo import conninfo_to_dict

        dbname = str(conninfo_to_dict(dsn).get("dbname") or "postgres")
        suffix = f"-{schema}" if schema and schema != "public" else ""
        state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
        return Path(state) / "terrarium" / f"maintenance-{_slug(dbname)}{_slug(suffix)}.log"
    return None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def store_root(store: Store) -> Path | None:
    """The folder a policy file lies in: a filesystem store's root, a SQLite file's folder."""
    root = getattr(store, "root", None)
    if isinstance(root, Path):
        return root
    path = getattr(store, "path", None)
    return path.parent if isinstance(path, Path) else None


class MaintenanceLog:
    """The JSON-lines log of every removal from one store, and the daily maintenance stamp.

    Each line is ``{"ts", "action", "why", ...}``; ``action`` is ``archive``, ``trash``,
    ``purge_trash``, ``purge`` or ``maintain`` (a policy run's end: the stamp).
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path  # None: the lines are kept in this object
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self._run = threading.Lock()

    @classmethod
    def of(cls, store: Store) -> MaintenanceLog:
        """The maintenance log of ``store`` (:func:`log_path`; in memory, one per store)."""
        path = log_path(store)
        if path is not None:
            return cls(path)
        with _MEMORY_LOCK:
            found = _MEMORY_LOGS.get(store)
            if found is None:
                found = _MEMORY_LOGS[store] = cls(None)
            return found

    def record(self, action: str, why: str, *, ts: str | None = None, **details: Any) -> None:
        """Append one line (at ``ts``, default now); a write failure is a warning only."""
        line = json.dumps({"ts": ts or utc_now(), "action": action, "why": why, **details})
        if self.path is None:
            with self._lock:
                self._lines.append(line)
            return
        try:
            make_dirs(self.path.parent)
            write_to(self.path, line.encode() + b"\n", os.O_APPEND)  # never through a link
        except OSError as exc:
            log.warning("cannot write the maintenance log %s: %s", self.path, exc)

    def records(self) -> list[dict[str, Any]]:
        """Every line, oldest first (unreadable lines left out)."""
        if self.path is None:
            with self._lock:
                lines = list(self._lines)
        else:
            try:
                data = b"".join(read_chunks(self.path))  # never through a link
            except FileNotFoundError:
                return []
            except OSError as exc:
                log.warning("cannot read the maintenance log %s: %s", self.path, exc)
                return []
            lines = data.decode("utf-8", errors="replace").splitlines()
        out = []
        for line in lines:
            with contextlib.suppress(ValueError):
                value = json.loads(line)
                if isinstance(value, dict):
                    out.append(value)
        return out

    def last_run(self) -> datetime | None:
        """When the last policy run ended (its ``maintain`` line), or None."""
        for record in reversed(self.records()):
            if record.get("action") == "maintain":
                return _parse_time(str(record.get("ts")))
        return None

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[bool]:
        """Hold the log for one policy run (``flock``): False if another thread or process does."""
        if not self._run.acquire(blocking=False):
            yield False
            return
        with contextlib.ExitStack() as stack:
            stack.callback(self._run.release)
            if self.path is None:
                yield True
                return
            make_dirs(self.path.parent)
            fd = open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW)
            stack.callback(os.close, fd)  # closing releases the lock
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True


_MEMORY_LOGS: weakref.WeakKeyDictionary[Store, MaintenanceLog] = weakref.WeakKeyDictionary()
_MEMORY_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class RetentionRule:
    """When to archive and when to purge from the trash (None: never)."""

    archive_after: timedelta | None = None
    """Archive hot contexts inactive for longer."""
    purge_trash_after: timedelta | None = None
    """Purge trash entries deleted longer ago."""


_RULE_KEYS = ("archive_after", "purge_trash_after")


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """A retention policy: a default rule and per-type overrides."""

    default: RetentionRule
    types: Mapping[str, RetentionRule] = field(default_factory=dict)
    """Rules of one type (``irc``); keys they leave out come from ``default``."""
    source: str = "policy"
    """Where it was read (a file path), for the log's ``why``."""

    def archive_after(self, type: str) -> timedelta | None:
        """The archive age of contexts of ``type``."""
        return self.types.get(type, self.default).archive_after

    def purge_trash_after(self, type: str) -> timedelta | None:
        """The trash purge age of contexts of ``type``."""
        return self.types.get(type, self.default).purge_trash_after

    @property
    def empty(self) -> bool:
        """True when it neither archives nor purges anything."""
        rules = [self.default, *self.types.values()]
        return all(r.archive_after is None and r.purge_trash_after is None for r in rules)


def config_path() -> Path:
    """The user's config file: ``$XDG_CONFIG_HOME/terrarium/config.toml`` (``~/.config``)."""
    home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(home) / "terrarium" / "config.toml"


def load_policy(store: Store) -> RetentionPolicy | None:
    """The retention policy: the store's ``terrarium.toml``, else the user's config, else None.

    InvalidRetention if the file is not TOML, or has an unknown key or a bad value.
    """
    root = store_root(store)
    if root is not None and ((own := root / POLICY_FILE).is_symlink() or own.is_file()):
        return read_policy(own, whole_file=True)
    user = config_path()
    return read_policy(user) if user.is_file() else None


def read_policy(path: Path, *, whole_file: bool = False) -> RetentionPolicy | None:
    """The ``[retention]`` table of ``path`` or None. ``whole_file`` (a store's own file): other
    keys are errors too, and a link is one (it could lead out of the store)."""
    try:
        raw = b"".join(read_chunks(path)) if whole_file else path.read_bytes()
        data = tomllib.loads(raw.decode("utf-8"))
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise InvalidRetention(f"{path}: a link, which terrarium does not follow") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise InvalidRetention(f"{path}: not valid TOML: {exc}") from None
    if whole_file:
        for key in data:
            if key != "retention":
                raise InvalidRetention(f"{path}: unknown key {key!r} (expected [retention])")
    table = data.get("retention")
    if table is None:
        return None
    if not isinstance(table, dict):
        raise InvalidRetention(f"{path}: retention must be a table")
    types = table.get("types", {})
    if not isinstance(types, dict):
        raise InvalidRetention(f"{path}: retention.types must be a table")
    default = _rule(path, "retention", {k: v for k, v in table.items() if k != "types"}, None)
    rules = {}
    for name, body in types.items():
        where = f"retention.types.{name}"
        if not isinstance(body, dict):
            raise InvalidRetention(f"{path}: {where} must be a table")
        rules[name] = _rule(path, where, body, default)
    return RetentionPolicy(default, rules, source=str(path))


def _rule(
    path: Path, where: str, table: Mapping[str, Any], base: RetentionRule | None
) -> RetentionRule:
    values: dict[str, timedelta | None] = {}
    for key, value in table.items():
        if key not in _RULE_KEYS:
            raise InvalidRetention(
                f"{path}: unknown key {where}.{key} (known: {', '.join(_RULE_KEYS)}, types)"
            )
        if value == "never":
            values[key] = None
            continue
        if not isinstance(value, int | str) or isinstance(value, bool):
            raise InvalidRetention(f"{path}: {where}.{key}: expected days or an age like '30d'")
        try:
            values[key] = parse_age(value)
        except InvalidRetention as exc:
            raise InvalidRetention(f"{path}: {where}.{key}: {exc}") from None
    if base is None:
        return RetentionRule(**values)
    return replace(base, **values)


@dataclass(frozen=True, slots=True)
class MaintenanceReport:
    """What one policy run did (or, dry, would do)."""

    dry_run: bool
    policy: str | None
    """The policy's file, or None when there is no policy (nothing was done)."""
    to_archive: ArchivePlan = field(default_factory=lambda: ArchivePlan([]))
    to_purge: list[TrashedContext] = field(default_factory=list)
    archived: list[ArchivedContext] = field(default_factory=list)
    purged: list[TrashedContext] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether anything moved (or, dry, would move)."""
        if self.dry_run:
            return bool(self.to_archive.candidates or self.to_purge)
        return bool(self.archived or self.purged)

    @property
    def bytes_saved(self) -> int:
        """Bytes freed: estimated before a run, the store's figures after."""
        if self.dry_run:
            return self.to_archive.hot_bytes + sum(e.bytes or 0 for e in self.to_purge)
        archived = sum(a.hot_bytes - a.archived_bytes for a in self.archived)
        return archived + sum(e.bytes or 0 for e in self.purged)


class Maintenance:
    """Applies a retention policy (default :func:`load_policy`) to a store, logging each removal."""

    def __init__(
        self,
        store: Store,
        *,
        policy: RetentionPolicy | None = None,
        journal: MaintenanceLog | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        self.store = store
        self.policy = policy
        self.journal = journal or MaintenanceLog.of(store)
        self._clock = clock

    def clock(self) -> datetime:
        """The current time (UTC), as the run sees it."""
        return self._clock() if self._clock is not None else _now()

    def run(
        self, *, dry_run: bool = False, stop: Callable[[], bool] | None = None
    ) -> MaintenanceReport:
        """Apply the policy now (``dry_run``: only say what it would do).

        StoreError if the store cannot archive; InvalidRetention if the policy file is malformed.
        """
        require_lifecycle(self.store)
        policy = self.policy or load_policy(self.store)
        if policy is None or policy.empty:
            return MaintenanceReport(dry_run, None if policy is None else policy.source)
        now = self.clock()
        plan = plan_archive(self.store, rules=policy.archive_after, now=now)
        trash = plan_trash_purge(self.store, rules=policy.purge_trash_after, now=now)
        if dry_run:
            return MaintenanceReport(True, policy.source, plan, trash)
        why = f"policy {policy.source}"
        archived = run_archive(self.store, plan, why=why, journal=self.journal, stop=stop)
        purged = run_trash_purge(self.store, trash, why=why, journal=self.journal, stop=stop)
        stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.journal.record("maintain", why, ts=stamp, archived=len(archived), purged=len(purged))
        return MaintenanceReport(False, policy.source, plan, trash, archived, purged)

    def run_if_due(
        self, interval: timedelta = DAILY, *, stop: Callable[[], bool] | None = None
    ) -> MaintenanceReport | None:
        """Run unless one ended within ``interval`` or runs elsewhere now (then None)."""
        with self.journal.exclusive() as held:
            if not held:
                return None
            last = self.journal.last_run()
            if last is not None and timedelta(0) <= self.clock() - last < interval:
                return None  # (a stamp in the future, a clock set back, does not count)
            return self.run(stop=stop)


class BackgroundMaintenance:
    """A daemon thread that runs a :class:`Maintenance` when due, checking every ``every``.

    Each archive holds one context's lock for its move only, so turns never wait long.
    """

    def __init__(self, maintenance: Maintenance, *, every: float = 3600.0) -> None:
        self.maintenance = maintenance
        self.every = every
        self.runs = 0
        """Policy runs that happened (not the checks that found none due)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="terrarium-maintenance", daemon=True
        )

    def start(self) -> None:
        """Start checking (the first check is at once)."""
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                if self.maintenance.run_if_due(stop=self._stop.is_set) is not None:
                    self.runs += 1
            except Exception as exc:  # a policy or store error must not kill the host
                log.warning("background maintenance failed: %s", exc)
            self._stop.wait(self.every)

    def stop(self) -> None:
        """Stop the thread and wait for it (at most one context's move)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def alive(self) -> bool:
        """Whether the thread still runs."""
        return self._thread.is_alive()
