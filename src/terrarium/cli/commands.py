"""The commands that manage sessions: list, show, stats, delete, clear, rewind, fork, compact,
export, import, migrate, fsck and reindex. Each one calls the library.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from terrarium._lazy import lazy_module
from terrarium.cli import lifecycle_cmds
from terrarium.cli.app import (
    CONTEXT,
    DATE,
    USER_ERRORS,
    CliState,
    command,
    count_option,
    flag,
    json_option,
    model_options,
    type_option,
)
from terrarium.cli.output import Output, fail_if_damaged, one_line, plural
from terrarium.display import short_time
from terrarium.errors import (
    ContextExists,
    IndexUnavailable,
    NothingToCompact,
    StoreError,
)

if TYPE_CHECKING:
    from terrarium import contexts, legacy, model, sessions
    from terrarium.cli import catalog
    from terrarium.llm import ModelAccess
    from terrarium.model import ContextId
    from terrarium.stores.base import PodMetadata, Store
else:  # loaded by the first command that uses them: --help uses none
    contexts = lazy_module("terrarium.contexts")
    catalog = lazy_module("terrarium.cli.catalog")
    legacy = lazy_module("terrarium.legacy")
    model = lazy_module("terrarium.model")
    sessions = lazy_module("terrarium.sessions")


class FormatChoice(click.Choice):  # type: ignore[type-arg]  # generic from click 8.2
    """An export format by name or alias (``md``, ``JSONL``), read when click asks: reading them
    at declaration would import :mod:`terrarium.export` on every command's start."""

    def __init__(self) -> None:
        super().__init__(())

    @property
    def choices(self) -> tuple[str, ...]:
        """The export formats' names."""
        from terrarium.export import FORMATS

        return tuple(FORMATS)

    @choices.setter
    def choices(self, _value: Any) -> None:
        """click.Choice's ``__init__`` sets them; :attr:`choices` reads them when asked."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from terrarium.export import format_name

        try:
            name = format_name(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        return super().convert(name, param, ctx)


class FormatOption(click.Option):
    """``export --format``: its help names the aliases, read when the help is shown."""

    def get_help_record(self, ctx: click.Context) -> tuple[str, str] | None:
        """The help line, the aliases of :mod:`terrarium.export` in it."""
        from terrarium.export import ALIASES

        aliases = ", ".join(f"{alias}={name}" for alias, name in ALIASES.items())
        self.help = f"Export format (also: {aliases})."
        return super().get_help_record(ctx)


@command("list")
@type_option
@count_option(
    "--limit",
    "-n",
    help="Show at most N sessions (0: all). Default: all when piped, a screenful on a terminal.",
)
@json_option
@flag("--archived", help="List only archived sessions.")
@flag("--all", "all_", help="List hot and archived sessions.")
def list_cmd(
    state: CliState, type_: str | None, limit: int | None, as_json: bool, archived: bool, all_: bool
) -> None:
    """List sessions, grouped by type, most recently active first."""
    scope = "all" if all_ else "archived" if archived else "hot"
    print_sessions(state, type_, as_json, limit, scope=scope)


def print_sessions(
    state: CliState,
    type_: str | None,
    as_json: bool,
    limit: int | None = None,
    *,
    scope: str = "hot",
) -> None:
    """The session list as a table or JSON; past ``limit`` rows (default: a screenful on a
    terminal, all into a pipe), how many more. ``scope``: ``hot``, ``archived`` or ``all``."""
    hot = catalog.list_sessions(state, type_) if scope != "archived" else []
    rows, pins = lifecycle_cmds.lifecycle_rows(state, hot, type_, scope)
    for problem in dict.fromkeys(r.problem for r in rows if r.problem):
        state.out.note(f"warning: {problem}", style="yellow")
    if limit is None and not as_json and state.out.rich:
        limit = max(1, state.out.height() - 5)  # header, rule, the "more" line, the prompt
    shown = rows if not limit else rows[:limit]
    if as_json:
        state.out.json({"contexts": [row.to_json(pins) for row in shown]})
    elif not rows:
        kind = f" of type '{type_}'" if type_ is not None else ""
        which = "archived sessions" if scope == "archived" else "sessions"
        state.out.note(f"no {which}{kind} in {state.shown_location}")
    else:
        extra = ["state"] if scope != "hot" else []
        state.out.table(
            ["context", "messages", "last active", "created", "source", *extra],
            [
                [
                    r.display,
                    "damaged" if r.problem else str(r.message_count),
                    short_time(r.last_active),
                    r.date,
                    "legacy" if r.legacy_path else "log",
                    *([_state_cell(r.to_json(pins))] if extra else []),
                ]
                for r in shown
            ],
            justify={"messages": "right"},
        )
    if len(shown) < len(rows):
        state.out.note(f"{len(rows) - len(shown)} more (--limit 0 shows all)")


def _state_cell(mark: Mapping[str, Any]) -> str:
    """``hot``, ``archived``, ``hot, pinned``..."""
    return f"{mark['state']}, pinned" if mark["pinned"] else mark["state"]


@command()
@click.argument("context", type=CONTEXT)
@json_option
@flag("--segments", help="Also list the session's segments and the head's entries.")
@count_option("--last", "-n", help="Only the last N messages (the header still counts them all).")
def show(
    state: CliState, context: ContextId, as_json: bool, segments: bool, last: int | None
) -> None:
    """Show a session's messages (CONTEXT is type:name)."""
    from terrarium.formats.jsonl import load_transcript

    store = catalog.readable(state, context)
    legacy = store is not state.store()
    transcript = load_transcript(store, context)
    restored = transcript.state
    first = max(0, len(transcript.items) - last) if last is not None else 0
    shown = transcript.items[first:]
    info: dict[str, Any] = {
        "context_id": str(context),
        "type": context.type,
        "name": context.name,
        "created_at": transcript.head.created_at,
        "last_active": restored.last_active,
        "system_prompt": restored.system_prompt,
        "message_count": len(restored.history),
        "turns": restored.turns,
        "legacy": legacy,
        "messages": [
            {"ts": t.ts, **t.item, **failure(restored, first + n)} for n, t in enumerate(shown)
        ],
    }
    head = transcript.head
    if segments:
        info["segments"] = _segments(store, head.session_id, head.segment_id)
    if as_json:
        state.out.json(info)
        return
    out = state.out
    out.line(
        f"{context}  {plural(info['message_count'], 'message')}, created "
        f"{short_time(info['created_at'])}, last active {short_time(info['last_active'])}"
        + ("  (legacy file)" if legacy else ""),
        style="bold",
    )
    if restored.system_prompt:
        out.line(f"system prompt: {restored.system_prompt}", style="dim")
    if first:
        out.line(f"({plural(first, 'earlier message')} not shown)", style="dim")
    for message in info["messages"]:
        print_message(out, message)
    if segments:
        _print_segments(out, info["segments"], store, head)


