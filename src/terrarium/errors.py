"""Every exception terrarium raises, in one shallow hierarchy.

::

    TerrariumError
    ├── InvalidContextId, InvalidEntry, InvalidQuery, InvalidRetention (also ValueError)
    ├── NothingToCompact, NothingToRetry
    ├── StoreError
    │   ├── ContextNotFound, SegmentNotFound, NotInTrash, BlobNotFound (also KeyError)
    │   ├── ContextExists, SessionAttached, SessionConflict, ConflictError
    │   ├── CorruptLog, CorruptBlob, FormatVersionError
    │   ├── IndexUnavailable, StoreUnavailable, StoreNotFound
    │   └── StoreURLError (also ValueError)
    └── LLMError
        └── ServerUnreachable, ModelNotFound, ContextTooLong, RateLimited, BadResponse

Messages are one line, name the thing that is wrong, and never contain a password. One that
asks for an optional extra says how to install it: :func:`install_hint`.
"""

from __future__ import annotations

DISTRIBUTION = "terrarium-sessions"
"""The package's name on the package index, as ``pip install`` takes it. The import name and
the command are ``terrarium``; the index's ``terrarium`` is an unrelated project."""


def install_hint(extra: str) -> str:
    """The command that installs an optional extra: ``pip install 'terrarium-sessions[web]'``."""
    return f"pip install '{DISTRIBUTION}[{extra}]'"


class TerrariumError(Exception):
    """Base class of every terrarium error."""


class InvalidContextId(TerrariumError, ValueError):
    """A context id is not of the form ``type:name`` or names an unsafe or overlong name."""


class InvalidEntry(TerrariumError, ValueError):
    """An entry or history item given to a write call is malformed; nothing was written."""


class InvalidQuery(TerrariumError, ValueError):
    """A search query has nothing to search for, or a filter that cannot be valid."""


class InvalidRetention(TerrariumError, ValueError):
    """An age (``30d``) or a retention policy file is malformed; the message names the key."""


class NothingToCompact(TerrariumError):
    """A compaction was not done: its summary would not make the context smaller."""


class NothingToRetry(TerrariumError):
    """A retry was asked for, but the context's last turn did not fail."""


class StoreError(TerrariumError):
    """A store could not complete an operation."""

    @classmethod
    def foreign(cls, where: str, tables: list[str]) -> StoreError:
        """``where`` is another program's SQLite database: it has ``tables``, none of ours."""
        names = ", ".join(repr(name) for name in tables)
        return cls(
            f"{where}: not a terrarium database (it holds another program's tables: {names}); "
            "name a new file for a new store"
        )


class _Missing(StoreError, KeyError):
    """A thing looked up by key is not in the store."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else "not found"


class ContextNotFound(_Missing):
    """No context with that id exists in the store."""

    @classmethod
    def of(cls, context: object) -> ContextNotFound:
        """No context ``context``."""
        return cls(f"context {context} does not exist")


class ContextExists(StoreError):
    """A context with that id already exists."""


class SessionAttached(StoreError):
    """The session already belongs to a context, so no other context can adopt it."""


class SessionConflict(StoreError):
    """The destination holds the session otherwise than the source; nothing of it was written."""


class SegmentNotFound(_Missing):
    """No segment with that id exists in the store."""

    @classmethod
    def of(cls, session_id: object, segment_id: object = None) -> SegmentNotFound:
        """No such segment in the session (without ``segment_id``: no such session)."""
        if segment_id is None:
            return cls(f"session {session_id} does not exist")
        return cls(f"segment {segment_id} of session {session_id} does not exist")


class NotInTrash(_Missing):
    """No trashed context with that trash id (or context id) is in the store's trash."""


class ConflictError(StoreError):
    """A writer's view is stale: the segment's tail or the context's head moved under it."""

    @classmethod
    def stale_seq(cls, segment_id: object, at: int, expected: int | None) -> ConflictError:
        """An append that expected the segment at seq ``expected`` found it at ``at``."""
        return cls(f"segment {segment_id} is at seq {at}, the writer expected {expected}")


class CorruptLog(StoreError):
    """A log line in the middle of a segment is not a valid entry (names file and line)."""

    HINT = (
        "run 'terrarium fsck' to check every session (on a sessions folder, "
        "'terrarium fsck --repair --salvage' keeps every readable entry of a damaged segment)"
    )
    """What every surface tells a user about a damaged log, after the message."""

    @classmethod
    def seq_out_of_order(cls, where: str, seq: object, expected: int) -> CorruptLog:
        """The line at ``where`` (``file:line``) holds ``seq`` where ``expected`` belongs."""
        return cls(f"{where}: seq {seq} out of order (expected {expected})")


class BlobNotFound(_Missing):
    """A log references a large output (a blob) that the store does not hold."""


class CorruptBlob(StoreError):
    """A stored blob's bytes do not match the sha256 digest that names them."""


class FormatVersionError(StoreError):
    """A log or database was written by a newer, incompatible terrarium."""


class IndexUnavailable(StoreError):
    """A derived index cannot be read or updated; the log is intact and answers instead."""


class StoreUnavailable(StoreError):
    """The store's server could not be reached, or the connection to it was lost mid-call."""


class StoreURLError(StoreError, ValueError):
    """A store URL is malformed or names an unknown scheme."""


class StoreNotFound(StoreError):
    """No store at the location given, and the caller asked not to create one."""


class LLMError(TerrariumError):
    """The model server call failed."""

    _permanent = False  # True: a retry of the same request meets the same failure

    @property
    def status(self) -> int | None:
        """The HTTP status the server answered, if any (from the ``openai`` ``__cause__``)."""
        code = getattr(self.__cause__, "status_code", None)
        return code if isinstance(code, int) else None

    @property
    def transient(self) -> bool:
        """Whether a retry may succeed: no answer, a cut stream, 408, 429 or 5xx."""
        status = self.status
        return not self._permanent and (status is None or status in (408, 429) or status >= 500)


class ServerUnreachable(LLMError):
    """The model server could not be reached (connection refused, DNS, timeout)."""


class ModelNotFound(LLMError):
    """The server does not serve the requested model, or serves none."""

    _permanent = True  # the same model stays missing


class ContextTooLong(LLMError):
    """The request exceeds the model's context window."""

    _permanent = True  # the same request stays too long


class RateLimited(LLMError):
    """The server refused the request for rate or capacity reasons, after retries."""


class BadResponse(LLMError):
    """The server answered with something that is not a valid completion."""
