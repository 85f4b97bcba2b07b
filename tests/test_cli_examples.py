"""Every command's ``--help`` ends with an ``Examples:`` block of real invocations that parse."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from terrarium.cli import cli
from terrarium.cli.examples import EXAMPLES

with click.Context(cli) as _listing:
    NAMES = cli.list_commands(_listing)  # with those loaded on first use (chat)
    # A group's subcommands have their own examples, as "trash list".
    NAMES += [
        f"{name} {sub}"
        for name in list(NAMES)
        if isinstance(group := cli.get_command(_listing, name), click.Group)
        for sub in group.list_commands(_listing)
    ]

# Paths the examples name that must exist for click.Path(exists=True) to accept them.
EXISTING = ("old-sessions/", "main.jsonl", "backup.tar.gz")


@pytest.mark.parametrize("name", NAMES)
def test_help_ends_with_two_or_three_examples(name: str) -> None:
    result = CliRunner().invoke(cli, [*name.split(), "--help"])
    assert result.exit_code == 0, result.output
    lines = result.output.rstrip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.strip() == "Examples:")
    examples = [line.strip() for line in lines[start + 1 :]]
    assert 2 <= len(examples) <= 3, examples
    assert examples == list(EXAMPLES[name])


def test_every_example_names_its_command_and_is_a_real_command() -> None:
    assert set(EXAMPLES) == set(NAMES)
    for name, examples in EXAMPLES.items():
        for example in examples:
            argv = shlex.split(example.rsplit("|", 1)[-1])
            assert argv[: 1 + len(name.split())] == ["terrarium", *name.split()], example


@pytest.mark.parametrize(
    "example", [e for name in NAMES for e in EXAMPLES[name]], ids=lambda e: e[:60]
)
def test_every_example_parses(
    example: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each option and argument exists and its value converts (click's own parsing)."""
    monkeypatch.chdir(tmp_path)
    for path in EXISTING:
        if path.endswith("/"):
            (tmp_path / path).mkdir()
        else:
            (tmp_path / path).write_text("")
    argv = shlex.split(example.rsplit("|", 1)[-1])
    with click.Context(cli, info_name="terrarium") as parent:
        command = cli.get_command(parent, argv[1])
        assert command is not None, example
        args = argv[2:]
        if isinstance(command, click.Group):  # down to the subcommand
            parent = click.Context(command, info_name=argv[1], parent=parent)
            command = command.get_command(parent, args[0])
            assert command is not None, example
            ctx = command.make_context(args[0], args[1:], parent=parent)
        else:
            ctx = command.make_context(argv[1], args, parent=parent)
        assert ctx.args == []


def test_an_unknown_flag_in_an_example_would_fail() -> None:
    """The parse above is strict: a misspelt option is refused."""
    with click.Context(cli, info_name="terrarium") as parent, pytest.raises(click.NoSuchOption):
        cli.commands["show"].make_context("show", ["cli:main", "--lats", "3"], parent=parent)