def failure(restored: model.RestoredState, index: int) -> dict[str, Any]:
    """``{"failed": ...}`` for ``show --json``'s message of a failed run; else nothing."""
    mark = restored.failure(index)
    return {} if mark is None else {"failed": mark}


def print_message(out: Output, message: Mapping[str, Any]) -> None:
    """One message of ``show``: its label line, its text; a failed run's mark and partial."""
    item = {k: v for k, v in message.items() if k not in ("ts", "failed")}
    role = model.item_label(item)
    failed = message.get("failed")
    label = f"[{role} {short_time(message['ts'])}]"
    out.line()
    if failed is None:
        out.line(label, style=_ROLE_STYLES.get(role, "bold"))
    else:
        error = one_line(str(failed.get("error") or failed.get("error_type") or "?"))
        out.line(f"{label} failed, not sent to the model again: {error}", style="bold red")
    out.line(render_item(item))
    if failed is not None and failed.get("partial"):
        out.line()
        out.line("[assistant, interrupted: the partial reply]", style="bold red")
        out.line(str(failed["partial"]))


def _print_segments(
    out: Output, tree: list[dict[str, Any]], store: Store, head: PodMetadata
) -> None:
    """``show --segments``: the session's segments, then the head segment's entries."""
    out.line()
    out.table(
        ["segment", "origin", "parent", "at", "entries", "created", "head"],
        [
            [
                s["segment_id"],
                s["origin"]["kind"],
                s["origin"].get("parent") or "-",
                "-" if s["origin"].get("at_seq") is None else str(s["origin"]["at_seq"]),
                str(s["entries"]) if s["entries"] is not None else f"-> {s['salvaged_into']}",
                short_time(s["created_at"]),
                "*" if s["head"] else "",
            ]
            for s in tree
        ],
        title="segments",
    )
    out.line()
    lines = store.read_segment(head.session_id, head.segment_id).entries
    out.table(
        ["seq", "kind", "text"],
        [[str(line["seq"]), line["kind"], _preview(line)] for line in lines],
        title="head segment entries (fork --at SEQ)",
        justify={"seq": "right"},
    )


