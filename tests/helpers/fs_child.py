"""Child processes for the FsStore fault and concurrency tests.

Run as ``python tests/helpers/fs_child.py COMMAND JSON-ARGS``. Every command talks JSON lines:
it writes one object per line to stdout (flushed at once, so the parent can wait on the pipe)
and, where it needs to start in step with its siblings, prints ``{"ready": true}`` and waits
for a line on stdin before it begins.
"""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from forked import run_forked

from terrarium import (
    ConflictError,
    ContextExists,
    ContextId,
    FsStore,
    PodActiveSegmentRef,
    StoreError,
    create_segment,
    ensure_head_or_fork,
)
from terrarium.stores import fs as fs_module
from terrarium.stores.base import NewEntry

TS = "2026-05-01T12:00:00.000000Z"


def say(**message: Any) -> None:
    """Write one JSON line to the parent and flush it (one ``write``, below PIPE_BUF)."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def wait_for_go() -> None:
    """Tell the parent we are ready and wait for its go (a line on stdin)."""
    say(ready=True)
    sys.stdin.readline()


def entry(tag: str, size: int, **extra: Any) -> NewEntry:
    """An item entry tagged ``tag`` whose content is ``size`` characters long."""
    return NewEntry(
        "item", TS, {"item": {"role": "assistant", "content": "x" * size}, "tag": tag, **extra}
    )


def head_ref(store: FsStore, context: str) -> PodActiveSegmentRef:
    head = store.get_head(ContextId.parse(context))
    assert head is not None, f"{context} does not exist"
    return head.ref


_MUTATIONS = ("write", "ftruncate", "link", "unlink", "rename", "replace", "mkdir", "rmdir")


def _count_mutations(kill_at: int, kinds: list[str] | None = None) -> list[int]:
    """Count this process's file changes; SIGKILL it just before change number ``kill_at``.
    ``kinds``, if given, gets each change's kind in turn: the call and the terrarium functions
    on the stack (``"rename in write_atomic < _write_head < ..."``, innermost first)."""
    count = [0]
    for name in _MUTATIONS:
        real = getattr(os, name)

        def counted(
            *args: Any, _real: Callable[..., Any] = real, _name: str = name, **kwargs: Any
        ) -> Any:
            count[0] += 1
            if count[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            if kinds is not None:
                kinds.append(f"{_name} in {_caller()}")
            return _real(*args, **kwargs)

        setattr(os, name, counted)
    return count


def _caller() -> str:
    """The terrarium functions on the caller's stack, innermost first."""
    names = []
    frame = sys._getframe(2)
    while frame is not None:
        if f"{os.sep}terrarium{os.sep}" in frame.f_code.co_filename:
            names.append(frame.f_code.co_name)
        frame = frame.f_back  # type: ignore[assignment]
    return " < ".join(names)


# ------------------------------------------------------------------------------- commands


def appender(args: dict[str, Any]) -> None:
    """Append batches to the context's head forever; ack each with its first seq and tags.

    Sizes vary from tens of bytes to ~200 KB so that a SIGKILL can land inside a ``write``;
    batches of two and three entries check that an append is all or nothing.
    """
    rng = random.Random(args["seed"])
    with FsStore(args["root"]) as store:
        ref = head_ref(store, args["context"])
        for number in range(100_000):
            batch = f"{args['round']}.{number}"
            count = rng.choice((1, 1, 1, 2, 3))
            entries = [
                entry(
                    f"{batch}.{i}",
                    200_000 if rng.random() < 0.5 else rng.randint(10, 3000),
                    batch=batch,
                    count=count,
                )
                for i in range(count)
            ]
            first = store.append(ref.session_id, ref.segment_id, entries)
            say(first=first, tags=[e.data["tag"] for e in entries])


def tear(args: dict[str, Any]) -> None:
    """Append one batch and die by SIGKILL in the middle of its ``write``.

    ``os.write`` is replaced by one that writes the first ``cut`` bytes of the batch (recording
    them in ``args["written"]``) and then kills this process, as a crash mid-write would.
    """
    real_write = os.write

    def write_and_die(fd: int, data: Any) -> int:
        data = bytes(data)
        cut = args["cut"]
        if cut == "after-first-line":
            at = data.index(b"\n") + 1 + 10
        else:
            at = len(data) // 2
        Path(args["written"]).write_bytes(data[:at])
        real_write(fd, data[:at])
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")

    with FsStore(args["root"]) as store:
        ref = head_ref(store, args["context"])
        entries = [entry(f"torn.{i}", size) for i, size in enumerate(args["sizes"])]
        fs_module.os.write = write_and_die  # type: ignore[assignment]
        try:
            store.append(ref.session_id, ref.segment_id, entries)
        finally:
            fs_module.os.write = real_write


def fsize(args: dict[str, Any]) -> None:
    """Append past RLIMIT_FSIZE: the kernel gives a short write, then EFBIG."""
    with FsStore(args["root"]) as store:
        ref = head_ref(store, args["context"])
        path = store.folder_of(ContextId.parse(args["context"]))
        assert path is not None
        segment = path / f"{ref.segment_id}.jsonl"
        before = segment.stat().st_size
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        _soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (before + args["room"], hard))
        try:
            store.append(ref.session_id, ref.segment_id, [entry("too-big", args["size"])])
        except StoreError as exc:
            error: str | None = f"{type(exc).__name__}: {exc}"
        else:
            error = None
        after_failure = segment.stat().st_size
        seq = store.append(ref.session_id, ref.segment_id, [entry("fits", 10)])
        say(error=error, before=before, after_failure=after_failure, seq=seq)


