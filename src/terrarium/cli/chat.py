"""``terrarium chat``: talk to the model in a session, interactively or from a pipe.

On a terminal with no session named, a picker lists the sessions; input is read with
prompt_toolkit (Enter sends, Esc+Enter a new line, Ctrl-C interrupts a reply, Ctrl-D leaves;
``/help`` lists the commands). A failed or interrupted reply leaves its message in the
session, marked failed, not sent again unless asked (``/retry``, ``--retry``); the note says
so (:func:`advice`).

From a pipe, each line is one message and replies print plainly; the first failure ends the
chat with one line and exit 1. A line that is not UTF-8 fails before anything of it is sent.
``-p TEXT`` sends one message and prints the reply (``-p -``: all of stdin); Ctrl-C there
exits 130. A chat that ends well says on stderr how to resume it; stdout carries only replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from click.core import ParameterSource

from terrarium import legacy, sessions
from terrarium.cli import catalog
from terrarium.cli.app import (
    DEFAULT_TYPE,
    USER_ERRORS,
    CliState,
    command,
    default_location,
    generated_context,
    model_options,
    parse_context,
    program,
)
from terrarium.cli.commands import (
    context_stats,
    export_session,
    failure,
    fork_session,
    print_message,
    print_stats,
)
from terrarium.cli.output import one_line, plural
from terrarium.errors import ContextNotFound, ContextTooLong, LLMError, NothingToCompact
from terrarium.llm import ModelAccess
from terrarium.model import ContextId, encode_name, item_role, item_text

T = TypeVar("T")

COMMANDS: dict[str, tuple[str, str]] = {
    "help": ("", "list these commands"),
    "history": ("", "show this session's messages"),
    "stats": ("", "show this session's statistics"),
    "fork": ("NAME", "copy this session into NAME (name or type:name) and switch to it"),
    "switch": ("CONTEXT", "switch to another session (a new one starts on its first message)"),
    "compact": ("", "summarise the history with the model and continue from the summary"),
    "retry": ("", "send the last message again, when its reply failed"),
    "rewind": ("[N]", "drop the last N messages, default 1 (they stay in the session tree)"),
    "clear": ("", "empty the history (the old one stays in the session tree)"),
    "export": ("FORMAT [FILE]", "export this session (default file TYPE_NAME.EXT; - = stdout)"),
    "quit": ("", "leave the chat (or Ctrl-D)"),
}
"""Each ``/command``: its argument (required unless in brackets) and what it does."""

KEPT = "your message is kept, marked failed, and is not sent with your next one"

INTERRUPTED_EXIT = 130
"""The exit status of ``chat -p`` (or a piped chat) stopped by Ctrl-C: 128 + SIGINT."""

KEYS_HELP = "Enter sends, Esc+Enter or Alt+Enter adds a line, Ctrl-C interrupts, Ctrl-D leaves"


def is_message(line: str) -> bool:
    """Whether an input line is a message to send (``//text`` is), not a ``/command``."""
    return not line.startswith("/") or line.startswith("//")


def sends_message(line: str) -> bool:
    """Whether an input line sends a message: a message, or ``/retry``."""
    return is_message(line) or line.split(" ", 1)[0] == "/retry"


@dataclass(frozen=True)
class Hints:
    """How a note names the ways out of a failed turn: in-chat commands, or command lines."""

    context: ContextId
    retry: str
    compact: str
    rewind: str
    again: str
    """How to send a message that was not kept once more."""


def advice(exc: BaseException, hints: Hints, kept: bool = True, partial: bool = True) -> str:
    """The note after a failed or interrupted turn (docs/cli.md, "When a reply fails").

    A failure that would repeat says why and what to do; a passing one offers the retry. A new
    session's first message that got no reply is not ``kept``: the session is not created.
    ``partial``: some of the reply had come (Ctrl-C keeps it).
    """
    if isinstance(exc, Interrupted | KeyboardInterrupt):
        if not kept:
            return (
                f"interrupted before any reply: nothing was kept ({hints.context} begins with "
                "its first answered message)"
            )
        if not partial:
            return f"interrupted before any reply: {KEPT}; {hints.retry} sends it again"
        return (
            "interrupted: the partial reply is logged, marked interrupted, and your message is "
            f"not sent with your next one; {hints.retry} sends it again"
        )
    if not kept:
        why = (
            " It does not fit the model's context: shorten it."
            if isinstance(exc, ContextTooLong)
            else ""
        )
        return (
            f"nothing was kept: {hints.context} begins with its first answered message.{why} "
            f"{hints.again[0].upper()}{hints.again[1:]}"
        )
    if isinstance(exc, ContextTooLong):
        return (
            f"{KEPT}. It does not fit the model's context together with the history: shorten "
            f"it, or make room with {hints.compact} or {hints.rewind}, then {hints.retry}"
        )
    if isinstance(exc, LLMError) and not exc.transient:
        return f"{KEPT}. Sent as it is, it would fail again: fix the cause, then {hints.retry}"
    return f"{KEPT}; {hints.retry} sends it again"


class Interrupted(Exception):
    """A reply or compaction was interrupted with Ctrl-C."""


class Chat:
    """One chat run: the current session, the commands, sending and printing."""

    def __init__(
        self,
        state: CliState,
        context: ContextId,
        server: ModelAccess,
        system_prompt: str | None,
        interactive: bool,
    ) -> None:
        self.state = state
        self.out = state.out
        self.context = context
        self.system_prompt = system_prompt
        self.interactive = interactive
        self.manager = state.manager(server)
        self._running: asyncio.Future[Any] | None = None
        self.done = False
        self.opened = False
        """Whether a session was opened (the picker may be cancelled before one is)."""
        self.replying = False
        """Whether a message was sent and its reply has not ended well (yet)."""
        self.as_json = False
        """``chat -p --json``: replies are not streamed to stdout (:func:`turn_json` prints)."""
        self.reply = ""
        """The last reply's text."""
        self.parts: list[str] = []
        """The pieces of the reply being streamed (or cut short)."""

    @property
    def hints(self) -> Hints:
        """The chat's own commands; after ``chat -p`` or a piped chat, the commands to type."""
        context = self.context
        if self.interactive:
            return Hints(context, "/retry", "/compact", "/rewind N", "Up brings your message back")
        name, store = shlex.quote(str(context)), storage_suffix(self.state)
        return Hints(
            context,
            f"'{resume_command(self.state, context)} --retry'",
            f"'{program()} compact {name}{store}'",
            f"'{program()} rewind {name} -n N{store}'",
            "run the command again",
        )

    def kept(self) -> bool:
        """Whether the session is in the store: after a failed first message it is not."""
        return self.state.store().get_head(self.context) is not None

    def failure_note(self, exc: BaseException) -> str:
        """The note after the reply to a message failed (or Ctrl-C stopped it)."""
        return advice(exc, self.hints, self.kept(), bool(self.parts))

    def open(self, context: ContextId) -> None:
        """Make ``context`` current, importing its legacy file on first use."""
        if legacy.resume(self.state.store(), context):
            self.out.note(f"imported the legacy session {context} into the log")
        self.context = context
        self.opened = True

    def typed(self) -> list[str]:
        """The session's user messages, oldest first, but a compaction's summary: what the
        user typed, for Up to recall."""
        store = self.state.store()
        head = store.get_head(self.context)
        if head is None:
            return []
        found = sessions.messages(sessions.lineage(store, head.session_id, head.segment_id))
        return [
            item_text(m.item)
            for m in found
            if item_role(m.item) == "user" and not m.summary and item_text(m.item).strip()
        ]

    def message_count(self) -> int:
        try:
            return len(self.manager.history(str(self.context)))
        except ContextNotFound:
            return 0

    async def interruptible(self, work: Awaitable[T]) -> T:
        """Run ``work``; Ctrl-C (SIGINT) cancels it and raises :class:`Interrupted`."""
        task = asyncio.ensure_future(work)
        self._running = task
        try:
            return await task
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # we are being cancelled ourselves, not just the work
            raise Interrupted from None
        finally:
            self._running = None

    def on_sigint(self) -> None:
        """SIGINT handler while the chat runs: interrupt the reply, if there is one."""
        if self._running is not None and not self._running.done():
            self._running.cancel()

    async def send(self, text: str) -> None:
        """Send one message and stream the reply; :attr:`replying` stays set when it fails."""
        self.replying = True
        parts: list[str] = []
        self.parts = parts

        async def consume() -> None:
            stream = cast(
                AsyncGenerator[str, None],
                self.manager.stream_with_context(str(self.context), text, self.system_prompt),
            )
            async with contextlib.aclosing(stream):
                async for delta in stream:
                    parts.append(delta)
                    if not self.as_json:  # --json prints the whole reply at the end
                        self.out.write(delta)

        try:
            await self.interruptible(consume())
        finally:
            if parts and not self.as_json:
                self.out.write("\n")
        self.replying = False
        self.reply = "".join(parts)

    async def run_line(self, line: str) -> None:
        """Handle one input: a ``/command`` or a message (``//text`` sends ``/text``)."""
        if is_message(line):
            await self.send(line[1:] if line.startswith("//") else line)
            return
        command, _, arg = line[1:].partition(" ")
        name = command.strip()
        handler: Callable[[str], Awaitable[None]] | None = getattr(self, f"cmd_{name}", None)
        if name not in COMMANDS or handler is None:
            raise click.ClickException(f"unknown command /{name}: /help lists the commands")
        needs = COMMANDS[name][0]
        if needs and not needs.startswith("[") and not arg.strip():  # a required argument
            raise click.ClickException(f"usage: /{name} {needs}")
        await handler(arg.strip())

    async def cmd_help(self, _arg: str) -> None:
        rows = [[f"/{n} {a}".rstrip(), text] for n, (a, text) in COMMANDS.items()]
        self.out.table(["command", "what it does"], rows)
        self.out.line(f"{KEYS_HELP}. Start a message with // to send a leading /.", style="dim")

    async def cmd_history(self, _arg: str) -> None:
        from terrarium.formats.jsonl import load_transcript

        try:
            transcript = load_transcript(self.state.store(), self.context)
        except ContextNotFound:
            transcript = None
        if transcript is None or not transcript.items:
            self.out.line(f"{self.context} has no messages yet", style="dim")
            return
        for n, timed in enumerate(transcript.items):  # as ``show`` prints them
            print_message(self.out, {"ts": timed.ts, **timed.item, **failure(transcript.state, n)})

    async def cmd_stats(self, _arg: str) -> None:
        try:
            data = context_stats(self.state, self.context)
        except ContextNotFound:
            self.out.line(f"{self.context} has no messages yet", style="dim")
            return
        print_stats(self.state, data)

    async def cmd_fork(self, arg: str) -> None:
        target = parse_context(arg, self.context.type)
        fork_session(self.state, self.context, target)
        self.context = target
        self.out.note(f"now in {target}")

    async def cmd_switch(self, arg: str) -> None:
        self.open(parse_context(arg, self.context.type))
        self.out.note(f"now in {self.context} ({plural(self.message_count(), 'message')})")

    async def cmd_compact(self, _arg: str) -> None:
        catalog.require(self.state, self.context)
        before = self.message_count()
        try:
            await self.interruptible(
                self.manager.compact_context(str(self.context), only_if_smaller=True)
            )
        except NothingToCompact as exc:
            self.out.note(str(exc), style="yellow")
            return
        after = self.message_count()
        self.out.note(f"compacted {self.context}: {plural(before, 'message')} -> {after}")

    async def cmd_retry(self, _arg: str) -> None:
        try:
            text = self.manager.failed_input(str(self.context))
        except ContextNotFound:
            text = None
        if text is None:
            raise click.ClickException(
                f"nothing to retry in {self.context}: its last turn did not fail"
            )
        await self.send(text)

    async def cmd_rewind(self, arg: str) -> None:
        try:
            count = int(arg or "1")
        except ValueError:
            count = -1
        if count < 0:
            raise click.ClickException("usage: /rewind [N], N a count of messages (default 1)")
        catalog.require(self.state, self.context)
        dropped = self.manager.rewind_context(str(self.context), count)
        self.out.note(
            f"rewound {self.context}: dropped {plural(len(dropped), 'message')}, "
            f"{plural(self.message_count(), 'message')} left (the dropped ones stay in the "
            "session tree)"
        )

    async def cmd_clear(self, _arg: str) -> None:
        catalog.require(self.state, self.context)
        self.manager.clear_context(str(self.context))
        self.out.note(f"cleared {self.context}")

    async def cmd_export(self, arg: str) -> None:
        from terrarium.export import get_format, write_export

        fmt, _, target = arg.partition(" ")
        spec = get_format(fmt)
        content = export_session(self.state, self.context, spec.name)
        target = target.strip()
        if target == "-":
            text = content.decode() if isinstance(content, bytes) else content
            self.out.write(text if text.endswith("\n") else text + "\n")
            return
        default = f"{self.context.type}_{encode_name(self.context.name)}{spec.extension}"
        path = Path(target or default)
        await asyncio.to_thread(write_export, path, content)
        self.out.note(f"exported {self.context} as {spec.name} to {path}")

    async def cmd_quit(self, _arg: str) -> None:
        self.done = True


async def piped(chat: Chat) -> None:
    """Read messages from stdin, one per line (bytes, so a non-UTF-8 line is refused whole)."""
    offset = 0
    for number, raw in enumerate(sys.stdin.buffer, start=1):
        line = decode_stdin(raw, number, offset).rstrip("\r\n")
        offset += len(raw)
        if not line.strip():
            continue
        await chat.run_line(line)
        if chat.done:
            return


def decode_stdin(raw: bytes, number: int | None = None, offset: int = 0) -> str:
    """Text read from stdin (line ``number``, ``offset`` bytes in); not UTF-8: a ClickException."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        byte = f"byte 0x{raw[exc.start]:02x} at offset {exc.start}"
        if number is None:
            raise click.ClickException(
                f"stdin is not valid UTF-8: {byte}; nothing was sent"
            ) from None
        raise click.ClickException(
            f"stdin line {number} is not valid UTF-8: {byte} of the line "
            f"({offset + exc.start} of the input); the line was not sent"
        ) from None


async def interactive(chat: Chat, default_type: str) -> None:
    """The terminal chat: picker (unless a session was opened), then prompt and replies."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings, KeyPressEvent

    if not chat.opened:
        from terrarium.cli.picker import Picker

        rows = catalog.list_sessions(chat.state)
        chosen = await Picker(rows, default_type, lambda c: preview(chat.state, c)).run()
        if chosen is None:
            chat.out.note("no session chosen")
            return
        chat.open(chosen)
    keys = KeyBindings()

    @keys.add("enter")
    def _send(event: KeyPressEvent) -> None:
        event.current_buffer.validate_and_handle()

    @keys.add("escape", "enter")
    def _newline(event: KeyPressEvent) -> None:
        event.current_buffer.insert_text("\n")

    recall = InMemoryHistory()  # Up recalls the session's messages, oldest loaded first
    for text in chat.typed():
        recall.append_string(text)
    session: PromptSession[str] = PromptSession(
        multiline=True,
        history=recall,
        key_bindings=keys,
        prompt_continuation=lambda width, *_: "." * (width - 1) + " ",
    )
    chat.out.line(
        f"{chat.context}: {plural(chat.message_count(), 'message')}. {KEYS_HELP}; /help lists "
        "commands.",
        style="dim",
    )
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, chat.on_sigint)
    try:
        while not chat.done:
            try:
                line = await session.prompt_async(f"{chat.context}> ", handle_sigint=False)
            except KeyboardInterrupt:
                continue  # Ctrl-C at the prompt clears the line
            except EOFError:
                break
            if line.strip():
                await handle_line(chat, line)
    finally:
        loop.remove_signal_handler(signal.SIGINT)


