"""Salvage: copy what can be read of a damaged segment into a new one, changing nothing else.

The damaged segment stays as it was; its unreadable lines are copied to
``{segment}.jsonl.corrupt-{n}``, every readable entry, renumbered, to a new segment whose header
says ``salvaged_from``, and its forks onto the new one. Each new file appears whole and fsynced,
so running a killed salvage again finishes it (:func:`salvaged_into` finds what it wrote).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from terrarium import codec
from terrarium.errors import CorruptLog, StoreError
from terrarium.model import SegmentId, new_segment_id, utc_now
from terrarium.stores._files import write_beside, write_new
from terrarium.stores.base import PodMetadata
from terrarium.stores.fs._heads import read_headers
from terrarium.stores.fs._layout import SEGMENT_SUFFIX, segment_ids
from terrarium.stores.fs._segments import read_file, read_header


class Salvage(msgspec.Struct, frozen=True):
    """What :meth:`FsStore.salvage_segment` did."""

    segment_id: SegmentId
    """The damaged segment (left as it was)."""
    new_segment_id: SegmentId
    """The segment holding every entry of it that could be read."""
    kept: int
    """Entries copied into the new segment."""
    set_aside: list[int]
    """Line numbers of the damaged segment whose bytes went to ``side_file``."""
    side_file: str | None
    """Where the bytes that could not be read were copied."""
    copies: dict[SegmentId, SegmentId]
    """Forks of the damaged segment (and theirs), each copied onto the new one: old -> new."""
    head: SegmentId | None
    """Where the head moved, if it was on the damaged segment or one of its forks."""


def readable_lines(
    data: bytes, where: str
) -> tuple[dict[str, Any] | None, list[dict[str, Any]], list[tuple[int, bytes]]]:
    """Split a segment's bytes into its header (None if unreadable), entries and bad lines.

    A bad line is not an entry, or its seq does not move past the last kept one; a torn tail
    is bad too. Blank lines are skipped, as restore skips them.

    Raises:
        FormatVersionError: a line is of a newer format: that is no damage, and no salvage.
    """
    complete, tail = codec.split_complete(data)
    header: dict[str, Any] | None = None
    entries: list[dict[str, Any]] = []
    bad: list[tuple[int, bytes]] = []
    last = 0
    lines = complete.split(b"\n")[:-1]
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            entry = codec.decode_lines(line + b"\n", where=where, first_line=number)[0]
        except CorruptLog:
            bad.append((number, line))
            continue
        if number == 1 and entry.get("kind") == "header" and entry["seq"] == 0:
            header = entry
        elif entry.get("kind") != "header" and entry["seq"] > last:
            entries.append(entry)
            last = entry["seq"]
        else:
            bad.append((number, line))
    if tail:
        bad.append((len(lines) + 1, tail))
    return header, entries, bad


def _root_header(head: PodMetadata) -> dict[str, Any]:
    """A root header for a salvage whose damaged segment lost its own (from the context's head)."""
    return {
        "v": 1,
        "seq": 0,
        "ts": utc_now(),
        "kind": "header",
        "session_id": str(head.session_id),
        "context": head.context,
        "origin": {"kind": "root"},
        "system_prompt": None,
        "config": {},
        "history": [],
    }


def salvaged_into(folder: Path) -> dict[SegmentId, SegmentId]:
    """The salvages ``folder`` holds already: damaged segment -> the segment salvaging it."""
    done: dict[SegmentId, SegmentId] = {}
    for segment_id, header in read_headers(folder).items():
        with contextlib.suppress(ValueError):
            if isinstance(source := header.get("salvaged_from"), str):
                done[uuid.UUID(source)] = segment_id
    return done


def set_aside_once(path: Path, lost: bytes) -> str:
    """Copy a damaged segment's bad lines to ``{segment}.jsonl.corrupt-{n}``, unless a salvage
    that failed before its new segment (a full disk) copied these very bytes already."""
    for side in sorted(path.parent.glob(f"{path.name}.corrupt-*")):
        with contextlib.suppress(OSError, StoreError):
            if read_file(side) == lost:
                return str(side)
    return str(write_beside(path, lost, lambda n: f"corrupt-{n}"))


def salvage_copy(
    folder: Path,
    old: SegmentId,
    header: dict[str, Any] | None,
    entries: list[dict[str, Any]],
    done: Mapping[SegmentId, SegmentId],
    head: PodMetadata,
) -> tuple[SegmentId, dict[int, int]]:
    """Write the salvage of ``old`` (or find the one an interrupted run wrote); ``head``, the
    context's, gives a root header when ``old`` lost its own."""
    seqs = {int(entry["seq"]): number for number, entry in enumerate(entries, start=1)}
    if old in done:
        return done[old], seqs
    new_id = new_segment_id()
    base = header if header is not None else _root_header(head)
    lines = [{**base, "segment_id": str(new_id), "salvaged_from": str(old)}]
    lines += [{**entry, "seq": number} for number, entry in enumerate(entries, start=1)]
    _write_whole(folder / f"{new_id}{SEGMENT_SUFFIX}", lines)
    return new_id, seqs


def copy_forks(
    folder: Path,
    old: SegmentId,
    new: SegmentId,
    seqs: Mapping[int, int],
    done: Mapping[SegmentId, SegmentId],
) -> dict[SegmentId, SegmentId]:
    """Copy each fork of ``old`` onto ``new`` at the same entry, and theirs onto those."""
    copies: dict[SegmentId, SegmentId] = {}
    for child in segment_ids(folder):
        path = folder / f"{child}{SEGMENT_SUFFIX}"
        try:
            header = read_header(path)
        except StoreError:
            continue
        origin = header.get("origin") or {}
        standalone = header.get("history") is not None or "salvaged_from" in header
        if standalone or origin.get("parent") != str(old):
            continue
        complete, _ = codec.split_complete(read_file(path))  # a torn tail left out
        read = codec.decode_lines(complete, where=str(path), first_seq=0)
        at = int(origin.get("at_seq") or 0)
        at_new = max((n for o, n in seqs.items() if o <= at), default=0)
        if child in done:
            copy = done[child]
        else:
            copy = new_segment_id()
            head = {
                **read[0],
                "segment_id": str(copy),
                "salvaged_from": str(child),
                "origin": {**origin, "parent": str(new), "at_seq": at_new},
            }
            _write_whole(folder / f"{copy}{SEGMENT_SUFFIX}", [head, *read[1:]])
        copies[child] = copy
        own = {int(e["seq"]): int(e["seq"]) for e in read[1:]}
        copies.update(copy_forks(folder, child, copy, own, done))
    return copies


def _write_whole(path: Path, lines: Sequence[Mapping[str, Any]]) -> None:
    """Create a segment file from whole lines, durably (a repair is rare; make it last)."""
    data = b"".join(codec.encode_line(dict(line)) for line in lines)
    write_new(path, data, sync=True)
