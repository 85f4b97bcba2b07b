"""Private data stays private: every file terrarium creates is ``0600``, every folder ``0700``.

One broad workload through the command line, run under the umask a user has (``0o022``),
then a walk of every file and folder it created: stores of each local kind, their indexes,
exports, bundles, copies, migrated files and what ``chat``'s ``/export`` writes.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from click.testing import CliRunner

from fakeserver import FakeServer
from helpers.gateway import GatewayProcess
from terrarium.cli import cli

MODEL = "fake-model"  # the fake server's

LEGACY = {
    "session_id": "old",
    "context_type": "cli",
    "messages": [{"role": "user", "content": "a secret", "timestamp": "2025-11-06T14:30:00"}],
    "metadata": {"created_at": "2025-11-06T14:30:00", "last_active": "2025-11-06T14:35:00"},
}


@pytest.fixture
def user_umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _not_private(base: Path, created: list[Path]) -> list[str]:
    """Each of ``created`` whose mode is not 0600 (a file) or 0700 (a folder), with its mode."""
    wrong = []
    for path in created:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink() or (path.suffix == ".jsonl" and mode == 0o400):
            continue  # a link's mode is not its own; a sealed (deleted, archived) log is 0400
        if mode != (0o700 if path.is_dir() else 0o600):
            wrong.append(f"{path.relative_to(base)} {oct(mode)}")
    return wrong


def _run(*args: str, input: str | None = None) -> None:
    result = CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)
    assert result.exit_code == 0, (args, result.output)


def _workload(tmp_path: Path, base_url: str) -> None:
    """Chat, change, search, archive, delete, export, bundle, import, copy and migrate."""
    fs = ["--storage-dir", str(tmp_path / "sessions")]
    chat = "a walrus secret\n/fork side\nmore\n/export markdown chat.md\n/export jsonl\n"
    _run("chat", "cli:main", "--base-url", base_url, *fs, input=chat)
    _run("chat", "irc:#x", "--base-url", base_url, *fs, input="gone soon\n")
    _run("chat", "cli:old", "--base-url", base_url, *fs, input="old\n")
    for args in (
        ["search", "walrus"],
        ["list"],
        ["stats"],
        ["pin", "cli:main"],
        ["archive", "cli:old"],
        ["delete", "irc:#x", "--yes"],
        ["rewind", "cli:side"],
        ["reindex"],
        ["fsck"],
        ["maintain"],
        ["export", "cli:main", "-o", "one.md"],
        ["export", "cli:main", "-f", "jsonl", "-o", "one.jsonl"],
        ["export", "--all", "-o", "all/"],
        ["export", "--all", "-o", "deep/er/all.zip"],
        ["export", "--all", "-f", "jsonl", "-o", "bundle.tar.gz"],
    ):
        _run(*args, *fs)
    _run("import", "bundle.tar.gz", "--storage-dir", str(tmp_path / "imported"))
    _run("copy", str(tmp_path / "sessions"), f"sqlite:///{tmp_path}/new/copy.db")
    _run("copy", str(tmp_path / "sessions"), str(tmp_path / "copied"))
    sql = ["--storage-dir", f"sqlite:///{tmp_path}/new/copy.db"]
    for args in (["search", "walrus"], ["delete", "cli:side", "--yes"], ["maintain"]):
        _run(*args, *sql)
    _run("migrate", "--to-log", "--from", str(tmp_path / "legacy"), *fs)


def test_every_file_and_folder_the_cli_creates_is_private(
    tmp_path: Path, fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch, user_umask: None
) -> None:
    """Under umask 022, each file a broad command-line workload creates (store files, indexes,
    exports the user names, bundles, copies, migrated files) is 0600 and each folder 0700."""
    monkeypatch.chdir(tmp_path)
    for name in ("TERRARIUM_STORAGE_DIR", "TERRARIUM_STORE", "TERRARIUM_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    config = Path(os.environ["XDG_CONFIG_HOME"]) / "terrarium"
    config.mkdir(parents=True)
    policy = '[retention]\narchive_after = "1h"\npurge_trash_after = "1h"\n'
    (config / "config.toml").write_text(policy)
    legacy = tmp_path / "legacy"
    legacy.mkdir(mode=0o700)
    (legacy / "cli_old.json").write_text(json.dumps(LEGACY))
    (legacy / "cli_old.json").chmod(0o600)
    before = {legacy, legacy / "cli_old.json"}
    _workload(tmp_path, fake_server.base_url)
    created = [p for p in tmp_path.rglob("*") if p not in before]
    assert {"chat.md", "one.md", "bundle.tar.gz", "copy.db"} <= {p.name for p in created}
    assert _not_private(tmp_path, created) == []


@pytest.mark.parametrize("kind", ["fs", "sqlite"])
def test_every_file_and_folder_the_gateway_creates_is_private(
    tmp_path: Path, fake_server: FakeServer, user_umask: None, kind: str
) -> None:
    """Under umask 022, the store a gateway process keeps its conversations in (a folder, or a
    SQLite file in a new folder), with its indexes, holds only 0600 files and 0700 folders."""
    storage = f"sqlite:///{tmp_path}/new/gateway.db" if kind == "sqlite" else tmp_path / "store"
    with GatewayProcess(storage, fake_server.base_url) as gw:
        with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as client:
            first = client.responses.create(model=MODEL, input="a secret")
            client.responses.create(model=MODEL, input="more", previous_response_id=first.id)
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "another secret"}]
            )
    created = list(tmp_path.rglob("*"))
    assert created
    assert _not_private(tmp_path, created) == []