async def handle_line(chat: Chat, line: str) -> None:
    """One line typed in the terminal chat; a failure is a note, and the chat goes on."""
    try:
        await chat.run_line(line)
    except Interrupted as exc:
        note = chat.failure_note(exc) if sends_message(line) else "interrupted"
        chat.out.note(note, style="yellow")
    except LLMError as exc:
        chat.out.error(str(exc))
        if sends_message(line):
            chat.out.note(chat.failure_note(exc))
        elif isinstance(exc, ContextTooLong):  # /compact of a history too long
            chat.out.note("/rewind N drops the last N messages, to make room")
    except click.ClickException as exc:
        chat.out.error(exc.format_message())
    except USER_ERRORS as exc:
        chat.out.error(str(exc))


def preview(state: CliState, context: ContextId) -> tuple[str, str] | None:
    """The picker's preview: the first user message and the last reply; None if unreadable."""
    try:
        history = sessions.restore(catalog.readable(state, context), context).history
    except USER_ERRORS:
        return None
    first = next((item_text(i) for i in history if i.get("role") == "user"), "")
    last = next((item_text(i) for i in reversed(history) if i.get("role") == "assistant"), "")
    return first, last


def read_prompt(prompt: str) -> str:
    """The one message of ``chat -p``: ``prompt``, all of stdin for ``-``, or both a line apart
    (``cat f | terrarium chat -p 'summarise this'``, as ``llm`` reads it)."""
    if prompt == "-":
        text = read_stdin()
    elif stdin_is_piped():
        text = "\n\n".join(part for part in (prompt, read_stdin()) if part.strip())
    else:
        text = prompt
    if not text.strip():
        raise click.UsageError("the prompt is empty: nothing was sent")
    return text


