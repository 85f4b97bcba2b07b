"""Output helpers: Rich tables and colours on a terminal, plain lines everywhere else.

Rich already drops ANSI codes when stdout is not a terminal (and honours ``NO_COLOR``), but it
still draws table boxes and wraps long lines at 80 columns. When stdout is not a terminal the
helpers here print plain, unwrapped, space-aligned lines instead, so output piped into ``grep``,
``cut`` or a file is stable.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text


class Output:
    """Where a command writes: stdout for results, stderr for notes and errors."""

    def __init__(self) -> None:
        self.console = Console(highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, highlight=False, soft_wrap=True)

    @property
    def rich(self) -> bool:
        """True when stdout is a terminal (Rich tables and colours)."""
        return self.console.is_terminal

    def line(self, text: str = "", style: str | None = None) -> None:
        """Print one line of plain text (never interpreted as markup)."""
        if self.rich:
            self.console.print(Text(text, style=style or ""))
        else:
            click.echo(text)

    def note(self, text: str, style: str = "dim") -> None:
        """Print a note to stderr (status, confirmations), styled on a terminal."""
        if self.err.is_terminal:
            self.err.print(Text(text, style=style))
        else:
            click.echo(text, err=True)

    def error(self, text: str) -> None:
        """Print a one-line error to stderr."""
        self.note(f"error: {one_line(text)}", style="bold red")

    def write(self, text: str) -> None:
        """Write text as it is, without a newline, and flush (streamed replies)."""
        sys.stdout.write(text)
        sys.stdout.flush()

    def json(self, data: Any) -> None:
        """Print ``data`` as indented JSON (UTF-8, keys in the order given)."""
        click.echo(json.dumps(data, indent=2, ensure_ascii=False))

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
            table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
            for column in columns:
                table.add_column(column, justify=justify.get(column, "left"))  # type: ignore[arg-type]
            for row in rows:
                table.add_row(*(Text(cell) for cell in row))
            self.console.print(table)
            return
        if title:
            click.echo(title)
        for line in plain_table(columns, rows, justify):
            click.echo(line)


def plain_table(
    columns: Sequence[str], rows: Sequence[Sequence[str]], justify: Mapping[str, str]
) -> list[str]:
    """Columns separated by two spaces, each as wide as its widest cell; no trailing spaces."""
    widths = [len(c) for c in columns]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in [list(columns), *rows]:
        cells = []
        for i, cell in enumerate(row):
            right = justify.get(columns[i]) == "right"
            cells.append(cell.rjust(widths[i]) if right else cell.ljust(widths[i]))
        lines.append("  ".join(cells).rstrip())
    return lines


def counted(count: int, noun: str) -> str:
    """``1 session``, ``2 sessions`` (nouns that take an s)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def one_line(text: str) -> str:
    """Collapse a message onto one line."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def short_time(ts: str | None) -> str:
    """``2025-11-06T14:35:12.98Z`` -> ``2025-11-06 14:35`` (as stored, no time zone maths)."""
    if not ts:
        return "-"
    return ts[:16].replace("T", " ")