_ROLE_STYLES = {"user": "bold cyan", "assistant": "bold green", "system": "bold yellow"}


def render_item(item: Mapping[str, Any]) -> str:
    """An item's text for the terminal: calls as ``-> name(args)``; a kind with no view as JSON."""
    view = model.chat_view(item)
    if view is None:
        rest = {k: v for k, v in item.items() if k != "type"}
        return json.dumps(rest, ensure_ascii=False, default=repr)
    text = model.item_text(item)
    parts = [text] if text else []
    for call in view.get("tool_calls") or []:
        function = call.get("function") or {}
        parts.append(f"-> {function.get('name', '?')}({function.get('arguments', '')})")
    if view.get("role") == "tool" and view.get("tool_call_id"):
        parts.insert(0, f"(result of {view['tool_call_id']})")
    return "\n".join(parts)


def _preview(line: dict[str, Any]) -> str:
    item = line.get("item")
    if isinstance(item, dict):
        text = " ".join(model.item_text(item).split())
        return f"{model.item_label(item)}: {text[:60]}"
    if line["kind"] == "run_errored":
        return str(line.get("error", ""))[:60]
    return ""


def _segments(store: Store, session_id: Any, head_segment: Any) -> list[dict[str, Any]]:
    """The session's segments, oldest first, as ``show --json --segments`` prints them."""
    out = []
    for segment_id, read, salvaged_into in sessions.tree_reads(store, session_id):
        header = read.header if read is not None else {}
        origin = dict(header.get("origin") or {"kind": "root" if read else "salvaged"})
        shown = {
            "segment_id": str(segment_id),
            "origin": {"kind": origin.get("kind", "root")}
            | {key: origin.get(key) for key in ("parent", "at_seq", "source")},
            "created_at": header.get("ts"),
            "entries": read.next_seq - 1 if read is not None else None,
            "head": segment_id == head_segment,
        }
        if salvaged_into is not None:
            shown["salvaged_into"] = str(salvaged_into)
        out.append(shown)
    return out


@command()
@click.argument("context", type=CONTEXT, required=False)
@json_option
def stats(state: CliState, context: ContextId | None, as_json: bool) -> None:
    """Show statistics of one session, or totals over all of them."""
    if context is not None:
        data = context_stats(state, context)
        if as_json:
            state.out.json(data)
        else:
            print_stats(state, data)
        return
    store = state.store()
    catalog.warn_legacy(state, legacy.listing(store).problems)
    sums = contexts.read_index(store, lambda r: r.sums())
    for name, problem in sums.damaged.items():
        shown = model.ContextId.parse(name).display
        state.out.note(f"warning: {shown} partly counted: {problem}", style="yellow")
    totals = contexts.totals(sums)
    if as_json:
        state.out.json(totals)
        return
    state.out.line(
        f"{plural(totals['contexts'], 'session')} ({totals['legacy']} legacy"
        + (f", {totals['damaged']} damaged and partly counted" if totals["damaged"] else "")
        + f"), {plural(totals['messages'], 'message')}, {plural(totals['turns'], 'turn')} "
        f"in {state.shown_location}"
    )
    usage = totals["usage"]
    state.out.line(
        f"tokens: {_count(usage, 'prompt_tokens')} prompt ({usage['cached_tokens']} cached), "
        f"{_count(usage, 'completion_tokens')} completion in {plural(usage['calls'], 'call')}"
        + (f" ({usage['estimated_calls']} estimated)" if usage["estimated_calls"] else "")
    )
    if totals["by_type"]:
        state.out.table(
            ["type", "sessions", "messages"],
            [[t, str(v["contexts"]), str(v["messages"])] for t, v in totals["by_type"].items()],
            justify={"sessions": "right", "messages": "right"},
        )


