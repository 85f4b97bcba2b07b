"""Schema migrations shared by the database backends (SQLite and PostgreSQL).

A backend keeps one :class:`Migrations` registry and registers each schema change with it as a
decorator (``@MIGRATIONS`` over ``def m001_initial(conn): ...``). The rules:

* Names are ``mNNN_what_it_does``, numbered up in registration order; a name twice is refused.
* Each migration runs in one transaction with the insert of its ``migrations`` row.
* Every backend migrates on open, and refuses a database recording a migration it does not
  know (:class:`~terrarium.errors.FormatVersionError`): a newer terrarium wrote it.
* Never edit a released migration: add a new one.
* The steps before the first release were squashed into ``m001_initial``: a database recording
  exactly :data:`PRE_SQUASH` is at ``m001_initial`` (:meth:`Migrations.squashed`).

Only the bookkeeping is here: transactions and concurrent openers are each backend's business.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection
from typing import Generic, TypeVar

import msgspec

from terrarium.errors import FormatVersionError

C = TypeVar("C")

_NAME_RE = re.compile(r"m(\d{3,})_[a-z0-9_]+")

PRE_SQUASH = (
    "m001_initial",
    "m002_traces",
    "m003_search",
    "m004_derived_state",
    "m005_detached_sessions",
    "m006_transcript_view",
    "m007_lifecycle",
    "m008_blobs",
    "m009_notify",
    "m010_listing_sorts",
    "m011_search_rows_without_text",
    "m012_notify_only_when_listened",
    "m013_segment_keys",
    "m014_staged_search_items",
    "m015_session_states",
)
"""The steps both backends registered before the squash, whose schema ``m001_initial`` builds."""

# The part types whose ``text`` is text, and those only the Responses API uses (a list holding
# one joins its texts with line breaks), as ``terrarium.model`` counts them, for the backends'
# ``transcript`` views: copied, not imported, since a released step must not change when the
# model does.
TEXT_PARTS_SQL = "('text', 'input_text', 'output_text', 'summary_text', 'reasoning_text')"
RESPONSES_PARTS_SQL = (
    "('input_text', 'output_text', 'refusal', 'input_image', 'summary_text', 'reasoning_text')"
)


class Migration(msgspec.Struct, Generic[C], frozen=True):
    """One named schema change."""

    name: str
    """``mNNN_what_it_does``: the key recorded in the ``migrations`` table."""
    apply: Callable[[C], None]
    """Applies the change on a connection that is already inside a transaction."""


class Migrations(Generic[C]):
    """An ordered registry of a backend's migrations (see the module docstring)."""

    def __init__(self, backend: str, *, squashed: Collection[str] = ()) -> None:
        self.backend = backend
        self._squashed = frozenset(squashed)
        """Names that, recorded all together and alone, mean the first step (the squash)."""
        self._steps: list[Migration[C]] = []
        self._last_number = 0

    def __call__(self, fn: Callable[[C], None]) -> Callable[[C], None]:
        """Register ``fn`` as the next migration; refuse a duplicate or out-of-order name."""
        name = fn.__name__
        match = _NAME_RE.fullmatch(name)
        if match is None:
            raise ValueError(f"migration {name!r} must be named mNNN_what_it_does")
        if name in self.names:
            raise ValueError(f"migration {name!r} is already registered for {self.backend}")
        number = int(match.group(1))
        if self._steps and number <= self._last_number:
            raise ValueError(
                f"migration {name!r} must be numbered after {self._steps[-1].name!r}, "
                "the latest one"
            )
        self._steps.append(Migration(name, fn))
        self._last_number = number
        return fn

    @property
    def names(self) -> list[str]:
        """Every registered name, in order."""
        return [step.name for step in self._steps]

    def squashed(self, applied: Collection[str]) -> list[str]:
        """The records to forget if ``applied`` is exactly the squashed list (all of it, and
        nothing else): all but the first step's name, which stays; else ``[]``."""
        if not self._squashed or set(applied) != self._squashed or not self._steps:
            return []
        return sorted(name for name in applied if name != self._steps[0].name)

    def pending(self, applied: Collection[str], *, where: str) -> list[Migration[C]]:
        """The migrations not in ``applied``, in order (the squashed list counts as the first);
        FormatVersionError, naming database ``where``, if ``applied`` holds an unknown one."""
        if self.squashed(applied):
            applied = [self._steps[0].name]
        known = set(self.names)
        unknown = sorted(name for name in applied if name not in known)
        if unknown:
            raise FormatVersionError(
                f"database {where} was written by a newer terrarium (it has migration "
                f"{', '.join(unknown)}, unknown to this version): upgrade terrarium to open it"
            )
        return [step for step in self._steps if step.name not in applied]
