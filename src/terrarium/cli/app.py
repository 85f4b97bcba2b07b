"""The ``terrarium`` command group: shared options, the store and manager, the error boundary.

Every command takes ``--storage-dir`` (before the command name too); the store opens on first
use and closes when the command ends. A command that only reads never creates one. Errors
a user can cause end the command with one line on stderr and a non-zero exit, never a
traceback; a closed pipe (``terrarium list | head -1``) ends it quietly with 141. Only
commands that call a model build a :class:`MultiContextManager` (and import ``openai``).
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from terrarium.cli import examples
from terrarium.cli.output import Output, error_text, one_line
from terrarium.errors import DISTRIBUTION, CorruptLog, TerrariumError

if TYPE_CHECKING:
    from terrarium.agent.multi_context_manager import MultiContextManager
    from terrarium.llm import ModelAccess
    from terrarium.model import ContextId
    from terrarium.stores.base import Store

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_STORAGE = "./sessions"
DEFAULT_BASE_URL = "http://localhost:8000/v1"
STORAGE_ENV = "TERRARIUM_STORAGE_DIR"
STORE_ENV = "TERRARIUM_STORE"
BASE_URL_ENV = "TERRARIUM_BASE_URL"
MODEL_ENV = "TERRARIUM_MODEL"

#: The errors a user's input can cause; each becomes a one-line message and exit code 1.
USER_ERRORS = (TerrariumError, ValueError, OSError)


def program() -> str:
    """This program as a shell should run it again, for a ``resume with: ...`` note.

    ``terrarium`` when ``PATH`` finds this very script, else the quoted path it was started by
    (``.venv/bin/terrarium``). The seed's ``chat.py`` names the ``terrarium`` installed beside
    its Python (the venv's) the same way. Run otherwise (``python -m terrarium``), ``terrarium``.
    """
    import shlex
    import shutil

    started = sys.argv[0] if sys.argv else ""
    if os.path.basename(started) == "chat.py":
        started = os.path.join(os.path.dirname(sys.executable), "terrarium")
    if not os.path.isfile(started) or os.path.basename(started) != "terrarium":
        return "terrarium"
    found = shutil.which("terrarium")
    try:
        same = found is not None and os.path.samefile(found, started)
    except OSError:
        same = False
    return "terrarium" if same else shlex.quote(started)


class UsageLine(click.ClickException):
    """A usage error shown on one line, with click's usage exit code (2)."""

    exit_code = 2


#: The exit status of a command whose output pipe was closed: a shell's for SIGPIPE (128 + 13).
BROKEN_PIPE_EXIT = 141


def quiet_stdout() -> None:
    """Point stdout at the null device, so flushing into a closed pipe raises and prints nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError):  # no real file descriptor (a test runner's stream)
        pass


class GuardedCommand(click.Command):
    """A command (``chat.py``, the group) whose user errors become one-line messages."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            try:
                return super().invoke(ctx)
            finally:
                sys.stdout.flush()  # a closed pipe shows here at the latest, not at exit
        except BrokenPipeError:
            quiet_stdout()
            raise click.exceptions.Exit(BROKEN_PIPE_EXIT) from None
        except click.UsageError as exc:
            if type(exc).__name__ == "NoArgsIsHelpError":
                raise
            # One line: click would print the usage, a hint and the error on three.
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            raise UsageLine(f"{exc.format_message()}{hint}") from exc
        except USER_ERRORS as exc:
            shown = error_text(store_os_error(ctx, exc))
            if isinstance(exc, CorruptLog) and "terrarium fsck" not in shown:
                shown = f"{shown}; {CorruptLog.HINT}"
            raise click.ClickException(one_line(shown) or type(exc).__name__) from exc


def store_os_error(ctx: click.Context, exc: BaseException) -> BaseException:
    """``exc``, or, for an OS error that names no file (a full disk's) raised in the store's
    code, the same error naming the store: ``{location}: No space left on device``."""
    state = ctx.find_object(CliState)
    if not isinstance(exc, OSError) or exc.filename is not None or state is None:
        return exc
    import traceback

    frames = traceback.walk_tb(exc.__traceback__)
    if not any(f.f_globals.get("__name__", "").startswith(_STORE_CODE) for f, _ in frames):
        return exc  # not the store's: the output (stdout into a full file), a socket, ...
    return OSError(exc.errno, exc.strerror or str(exc), state.shown_location)


_STORE_CODE = ("terrarium.stores.", "terrarium.index.")
"""The modules whose file writes are the store's (its log, its derived indexes)."""


class GuardedGroup(GuardedCommand, click.Group):
    """A group with :class:`GuardedCommand`'s error boundary around every subcommand.

    Commands registered with :meth:`add_lazy` are imported only when they run or show their own
    help (``chat`` imports ``asyncio``, a fifth of the start of ``terrarium list``).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, tuple[str, str]] = {}
        """Each lazily loaded command's name: the module defining it, and its summary."""
        self._listing = False

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        """Add a command; its ``--help`` ends with its examples (``cli/examples.py``)."""
        super().add_command(cmd, name)
        if cmd.epilog is None:
            cmd.epilog = examples.epilog(name or cmd.name or "")

    def add_lazy(self, name: str, module: str, summary: str) -> None:
        """Register command ``name``, defined (``@cli.command``) in ``module``."""
        self.lazy[name] = (module, summary)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self.lazy})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in self.lazy:
            module, summary = self.lazy[cmd_name]
            if self._listing:  # the group's --help: the summary is all it shows
                return click.Command(cmd_name, short_help=summary)
            importlib.import_module(module)
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False