def context_stats(state: CliState, context: ContextId) -> dict[str, Any]:
    """The stats of a context (a legacy one read in memory): :func:`contexts.get_stats`."""
    with catalog.naming_store(state, context):
        return contexts.get_stats(state.store(), context)


def print_stats(state: CliState, data: dict[str, Any]) -> None:
    """Stats of one context as a two-column table."""
    usage = data["usage"]
    cached = f"{usage['cached_tokens']} cached"
    rows = [
        ["context", data["context_id"]],
        ["messages", str(data["message_count"])],
        ["turns", str(data["turns"])],
        ["created", short_time(data["created_at"])],
        ["last active", short_time(data["last_active"])],
        ["system prompt", data["system_prompt"] or "-"],
        ["prompt tokens", _count(usage, "prompt_tokens", detail=cached)],
        ["completion tokens", _count(usage, "completion_tokens", detail="")],
        ["model calls", _count(usage, "calls", detail="", mark="")],
        ["last run", data["last_run"] or "-"],
        ["segments", str(data["segments"])],
        ["source", "legacy file" if data.get("legacy") else "log"],
    ]
    if data.get("last_error"):
        rows.insert(10, ["last error", data["last_error"]])
    state.out.table(["stat", "value"], rows)


def _count(usage: dict[str, Any], key: str, *, detail: str | None = None, mark: str = "~") -> str:
    """A usage count, ``mark`` first when partly estimated; with ``detail`` (``""`` for none),
    the notes in brackets: ``~120 (5 cached, 3 estimated)``."""
    count, estimated = usage[key], usage[f"estimated_{key}"]
    shown = f"{mark}{count}" if estimated else str(count)
    if detail is None:
        return shown
    notes = [note for note in (detail, f"{estimated} estimated" if estimated else "") if note]
    return f"{shown} ({', '.join(notes)})" if notes else shown


@command()
@click.argument("context", type=CONTEXT)
@flag("--purge", help="Delete for ever, bypassing the trash (asks first on a terminal).")
@flag("--yes", "-y", help="Do not ask for confirmation (of --purge).")
def delete(state: CliState, context: ContextId, purge: bool, yes: bool) -> None:
    """Delete a session: into the trash ('terrarium trash restore' undoes it).

    With --purge it is deleted for ever, after a question on a terminal (--yes in
    scripts; without a terminal and without --yes it refuses). A store without a
    trash always deletes for ever, so it always asks.
    """
    lifecycle_cmds.delete_session(state, context, yes, purge=purge)


@command()
@click.argument("context", type=CONTEXT)
def clear(state: CliState, context: ContextId) -> None:
    """Empty a session's history (the old history stays in its session tree)."""
    with catalog.naming_store(state, context):
        contexts.clear_context(state.store(), context)
    state.out.note(f"cleared {context.display}", style="green")


@command()
@click.argument("context", type=CONTEXT)
@count_option("-n", "count", default=1, show_default=True, help="How many history items to drop.")
def rewind(state: CliState, context: ContextId, count: int) -> None:
    """Drop the last N history items of a session (they stay in its session tree)."""
    with catalog.naming_store(state, context):
        dropped = contexts.rewind_context(state.store(), context, count)
    state.out.note(
        f"rewound {context.display}: dropped {plural(len(dropped), 'item')}", style="green"
    )