def stdin_is_piped() -> bool:
    """Whether stdin is a pipe or a file to read (not a terminal, and open)."""
    try:
        return not sys.stdin.isatty()
    except (AttributeError, ValueError):  # no stdin, or a closed one
        return False


def read_stdin() -> str:
    """All of stdin as UTF-8 text without its final newlines; ClickException if not UTF-8."""
    return decode_stdin(sys.stdin.buffer.read()).rstrip("\r\n")


def turn_json(state: CliState, context: ContextId, reply: str) -> dict[str, Any]:
    """``chat -p --json``: the reply, the session, and the turn's finish reason, model and usage."""
    store = state.store()
    head = store.get_head(context)
    entries = store.read_segment(head.session_id, head.segment_id).entries if head else []
    usage = finish = None
    for line in reversed(entries):
        if line["kind"] == "run_completed" and finish is None:
            finish = line
        elif line["kind"] == "usage" and finish is not None:
            usage = line
            break
        elif line["kind"] == "user_input":
            break  # the turn's own entries only
    return {
        "context_id": str(context),
        "reply": reply,
        "finish_reason": finish.get("finish_reason") if finish else None,
        "model": usage.get("model") if usage else None,
        "usage": None
        if usage is None
        else {k: usage.get(k, 0) for k in ("prompt_tokens", "completion_tokens", "cached_tokens")}
        | {"estimated": usage.get("estimated")},
    }