class CliState:
    """What one invocation shares between the group and its command: store, manager, output."""

    def __init__(self) -> None:
        self.storage: str | None = None
        self.out = Output()
        self.reads_only = False
        """Set by a command that never creates a store: a missing one is ``no store at ...``."""
        self._store: Store | None = None
        self._manager: MultiContextManager | None = None
        self._client_closed = False

    @property
    def location(self) -> str:
        """The store asked for: ``--storage-dir``, else :func:`default_location`."""
        return self.storage or default_location()

    @property
    def shown_location(self) -> str:
        """The location with any password masked, for messages."""
        from terrarium.stores.url import redact_url

        return redact_url(self.location)

    def store(self) -> Store:
        """The store, opened on first use (created, unless the command only reads)."""
        if self._store is None:
            self._store = open_store(self.location, create=not self.reads_only)
        return self._store

    def manager(self, server: ModelAccess) -> MultiContextManager:
        """The conversation manager over the store (its model client connects on first use)."""
        if self._manager is None:
            from terrarium.agent.multi_context_manager import MultiContextManager

            self._manager = MultiContextManager(server.client(), store=self.store())
        return self._manager

    async def aclose_client(self) -> None:
        """Close the model client from inside the event loop that used it."""
        if self._manager is not None and not self._client_closed:
            self._client_closed = True
            await self._manager.client.aclose()

    def close(self) -> None:
        """Save what is pending and release the client and the store."""
        try:
            if self._manager is not None:
                self._manager.close()
                if not self._client_closed:
                    import asyncio

                    asyncio.run(self.aclose_client())
        finally:
            if self._store is not None:
                self._store.close()
            self._manager = self._store = None


def default_location() -> str:
    """The store without ``--storage-dir``: the environment's, else ``./sessions``."""
    return os.environ.get(STORAGE_ENV) or os.environ.get(STORE_ENV) or DEFAULT_STORAGE


def open_store(location: str, *, create: bool = True) -> Store:
    """Open a store from a folder path or a store URL (:func:`terrarium.stores.url.open_store`)."""
    from terrarium.stores.url import open_store as open_url

    # The PostgreSQL pool's notes on the connections it drops and retries (a server that went
    # away) are for logs: a command says in its one line what failed.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    return open_url(location, create=create)


def state_of(ctx: click.Context) -> CliState:
    """The invocation's shared state (created by the first option or command that asks)."""
    obj = ctx.find_object(CliState)
    if obj is None:
        obj = ctx.ensure_object(CliState)
        ctx.call_on_close(obj.close)
    return obj


