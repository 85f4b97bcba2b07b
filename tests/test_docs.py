"""Every command, option and in-chat command has help text and is documented in docs/cli.md."""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from terrarium import FsStore, SegmentStartState, create_segment
from terrarium.cli import (
    cli,
    gateway,  # noqa: F401  # loaded lazily: load it so it is in cli.commands
    serve,  # noqa: F401  # loaded lazily: load it so it is in cli.commands
)
from terrarium.cli.chat import COMMANDS
from terrarium.cli.seed import seed_chat

DOCS = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
TEXT = DOCS.read_text(encoding="utf-8")


def section(command: str) -> str:
    """The text under ``### terrarium COMMAND``, up to the next heading of that level or above."""
    match = re.search(rf"^### terrarium {re.escape(command)}\n(.*?)(?=^##)", TEXT, re.M | re.S)
    assert match, f"docs/cli.md has no '### terrarium {command}' section"
    return match.group(1)


def options(command: click.Command) -> list[click.Option]:
    return [p for p in command.params if isinstance(p, click.Option) and p.name != "help"]


COMMAND_NAMES = sorted(cli.commands)


def test_the_group_has_help() -> None:
    assert cli.help and cli.help.strip()
    for option in options(cli):
        assert option.help, option.name


@pytest.mark.parametrize("name", COMMAND_NAMES)
def test_every_command_has_help_and_a_documented_section(name: str) -> None:
    command = cli.commands[name]
    assert command.help and command.help.strip(), f"terrarium {name} has no help text"
    assert command.get_short_help_str(), name
    text = section(name)
    for option in options(command):
        assert option.help and option.help.strip(), f"terrarium {name} {option.opts} has no help"
        if option.name == "storage_dir":
            continue  # documented once, for every command
        long = max(option.opts, key=len)
        assert long in text, f"docs/cli.md does not document terrarium {name} {long}"


def test_every_subcommand_has_help_and_its_options_are_documented() -> None:
    """A group's subcommands (``trash list``) are documented in the group's section."""
    for name in COMMAND_NAMES:
        group = cli.commands[name]
        if not isinstance(group, click.Group):
            continue
        text = section(name)
        for sub, command in group.commands.items():
            assert command.help and command.help.strip(), f"terrarium {name} {sub}: no help"
            assert f"terrarium {name} {sub}" in text, f"terrarium {name} {sub} is not documented"
            for option in options(command):
                assert option.help and option.help.strip(), (name, sub, option.opts)
                if option.name != "storage_dir":
                    assert max(option.opts, key=len) in text, (name, sub, option.opts)


def test_every_section_is_a_command() -> None:
    documented = set(re.findall(r"^### terrarium (\S+)$", TEXT, re.M))
    assert documented == set(COMMAND_NAMES)


def test_help_runs_for_every_command() -> None:
    runner = CliRunner()
    for name in ["", *COMMAND_NAMES]:
        args = [name, "--help"] if name else ["--help"]
        result = runner.invoke(cli, args)
        assert result.exit_code == 0, (name, result.output)
        assert "Usage:" in result.output


def test_storage_dir_and_environment_are_documented() -> None:
    for needle in (
        "--storage-dir",
        "TERRARIUM_STORAGE_DIR",
        "TERRARIUM_STORE",
        "TERRARIUM_BASE_URL",
        "TERRARIUM_MODEL",
    ):
        assert needle in TEXT


def test_in_chat_commands_and_keys_are_documented() -> None:
    chat = section("chat")
    for name, (args, help_text) in COMMANDS.items():
        assert help_text
        assert f"`/{name}" in chat, f"/{name} is not documented"
        if args:
            assert f"/{name} {args}" in chat
    for key in ("Esc then Enter", "Alt+Enter", "Ctrl-C", "Ctrl-D"):
        assert key in chat


def test_seed_chat_py_options_are_documented() -> None:
    assert seed_chat.help
    seed = TEXT[TEXT.index("## The seed's chat.py") :]
    for option in options(seed_chat):
        assert option.help, option.name
        assert max(option.opts, key=len) in seed


def test_json_fields_are_documented(tmp_path: Path) -> None:
    """Every key the --json outputs print appears in its command's section."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        create_segment(store, SegmentStartState(system_prompt="x"), context="cli:main")
    runner = CliRunner()

    def keys(*args: str) -> set[str]:
        result = runner.invoke(cli, [*args, "--json", "--storage-dir", str(root)])
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        found: set[str] = set()

        def walk(value: object) -> None:
            if isinstance(value, dict):
                for key, inner in value.items():
                    found.add(key)
                    if key != "by_type":  # its keys are the session types
                        walk(inner)
            elif isinstance(value, list):
                for inner in value:
                    walk(inner)

        walk(data)
        return found

    for command, args in (
        ("list", ["list"]),
        ("show", ["show", "cli:main", "--segments"]),
        ("stats", ["stats", "cli:main"]),
        ("stats", ["stats"]),
        ("fsck", ["fsck"]),
    ):
        text = section(command)
        for key in keys(*args):
            assert f"`{key}`" in text, f"terrarium {' '.join(args)} --json: {key} not documented"