def most_recent(state: CliState, type_: str | None = None) -> ContextId:
    """The session active last, of any type or of ``type_``; ClickException if there is none."""
    rows = catalog.list_sessions(state, type=type_)
    if not rows:
        of = f" of type '{type_}'" if type_ is not None else ""
        raise click.ClickException(f"no session{of} to continue in {state.shown_location}")
    return max(rows, key=lambda row: row.last_active).id


def resume_command(state: CliState, context: ContextId) -> str:
    """The shell command that resumes ``context``, quoted, with ``--storage-dir`` when needed."""
    return f"{program()} chat {shlex.quote(str(context))}{storage_suffix(state)}"


def storage_suffix(state: CliState) -> str:
    """`` --storage-dir DIR`` when the store named differs from the default one; else ``""``."""
    if state.storage is not None and state.storage != default_location():
        return f" --storage-dir {shlex.quote(state.shown_location)}"
    return ""


def run_chat(
    state: CliState,
    context: ContextId | None,
    default_type: str,
    server: ModelAccess,
    system_prompt: str | None,
    prompt: str | None = None,
    last: bool | str = False,
    retry: bool = False,
    as_json: bool = False,
) -> None:
    """Chat in ``context`` (or the picker's) until input ends.

    ``prompt`` sends one message and prints the reply (in a new session when none is named);
    ``retry`` the session's failed message; ``last`` picks the session active last (a string: of
    that type); ``as_json`` prints :func:`turn_json`. A failed reply ends it with one line;
    Ctrl-C with exit status 130.
    """
    message = read_prompt(prompt) if prompt is not None else None
    one_shot = message is not None or retry
    is_terminal = not one_shot and sys.stdin.isatty() and sys.stdout.isatty()
    if context is None and message is not None and not last:
        context = generated_context(default_type)  # -p starts afresh, as claude -p does
        while state.store().get_head(context) is not None:  # the same second and digits
            context = generated_context(default_type)
    chat = Chat(
        state, context or ContextId(default_type, "main"), server, system_prompt, is_terminal
    )
    chat.as_json = as_json
    if last:  # after Chat(): the manager must be built with the model options first
        of_type = last if isinstance(last, str) else None
        context = chat.context = most_recent(state, of_type)

    async def main() -> None:
        try:
            if context is not None or not is_terminal:  # else the picker opens one
                chat.open(chat.context)
            if is_terminal:
                await interactive(chat, default_type)
            elif retry:
                await chat.cmd_retry("")
            elif message is not None:
                await chat.send(message)
            else:
                await piped(chat)
        finally:
            await state.aclose_client()

    run_loop(chat, main())
    if as_json:
        state.out.json(turn_json(state, chat.context, chat.reply))
    if chat.opened and chat.kept():
        state.out.note(f"resume with: {resume_command(state, chat.context)}")