def _remember_storage(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        state_of(ctx).storage = value


def storage_option(f: F) -> F:
    """``--storage-dir``, accepted by the group and by every command (the command's wins)."""
    return click.option(
        "--storage-dir",
        metavar="DIR|URL",
        default=None,
        expose_value=False,
        callback=_remember_storage,
        help=(
            f"Sessions folder or store URL (sqlite:///x.db, postgresql://...). "
            f"Default: ${STORAGE_ENV}, else ${STORE_ENV}, else {DEFAULT_STORAGE}."
        ),
    )(f)


def command(
    name: str | None = None, *, group: click.Group | None = None, creates: bool = False
) -> Callable[[Callable[..., Any]], click.Command]:
    """A command of ``group`` (default: ``terrarium``) called with the invocation's
    :class:`CliState` first, ``--storage-dir`` its last option; it only reads unless it
    ``creates`` a store. A subcommand's ``--help`` ends with ``examples["GROUP NAME"]``."""

    def decorate(f: Callable[..., Any]) -> click.Command:
        @functools.wraps(f)
        def run(*args: Any, **kwargs: Any) -> Any:
            state = state_of(click.get_current_context())
            state.reads_only = not creates
            return f(state, *args, **kwargs)

        made = storage_option((group or cli).command(name)(run))
        if group is not None:
            made.epilog = examples.epilog(f"{group.name} {made.name}")
        return made

    return decorate


def flag(*decls: str, help: str) -> Callable[[F], F]:
    """An on/off option."""
    return click.option(*decls, is_flag=True, help=help)


def count_option(*decls: str, help: str, metavar: str = "N", **more: Any) -> Callable[[F], F]:
    """An option taking a whole number, 0 or more."""
    return click.option(*decls, type=click.IntRange(min=0), metavar=metavar, help=help, **more)


json_option = flag("--json", "as_json", help="Print JSON (schema in docs/cli.md).")
type_option = click.option(
    "--type", "type_", metavar="TYPE", help="Only sessions of this type (cli, irc...)."
)


_MODEL_OPTIONS = (
    click.option(
        "--base-url",
        envvar=BASE_URL_ENV,
        default=DEFAULT_BASE_URL,
        show_default=True,
        help=f"OpenAI-compatible server (vLLM, llama.cpp, ...). Env: ${BASE_URL_ENV}.",
    ),
    click.option(
        "--model",
        envvar=MODEL_ENV,
        default=None,
        help=f"Model name. Default: ${MODEL_ENV}, else the first model the server lists.",
    ),
    click.option(
        "--retries",
        type=click.IntRange(min=0),
        default=2,
        show_default=True,
        help="Retries of a failed request (connection errors, 429, 5xx).",
    ),
    click.option(
        "--timeout",
        type=click.FloatRange(min=0.1),
        default=60.0,
        show_default=True,
        help="Seconds to wait for the server to connect or send the next piece.",
    ),
)


def model_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The model options, passed to the command as one ``server`` (a ``ModelAccess``)."""

    @functools.wraps(f)
    def run(
        *args: Any, base_url: str, model: str | None, retries: int, timeout: float, **kw: Any
    ) -> Any:
        from terrarium.llm import ModelAccess  # here: a command without a model never needs it

        return f(*args, server=ModelAccess(base_url, model, retries, timeout), **kw)

    for option in reversed(_MODEL_OPTIONS):
        run = option(run)
    return run


def parse_context(text: str, default_type: str | None = None) -> ContextId:
    """Parse ``type:name``; a bare name takes ``default_type`` when one is given."""
    from terrarium.model import ContextId  # here: --help needs no model

    if default_type is not None and ":" not in text:
        return ContextId(default_type, text)
    return ContextId.parse(text)


def generated_context(type_: str) -> ContextId:
    """A new session's name when none was given: ``type:`` UTC time and 4 random hex digits."""
    import datetime as dt
    import secrets

    from terrarium.model import ContextId

    now = dt.datetime.now(dt.UTC)
    return ContextId(type_, f"{now:%Y%m%d-%H%M%S}-{secrets.token_hex(2)}")


DEFAULT_TYPE = "cli"
"""The type of a session named without one (``main`` is ``cli:main``), as ``chat`` takes it."""


class ContextParam(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2
    """A context id ``type:name``, or a bare name of the default type (:func:`parse_context`)."""

    name = "type:name"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        from terrarium.model import ContextId  # here: --help needs no model

        if isinstance(value, ContextId):
            return value
        # InvalidContextId (not self.fail): the boundary prints it as one line.
        return parse_context(str(value), DEFAULT_TYPE)


CONTEXT = ContextParam()


class DateParam(click.ParamType):  # type: ignore[type-arg]  # generic from click 8.2
    """A date (a whole UTC day) or an ISO 8601 time, refused here with the option named."""

    name = "date"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        import datetime as dt

        text = str(value).strip()
        try:
            if len(text) == 10:
                dt.date.fromisoformat(text)
            else:
                dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError as exc:
            what = "date" if len(text) == 10 else "date or time"
            self.fail(
                f"{text!r} is not a {what}: {exc}; use a date or time such as 2026-11-01 or "
                "2026-11-01T12:00:00Z",
                param,
                ctx,
            )
        return text


DATE = DateParam()


@click.group(cls=GuardedGroup, context_settings={"help_option_names": ["-h", "--help"]})
@storage_option
@click.version_option(package_name=DISTRIBUTION, prog_name="terrarium")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Durable, forkable conversation sessions for LLM agents.

    Contexts are named type:name (cli:main, irc:#python). Every command accepts
    --storage-dir, before or after the command name.
    """
    state_of(ctx)
