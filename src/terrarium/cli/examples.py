"""The ``Examples:`` block that ends every command's ``--help`` (as llm's commands do).

``tests/test_cli_examples.py`` parses every example against its command's options.
"""

from __future__ import annotations

EXAMPLES: dict[str, tuple[str, ...]] = {
    "chat": (
        "terrarium chat cli:demo",
        "terrarium chat -p 'Summarise our plan in one line'",
        "cat question.txt | terrarium chat -c -p -",
    ),
    "list": (
        "terrarium list",
        "terrarium list --type irc",
        "terrarium list --all --json --storage-dir sqlite:///sessions.db",
    ),
    "show": (
        "terrarium show cli:main",
        "terrarium show 'irc:#python' -n 10",
        "terrarium show cli:main --json --segments",
    ),
    "stats": ("terrarium stats", "terrarium stats cli:main --json"),
    "search": (
        "terrarium search decorator",
        "terrarium search 'connection refused' --type irc --since 2025-11-01 -n 5",
        "terrarium search decorator --archived --all-branches --json",
    ),
    "delete": ("terrarium delete cli:scratch", "terrarium delete cli:scratch --purge --yes"),
    "archive": (
        "terrarium archive --older-than 30d --dry-run",
        "terrarium archive --older-than 2w --type irc --json",
        "terrarium archive cli:old-project 'irc:#python'",
    ),
    "unarchive": (
        "terrarium unarchive cli:old-project",
        "terrarium unarchive 'irc:#python' --storage-dir sqlite:///sessions.db",
    ),
    "trash": (
        "terrarium trash list",
        "terrarium trash restore cli:scratch --as cli:scratch-2",
        "terrarium trash purge --older-than 30d --yes",
    ),
    "trash list": ("terrarium trash list", "terrarium trash list --json"),
    "trash restore": (
        "terrarium trash restore cli:scratch",
        "terrarium trash restore cli:scratch --as cli:scratch-2",
    ),
    "trash purge": (
        "terrarium trash purge --older-than 30d --dry-run",
        "terrarium trash purge cli:scratch --yes",
    ),
    "pin": (
        "terrarium pin cli:main",
        "terrarium pin 'irc:#python' --storage-dir sqlite:///sessions.db",
    ),
    "unpin": (
        "terrarium unpin cli:main",
        "terrarium unpin 'irc:#python' --storage-dir sqlite:///sessions.db",
    ),
    "maintain": (
        "terrarium maintain --dry-run",
        "terrarium maintain --json --storage-dir sqlite:///sessions.db",
    ),
    "clear": ("terrarium clear cli:main", "terrarium clear 'irc:#python' --storage-dir ./sessions"),
    "rewind": (
        "terrarium rewind cli:main",
        "terrarium rewind cli:main -n 3 --storage-dir sqlite:///sessions.db",
    ),
    "fork": ("terrarium fork cli:main cli:experiment", "terrarium fork cli:main cli:retry --at 12"),
    "compact": (
        "terrarium compact cli:main",
        "terrarium compact cli:main --base-url http://localhost:8000/v1 --model qwen",
    ),
    "export": (
        "terrarium export cli:main -f md -o main.md",
        "terrarium export --all -f jsonl -o backup.tar.gz",
        "terrarium export --all --type irc --since 2025-11-01 -f html -o irc/",
    ),
    "import": (
        "terrarium import old-sessions/",
        "terrarium import main.jsonl --as cli:restored",
        "terrarium import backup.tar.gz -v --storage-dir sqlite:///sessions.db",
    ),
    "copy": (
        "terrarium copy ./sessions sqlite:///sessions.db",
        "terrarium copy ./sessions postgresql://localhost/terrarium -c cli:main -v",
    ),
    "migrate": ("terrarium migrate --dry-run", "terrarium migrate --to-log"),
    "fsck": ("terrarium fsck", "terrarium fsck --repair --json"),
    "serve": (
        "terrarium serve --open",
        "terrarium serve --host 0.0.0.0 --token s3cret",
        "terrarium serve --allow-writes --base-url http://gpu-box:8000/v1 --model qwen",
    ),
    "gateway": (
        "terrarium gateway --upstream http://localhost:8000/v1",
        "terrarium gateway --upstream http://gpu-box:8000/v1 --storage-dir sqlite:///chats.db",
        "terrarium gateway --upstream http://localhost:8000/v1 --host 0.0.0.0 --token s3cret",
    ),
    "reindex": ("terrarium reindex", "terrarium reindex --storage-dir sqlite:///sessions.db"),
}
"""Two or three invocations per command, by command name (a group's subcommand as
``"trash list"``)."""


def epilog(name: str) -> str | None:
    """The end of command ``name``'s ``--help``: its examples, or None if it has none."""
    lines = EXAMPLES.get(name)
    if not lines:
        return None
    # \b keeps click from re-wrapping the lines into one paragraph.
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)
