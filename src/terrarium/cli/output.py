"""Output helpers: Rich tables and colours on a terminal, plain lines everywhere else.

Rich would still draw boxes and wrap at 80 columns into a pipe; plain, space-aligned lines
keep piped output stable. Rich is imported only for a terminal (~40 ms, a third of a plain
``terrarium list``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cached_property
from typing import IO, TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from rich.console import Console


def may_be_terminal(stream: IO[str]) -> bool:
    """False when Rich would surely not treat ``stream`` as a terminal (no need to ask it)."""
    if "TTY_COMPATIBLE" in os.environ or "FORCE_COLOR" in os.environ:
        return True  # Rich's own overrides: let it decide
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


class Output:
    """Where a command writes: stdout for results, stderr for notes and errors."""

    @cached_property
    def console(self) -> Console:
        """Rich's console on stdout."""
        from rich.console import Console

        return Console(highlight=False, soft_wrap=True)

    @cached_property
    def err(self) -> Console:
        """Rich's console on stderr."""
        from rich.console import Console

        return Console(stderr=True, highlight=False, soft_wrap=True)

    @property
    def rich(self) -> bool:
        """True when stdout is a terminal (Rich tables and colours)."""
        return may_be_terminal(sys.stdout) and self.console.is_terminal

    @property
    def err_rich(self) -> bool:
        """True when stderr is a terminal."""
        return may_be_terminal(sys.stderr) and self.err.is_terminal

    def height(self) -> int:
        """Lines of the terminal stdout writes to (24 if it cannot be told)."""
        return self.console.size.height if self.rich else 24

    def line(self, text: str = "", style: str | None = None) -> None:
        """Print one line of plain text (never interpreted as markup)."""
        self._print(text, style or "", err=False)

    def note(self, text: str, style: str = "dim") -> None:
        """Print a note to stderr (status, confirmations), styled on a terminal."""
        self._print(text, style, err=True)

    def _print(self, text: str, style: str, *, err: bool) -> None:
        if self.err_rich if err else self.rich:
            from rich.text import Text

            (self.err if err else self.console).print(Text(text, style=style))
        else:
            click.echo(text, err=err)

    def error(self, text: str) -> None:
        """Print a one-line error to stderr."""
        self.note(f"error: {one_line(text)}", style="bold red")

    def write(self, text: str) -> None:
        """Write text as it is, without a newline, and flush (streamed replies)."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def json(self, data: Any) -> None:
        """Print ``data`` as indented JSON (UTF-8, keys in the order given)."""
        import json

        click.echo(json.dumps(data, indent=2, ensure_ascii=False))

    @contextmanager
    def progress(self, total: int, label: str) -> Iterator[Callable[[Any], None] | None]:
        """A progress callback drawing a bar on stderr when it is a terminal, else None."""
        if not self.err_rich or total < 2:
            yield None
            return
        with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
            yield lambda _item: bar.update(1)

    def table(
        self,
        columns: Sequence[str],
        rows: Sequence[Sequence[str]],
        *,
        title: str | None = None,
        justify: Mapping[str, str] | None = None,
    ) -> None:
        """A Rich table on a terminal; plain aligned columns otherwise."""
        justify = justify or {}
        if self.rich:
            from rich.table import Table
            from rich.text import Text

            table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
            for column in columns:
                table.add_column(column, justify=justify.get(column, "left"))  # type: ignore[arg-type]
            for row in rows:
                table.add_row(*(Text(cell) for cell in row))
            self.console.print(table)
            return
        lines = plain_table(columns, rows, justify)
        click.echo("\n".join([title, *lines] if title else lines))  # one write, not one a row


def plain_table(
    columns: Sequence[str], rows: Sequence[Sequence[str]], justify: Mapping[str, str]
) -> list[str]:
    """Columns separated by two spaces, each as wide as its widest cell; no trailing spaces."""
    table = [columns, *rows]
    widths = [max(map(len, cells)) for cells in zip(*table, strict=True)]
    pads = [
        (str.rjust if justify.get(column) == "right" else str.ljust, width)
        for column, width in zip(columns, widths, strict=True)
    ]
    return [
        "  ".join([pad(cell, width) for (pad, width), cell in zip(pads, row, strict=True)]).rstrip()
        for row in table
    ]


def error_text(exc: BaseException) -> str:
    """What ``exc`` tells a user: an OS error as ``{file}: {reason}``, without ``[Errno N]``."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror if exc.filename is None else f"{exc.filename}: {exc.strerror}"
    return str(exc)


def one_line(text: str) -> str:
    """Collapse a message onto one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def fail_if_damaged(out: Output, damaged: Sequence[tuple[str, str]], verb: str) -> None:
    """Warn of each session a command left out because its log is damaged (``verb``:
    ``exported``), one line naming the file and line, then end the command with exit 1 and
    one line naming ``terrarium fsck``. Nothing when ``damaged`` is empty."""
    if not damaged:
        return
    from terrarium.errors import CorruptLog

    for name, problem in damaged:
        out.note(f"warning: {name} not {verb}: {one_line(problem)}", style="yellow")
    count = plural(len(damaged), "damaged session")
    raise click.ClickException(f"{count} not {verb}; {CorruptLog.HINT}")


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """``1 message``, ``2 messages`` (``nouns`` for an irregular plural: ``1 entry``)."""
    return f"{count} {noun if count == 1 else (nouns or noun + 's')}"