def repair_server(args: dict[str, Any]) -> None:
    """For each ``{"root", "kill"}`` line on stdin, run ``fsck --repair --salvage`` on root in
    a forked process SIGKILLed before its ``kill``-th file change (0: never); report
    ``{"killed", "mutations", "kinds"}`` (the kind of each change, on a run not killed).
    Forking from one warm process keeps each run to milliseconds.
    """
    from terrarium.cli import cli

    for line in sys.stdin:
        request = json.loads(line)

        def work(request: dict[str, Any] = request) -> list[Any]:
            kinds: list[str] = []
            count = _count_mutations(request["kill"], kinds if request["kill"] == 0 else None)
            argv = ["fsck", "--repair", "--salvage", "--storage-dir", request["root"]]
            try:
                cli.main(argv, standalone_mode=False)
            except BaseException:
                pass
            return [count[0], kinds]

        killed, done = run_forked(work, quiet=True)
        mutations, kinds = done if done is not None else (None, None)
        say(killed=killed, mutations=mutations, kinds=kinds)


def attach_server(args: dict[str, Any]) -> None:
    """For each ``{"root", "kill", "context", "session", "segment"}`` line on stdin, attach
    the detached session's segment to the context in a forked process SIGKILLed before its
    ``kill``-th file change (0: never); report ``{"killed", "mutations", "error"}``."""
    from terrarium import attach_context

    for line in sys.stdin:
        request = json.loads(line)

        def work(request: dict[str, Any] = request) -> list[Any]:
            count = _count_mutations(request["kill"])
            ref = PodActiveSegmentRef(uuid.UUID(request["session"]), uuid.UUID(request["segment"]))
            error = ""
            try:
                with FsStore(request["root"]) as store:
                    attach_context(store, request["context"], ref)
            except Exception as exc:
                error = type(exc).__name__
            return [count[0], error]

        killed, done = run_forked(work)
        mutations, error = done if done else (None, None)
        say(killed=killed, mutations=mutations, error=error)


def mp_append(args: dict[str, Any]) -> None:
    """Append ``count`` entries of mixed sizes (up to ~64 KB) without expected_seq."""
    rng = random.Random(args["seed"])
    writer = args["writer"]
    with FsStore(args["root"]) as store:
        ref = head_ref(store, args["context"])
        wait_for_go()
        for i in range(args["count"]):
            size = rng.choice((10, 100, 1000, 8000, 30_000, 64_000))
            store.append(ref.session_id, ref.segment_id, [entry(f"{writer}.{i}", size)])
        say(done=True)


def mp_expected(args: dict[str, Any]) -> None:
    """Try every seq 1..count once with expected_seq; report which ones this writer won.

    A writer moves to seq s+1 only once s is taken (by it or by another), so each attempt
    either wins or gets a ConflictError because another writer took that seq first.
    """
    writer = args["writer"]
    won, lost = [], []
    with FsStore(args["root"]) as store:
        ref = head_ref(store, args["context"])
        wait_for_go()
        for seq in range(1, args["count"] + 1):
            try:
                store.append(
                    ref.session_id, ref.segment_id, [entry(f"{writer}.{seq}", 50)], expected_seq=seq
                )
            except ConflictError:
                lost.append(seq)
            else:
                won.append(seq)
        say(won=won, lost=lost)


def mp_fork(args: dict[str, Any]) -> None:
    """Write ``count`` entries through ensure_head_or_fork with a private view of the context."""
    writer = args["writer"]
    acked: list[str] = []
    conflicts = 0
    with FsStore(args["root"]) as store:
        context = ContextId.parse(args["context"])
        ref = head_ref(store, args["context"])
        expected = store.next_seq(ref.session_id, ref.segment_id)  # every writer's view
        wait_for_go()
        while len(acked) < args["count"]:
            segment = ensure_head_or_fork(store, context, ref, expected)
            if segment != ref.segment_id:
                ref, expected = PodActiveSegmentRef(ref.session_id, segment), 1
            tag = f"{writer}.{len(acked)}"
            try:
                store.append(
                    ref.session_id, ref.segment_id, [entry(tag, 40)], expected_seq=expected
                )
            except ConflictError:
                conflicts += 1
                continue
            acked.append(tag)
            expected += 1
        say(acked=acked, conflicts=conflicts)


def mp_create(args: dict[str, Any]) -> None:
    """Create each named context; report which ones this process created."""
    created: dict[str, str] = {}
    existed: list[str] = []
    with FsStore(args["root"]) as store:
        wait_for_go()
        for name in args["contexts"]:
            try:
                session_id, _ = create_segment(store, context=name)
            except ContextExists:
                existed.append(name)
            else:
                created[name] = str(session_id)
        say(created=created, existed=existed)


COMMANDS: dict[str, Callable[[dict[str, Any]], None]] = {
    "appender": appender,
    "tear": tear,
    "fsize": fsize,
    "mp_append": mp_append,
    "repair_server": repair_server,
    "attach_server": attach_server,
    "mp_expected": mp_expected,
    "mp_fork": mp_fork,
    "mp_create": mp_create,
}

if __name__ == "__main__":
    COMMANDS[sys.argv[1]](json.loads(sys.argv[2]))