def run_loop(chat: Chat, main: Coroutine[Any, Any, None]) -> None:
    """Run the chat's event loop; Ctrl-C ends it with status 130, a failed reply with one line."""
    try:
        asyncio.run(main)
    except KeyboardInterrupt as exc:
        chat.out.note(chat.failure_note(exc) if chat.replying else "interrupted", style="yellow")
        raise click.exceptions.Exit(INTERRUPTED_EXIT) from None
    except LLMError as exc:
        if not chat.replying:
            raise
        reason = one_line(str(exc)).removesuffix(".")  # the server's sentence, then the note
        raise click.ClickException(f"{reason}; {chat.failure_note(exc)}") from exc


def resolve_context(context: str | None, session_id: str | None, type_: str) -> ContextId | None:
    """The session named by ``CONTEXT`` or ``--session-id``/``--type`` (None: not named)."""
    named = parse_context(context, type_) if context else None
    if session_id is not None:
        by_id = ContextId(type_, session_id)
        if named is not None and named != by_id:
            raise click.ClickException(f"CONTEXT {named} and --session-id {by_id} disagree")
        named = by_id
    return named


@command(creates=True)
@click.argument("context", required=False, metavar="[CONTEXT]")
@click.option("--session-id", default=None, metavar="ID", help="Session name (with --type).")
@click.option(
    "--type",
    "type_",
    default=DEFAULT_TYPE,
    show_default=True,
    metavar="TYPE",
    help="Session type for --session-id, bare names and new sessions.",
)
@click.option(
    "--prompt",
    "-p",
    default=None,
    metavar="TEXT",
    help="Send TEXT as one message, print the reply and exit; '-p -' sends all of stdin.",
)
@click.option(
    "--last",
    "-c",
    is_flag=True,
    help="Continue the most recently active session (of --type, when given).",
)
@click.option(
    "--retry",
    is_flag=True,
    help="Send the session's last message again when its reply failed; print the reply.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="With -p or --retry: print one JSON object, the reply and its usage (docs/cli.md).",
)
@click.option("--system-prompt", default=None, help="System prompt (logged when it changes).")
@model_options
def chat(
    state: CliState,
    context: str | None,
    session_id: str | None,
    type_: str,
    prompt: str | None,
    last: bool,
    retry: bool,
    as_json: bool,
    system_prompt: str | None,
    server: ModelAccess,
) -> None:
    """Chat in a session (CONTEXT is type:name, or a name of --type).

    With no session named, a terminal gets a picker of sessions; piped input
    goes to cli:main, one message per line; -p starts a new session. -p sends
    one message and prints the reply; --last (-c) continues the session active
    last; --retry sends a session's failed message again.
    """
    named = resolve_context(context, session_id, type_)
    if last and named is not None:
        raise click.UsageError("--last continues the last session: do not name one too")
    if retry and prompt is not None:
        raise click.UsageError("--retry sends the failed message again: do not give -p too")
    if retry and named is None and not last:
        raise click.UsageError("--retry needs a session: name it, or add --last")
    if as_json and prompt is None and not retry:
        raise click.UsageError("--json prints the reply of -p or --retry: give one of them")
    source = click.get_current_context().get_parameter_source("type_")
    which: bool | str = (
        (type_ if source is not ParameterSource.DEFAULT else True) if last else False
    )
    run_chat(state, named, type_, server, system_prompt, prompt, which, retry, as_json)