@command()
@click.argument("source", type=CONTEXT)
@click.argument("target", type=CONTEXT)
@count_option(
    "--at",
    metavar="SEQ",
    help="Fork at this entry of the head segment (see 'show --segments'). Default: the end.",
)
def fork(state: CliState, source: ContextId, target: ContextId, at: int | None) -> None:
    """Copy session SOURCE's history into a new session TARGET."""
    fork_session(state, source, target, at)


def fork_session(
    state: CliState, source: ContextId, target: ContextId, at: int | None = None
) -> dict[str, Any]:
    """Fork ``source`` into ``target``; returns the new context's stats."""
    store = state.store()
    with catalog.naming_store(state, source):
        contexts.fork_context(store, source, target, at)
    data = contexts.get_stats(store, target)
    shown = f"{source.display} into {target.display}"
    state.out.note(f"forked {shown} ({plural(data['message_count'], 'message')})", style="green")
    return data


@command()
@click.argument("context", type=CONTEXT)
@model_options
def compact(state: CliState, context: ContextId, server: ModelAccess) -> None:
    """Ask the model to summarise a session and continue from the summary.

    A summary that would not make the session smaller is not written (a one-line
    note says why, and the exit code is 0).
    """
    import asyncio

    legacy.resume(state.store(), context)
    catalog.require(state, context)
    manager = state.manager(server)

    async def run() -> str:
        try:
            return await manager.compact_context(str(context), only_if_smaller=True)
        finally:
            await state.aclose_client()

    before = len(manager.history(str(context)))
    try:
        summary = asyncio.run(run())
    except NothingToCompact as exc:
        state.out.note(str(exc), style="yellow")
        return
    after = len(manager.history(str(context)))
    state.out.note(f"compacted {context}: {plural(before, 'message')} -> {after}", style="green")
    state.out.line(summary)


@command()
@click.argument("contexts", nargs=-1, type=CONTEXT)
@click.option(
    "--format",
    "-f",
    "fmt",
    cls=FormatOption,
    type=FormatChoice(),
    default="markdown",
    show_default=True,
    help="Export format.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(writable=True, allow_dash=True),
    default="-",
    help="File to write (default: stdout); for many sessions a folder, .zip or .tar.gz.",
)
@flag("--all", "all_", help="Export every session (into -o).")
@click.option("--type", "type_", metavar="TYPE", help="With --all: only sessions of this type.")
@click.option(
    "--since", type=DATE, metavar="DATE", help="Only sessions active on or after DATE (UTC)."
)
@click.option(
    "--until", type=DATE, metavar="DATE", help="Only sessions active on or before DATE (UTC)."
)
def export(
    state: CliState,
    contexts: tuple[ContextId, ...],
    fmt: str,
    output: str,
    all_: bool,
    type_: str | None,
    since: str | None,
    until: str | None,
) -> None:
    """Export sessions to a file format: one to a file, many to a folder or archive."""
    many = all_ or len(contexts) != 1 or type_ or since or until or _is_collection(output)
    if not contexts and not all_:
        raise click.UsageError("name a session to export, or pass --all")
    if many:
        if output == "-":
            raise click.UsageError("exporting many sessions needs -o FOLDER, .zip or .tar.gz")
        from terrarium.export import export_many

        names = None if all_ else list(contexts)
        with catalog.naming_store(state, *contexts):
            result = export_many(
                state.store(), names, fmt, output, type=type_, since=since, until=until
            )
        state.out.note(
            f"exported {plural(len(result.contexts), 'session')} as {fmt} to {result.path}",
            style="green",
        )
        fail_if_damaged(state.out, result.damaged, "exported")
        return
    (context,) = contexts
    content = export_session(state, context, fmt)
    if output == "-":
        if isinstance(content, bytes):
            sys.stdout.buffer.write(content)
            sys.stdout.flush()
        else:
            click.echo(content, nl=not content.endswith("\n"))
        return
    from terrarium.export import write_export

    path = Path(output)
    write_export(path, content)
    state.out.note(f"exported {context} as {fmt} to {path}", style="green")


def _is_collection(output: str) -> bool:
    """Whether ``-o`` names a folder or an archive rather than one file."""
    from terrarium.formats import ARCHIVE_SUFFIXES

    return output.endswith(("/", *ARCHIVE_SUFFIXES)) or Path(output).is_dir()


def export_session(state: CliState, context: ContextId, fmt: str) -> str | bytes:
    """The export of ``context`` (native or legacy) in format ``fmt``."""
    from terrarium.export import export_context

    return export_context(catalog.readable(state, context), context, fmt)


@command("import", creates=True)
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option(
    "--as",
    "as_context",
    type=CONTEXT,
    default=None,
    help="Import under this context id instead of the file's (one file only).",
)
@flag("--verbose", "-v", help="Print one line per session, not a summary.")
def import_cmd(
    state: CliState, paths: tuple[Path, ...], as_context: ContextId | None, verbose: bool
) -> None:
    """Import bundles (export -f jsonl of many sessions: .tar.gz, .zip or a folder), native
    .jsonl exports, and legacy JSON session files (or folders of them).

    A .jsonl file the store holds in part (an interrupted import) is completed; one it holds
    otherwise fails. One file that is already in the store, equal, is an error; among many,
    and in a bundle, such sessions are skipped (a rerun imports only what is new or
    unfinished). Prints one summary line; -v prints one line per session.
    """
    from terrarium.bundle import is_bundle

    bundles = [path for path in paths if is_bundle(path)]
    files = _expand(tuple(path for path in paths if path not in bundles))
    if as_context is not None and (bundles or len(files) != 1):
        raise click.UsageError("--as needs exactly one session file (not a bundle)")
    tally = _Imports(state, verbose)
    for path in bundles:
        import_bundle(state, path, tally)
    for path, root in files:
        try:
            context, count = import_file(state, path, as_context, root=root)
        except USER_ERRORS as exc:
            if len(files) == 1 and not bundles:
                raise
            tally.failed_one(str(path), exc)
            continue
        tally.imported_one(f"imported {context} ({plural(count, 'message')}) from {path}")
    if len(files) == 1 and not bundles and tally.imported and not verbose:
        state.out.note(tally.imported[0], style="green")
    elif tally.total > 1 or bundles:
        state.out.note(tally.summary(state.shown_location))
    if tally.failed:
        what = "files" if not bundles else "sessions and files"
        raise click.ClickException(f"{tally.failed} of {tally.total} {what} could not be imported")


class _Imports:
    """What an ``import`` run did so far, and its notes."""

    def __init__(self, state: CliState, verbose: bool) -> None:
        self.state, self.verbose = state, verbose
        self.imported: list[str] = []
        self.present = self.failed = 0

    @property
    def total(self) -> int:
        return len(self.imported) + self.present + self.failed

    def imported_one(self, line: str) -> None:
        self.imported.append(line)
        if self.verbose:
            self.state.out.note(line, style="green")

    def failed_one(self, what: str, exc: BaseException) -> None:
        """A session or file not imported: already there (a note with -v), or an error."""
        if isinstance(exc, ContextExists):
            self.present += 1
            if self.verbose:
                self.state.out.note(f"skipped {what}: {exc}")
            return
        self.failed += 1
        self.state.out.error(f"{what}: {exc}")

    def summary(self, where: str) -> str:
        """``import``'s one summary line; a rerun that finds everything imported says just that."""
        if self.present and not self.imported and not self.failed:
            return f"nothing to import: {plural(self.present, 'session')} already in {where}"
        text = f"imported {plural(len(self.imported), 'session')} into {where}"
        if self.present:
            text += f"; {self.present} already there"
        if self.failed:
            text += f"; {self.failed} failed"
        return text


def import_bundle(state: CliState, path: Path, tally: _Imports) -> None:
    """Import a bundle (:mod:`terrarium.bundle`) into the store, counting into ``tally``."""
    from terrarium import bundle

    report = bundle.import_bundle(state.store(), path)
    present = set(report.present)
    for name in report.copied:
        tally.imported_one(f"imported {name} from {path}")
    for name, reason in report.skipped:
        if name in present:
            tally.failed_one(f"{name} in {path}", ContextExists(reason))
        else:  # the reason names the bundle's file (and line)
            tally.failed_one(name, ValueError(reason))


def _expand(paths: tuple[Path, ...]) -> list[tuple[Path, Path | None]]:
    """The files to import, each with the sessions folder it lies in (when known)."""
    files: list[tuple[Path, Path | None]] = []
    for path in paths:
        if path.is_dir():
            from terrarium.formats.terrarium_json import iter_legacy_files

            found = sorted(iter_legacy_files(path))
            if not found:
                raise click.ClickException(
                    f"{path}: no legacy session files in this folder, and no "
                    "terrarium-bundle.json: it is not a bundle either"
                )
            files.extend((file, path) for file in found)
        else:
            files.append((path, None))
    return files


def import_file(
    state: CliState, path: Path, as_context: ContextId | None, *, root: Path | None = None
) -> tuple[str, int]:
    """Import one file; its context and message count (``root``: the legacy folder it lies in)."""
    from terrarium.bundle import read_file

    store, raw = state.store(), read_file(path)  # within the import's limit, as a bundle's
    if path.suffix == ".jsonl":
        from terrarium.formats.jsonl import import_context

        head = import_context(store, raw, context=as_context, where=str(path))
    else:
        root = root or _legacy_root_of(store, path)
        head = legacy.import_file(store, path, root=root, context=as_context, raw=raw)
    context = model.ContextId.parse(head.context)
    return str(context), len(sessions.restore(store, context).history)


def _legacy_root_of(store: Store, path: Path) -> Path | None:
    """The filesystem store's folder, when ``path`` lies inside it."""
    root = legacy.legacy_root(store)
    return root if root and path.resolve().is_relative_to(root.resolve()) else None


@command(creates=True)
@flag("--dry-run", help="Only print what would change.")
@flag(
    "--to-log",
    help="Also import every legacy JSON file into the log (the files stay as they are).",
)
@click.option(
    "--from",
    "source",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="The legacy sessions folder (default: the storage dir, when it is a folder).",
)
def migrate(state: CliState, dry_run: bool, to_log: bool, source: Path | None) -> None:
    """Move legacy flat session files into date folders (and optionally into the log)."""
    from terrarium.migrate import migrate

    root = source if source is not None else legacy.legacy_root(state.store())
    if root is None:
        raise click.ClickException(
            f"{state.shown_location} is not a folder: name the legacy sessions folder with --from"
        )
    store = state.store() if to_log else None
    report = migrate(root, dry_run=dry_run, to_log=to_log, store=store, out=sys.stdout)
    if report.failed:
        raise click.ClickException(
            f"{report.failed} of {plural(len(report.steps), 'legacy file')} could not be migrated"
        )


@command()
@flag("--repair", help="Set torn tails aside, rebuild lost or unreadable heads and the index.")
@flag(
    "--salvage",
    help="With --repair: copy every readable entry of a damaged segment into a new one.",
)
@json_option
def fsck(state: CliState, repair: bool, salvage: bool, as_json: bool) -> None:
    """Check every log of every session; without --repair nothing is modified."""
    from terrarium.cli.fsck import run_fsck

    run_fsck(state, repair=repair, salvage=salvage, as_json=as_json)


@command()
def reindex(state: CliState) -> None:
    """Rebuild the store's derived indexes (search, listing) from its sessions."""
    from terrarium import index

    store = state.store()
    try:
        count = index.reindex(store)
    except StoreError as exc:
        if isinstance(exc, IndexUnavailable):
            raise  # it names the index's file
        raise StoreError(f"{state.shown_location}: {exc}") from None
    state.out.note(f"reindexed {plural(count, 'session')} in {state.shown_location}", style="green")
