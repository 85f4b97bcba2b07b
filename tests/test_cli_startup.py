"""What the command line imports and creates, and how it behaves in pipes (issue 16).

The start-up and pipe behaviours run the command line as real processes: what a process
imports and how it dies on a closed pipe cannot be seen through click's in-process runner.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import terrarium
from terrarium import FsStore, SegmentStartState, create_segment, save_delta
from terrarium.cli import cli
from terrarium.cli.app import BROKEN_PIPE_EXIT
from terrarium.model import ContextId

#: Runs the command line, then prints on stderr the modules of interest it imported.
WRAPPER = """
import sys
from terrarium.cli import main
try:
    main()
finally:
    watched = ("openai", "terrarium.agent", "terrarium.llm", "asyncio", "rich", "uuid6",
               "terrarium.export", "hashlib")
    loaded = sorted({m.split(".")[0] if m.startswith(("openai", "rich")) else m
                     for m in sys.modules if m.startswith(watched)})
    print("LOADED", *loaded, file=sys.stderr)
"""


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TERRARIUM_STORAGE_DIR", "TERRARIUM_STORE", "TERRARIUM_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}


def add_context(root: Path, context: str, *contents: str) -> None:
    """Create ``context`` holding one user message per content, each answered."""
    with FsStore(root) as store:
        create_segment(store, SegmentStartState(system_prompt="Be brief."), context=context)
        head = store.get_head(ContextId.parse(context))
        assert head is not None
        for content in contents:
            items = [{"role": "user", "content": content}, {"role": "assistant", "content": "ok"}]
            save_delta(store, head, items)


@pytest.fixture
def seeded(tmp_path: Path) -> Path:
    root = tmp_path / "sessions"
    add_context(root, "cli:main", "hello there", "how are you?")
    add_context(root, "cli:big", "x" * 300_000)  # more than a pipe holds
    return root


def invoke(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def loaded_by(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    result = subprocess.run(
        [sys.executable, "-c", WRAPPER, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env(),
        timeout=60,
    )
    line = next(x for x in result.stderr.splitlines() if x.startswith("LOADED"))
    return result, set(line.split()[1:])


# --------------------------------------------------------------------------- start-up


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["list"],
        ["show", "cli:main"],
        ["search", "hello"],
        ["stats"],
        ["export", "cli:main", "-f", "jsonl"],
        ["fsck"],
        ["fork", "cli:main", "cli:copy"],
        ["clear", "cli:main"],
        ["rewind", "cli:main"],
        ["delete", "cli:main", "--yes"],
        ["reindex"],
        ["migrate", "--dry-run"],
        ["import", "{tmp}/main.jsonl", "--storage-dir", "{tmp}/other"],
        ["copy", "{root}", "sqlite:///{tmp}/copy.db"],
        ["--version"],
    ],
    ids=lambda args: args[0],
)
def test_commands_that_call_no_model_never_import_openai(seeded: Path, args: list[str]) -> None:
    """No manager, no model client, no openai: in a real process, as a user runs it."""
    tmp = seeded.parent
    assert (
        invoke(
            "export",
            "cli:main",
            "-f",
            "jsonl",
            "-o",
            f"{tmp}/main.jsonl",
            f"--storage-dir={seeded}",
        ).exit_code
        == 0
    )
    args = [a.format(tmp=tmp, root=seeded) for a in args]
    result, loaded = loaded_by(["--storage-dir", str(seeded), *args], tmp)  # the command's wins
    assert result.returncode == 0, result.stderr
    assert loaded.isdisjoint({"openai", "terrarium.agent", "terrarium.llm"}), loaded


def test_list_into_a_pipe_imports_neither_asyncio_nor_rich_nor_uuid6(seeded: Path) -> None:
    """The plain listing needs no event loop, no terminal library, mints no id and exports
    nothing (``export --format``'s names are read when asked: ``terrarium.export`` imports
    ``hashlib``, ~10 % of a bare interpreter's start)."""
    result, loaded = loaded_by(["list", "--storage-dir", str(seeded)], seeded.parent)
    assert result.returncode == 0 and "cli:main" in result.stdout
    assert loaded == set(), loaded


def test_import_terrarium_loads_only_the_name_table() -> None:
    code = (
        "import sys, terrarium\n"
        "print(sorted(m for m in sys.modules if m.startswith(('terrarium', 'uuid6', 'openai',"
        " 'msgspec', 'sqlite3', 'psycopg'))))\n"
        "terrarium.ContextId\n"
        "print('uuid6' in sys.modules)\n"
        "terrarium.new_session_id()\n"
        "print('uuid6' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env()
    ).stdout.splitlines()
    assert out == ["['terrarium', 'terrarium._lazy']", "False", "True"]


def test_the_namespace_holds_only_public_names() -> None:
    assert set(dir(terrarium)) == set(terrarium.__all__)
    for name in ("Any", "TYPE_CHECKING", "annotations", "attach"):
        assert name not in dir(terrarium)
        assert name not in vars(terrarium)
    assert terrarium.ContextId is terrarium.model.ContextId


def test_the_chat_command_is_listed_without_importing_it() -> None:
    """The group's --help shows chat's own summary, though chat.py is loaded only to run."""
    from terrarium.cli.chat import chat

    _module, summary = cli.lazy["chat"]
    assert summary == chat.get_short_help_str(limit=200)
    assert summary in invoke("--help").stdout
    assert "--system-prompt" in invoke("chat", "--help").stdout


def test_python_dash_m_terrarium(seeded: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "terrarium", "list", "--storage-dir", str(seeded)],
        capture_output=True,
        text=True,
        env=env(),
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "cli:main" in result.stdout and "cli:big" in result.stdout


# --------------------------------------------------------------------------- pipes


@pytest.mark.parametrize(
    "args",
    [
        ["list"],
        ["show", "cli:big"],
        ["search", "hello"],
        ["stats"],
        ["export", "cli:big"],
        ["--help"],
    ],
    ids=lambda args: args[0],
)
def test_a_closed_pipe_ends_the_command_quietly(seeded: Path, args: list[str]) -> None:
    """The reader is gone before the command writes: no message, no traceback, exit 141."""
    with subprocess.Popen(
        [sys.executable, "-m", "terrarium", *args, "--storage-dir", str(seeded)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env(),
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=60)
    assert err == ""
    assert code in (0, 1, BROKEN_PIPE_EXIT) if args == ["--help"] else code == BROKEN_PIPE_EXIT


def test_show_piped_into_head(seeded: Path) -> None:
    """``terrarium show cli:big | head -1``, with more output than the pipe holds."""
    script = (
        f'"{sys.executable}" -m terrarium show cli:big --storage-dir "{seeded}" | head -1; '
        'echo "status ${PIPESTATUS[0]}" >&2'
    )
    result = subprocess.run(
        ["bash", "-c", script], capture_output=True, text=True, env=env(), timeout=60
    )
    assert result.stdout.startswith("cli:big  2 messages")
    assert result.stderr == f"status {BROKEN_PIPE_EXIT}\n"


# --------------------------------------------------------------------------- no store


READERS = [
    ["list"],
    ["show", "cli:main"],
    ["search", "hello"],
    ["stats"],
    ["export", "cli:main"],
    ["fsck"],
    ["delete", "cli:main", "--yes"],
    ["fork", "cli:main", "cli:b"],
]


@pytest.mark.parametrize("args", READERS, ids=lambda args: args[0])
def test_readers_never_create_a_store(tmp_path: Path, args: list[str]) -> None:
    typo = tmp_path / "sesions"
    missing_db = tmp_path / "x.db"
    for location, shown in [
        (str(typo), str(typo)),
        (f"sqlite:///{tmp_path}/nonexistent/x.db", f"sqlite:///{tmp_path}/nonexistent/x.db"),
        (f"sqlite:///{missing_db}", f"sqlite:///{missing_db}"),
    ]:
        result = invoke(*args, "--storage-dir", location)
        assert result.exit_code == 1
        assert result.stderr == f"Error: no store at {shown}\n"
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("args", READERS, ids=lambda args: args[0])
def test_a_regular_file_is_not_a_store(tmp_path: Path, args: list[str]) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# hello\n")
    result = invoke(*args, "--storage-dir", str(readme))
    assert result.exit_code == 1
    assert result.stderr == f"Error: {readme} is not a sessions folder or store URL\n"
    assert readme.read_text() == "# hello\n"


def test_chat_py_listing_and_deleting_create_no_store(tmp_path: Path) -> None:
    """The seed's --list-sessions and --delete-session read: ./sessions is not created."""
    for args in (["--list-sessions"], ["--delete-session", "main", "--yes"]):
        result = subprocess.run(
            [sys.executable, str(Path(__file__).resolve().parents[1] / "chat.py"), *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env=env(),
            timeout=60,
        )
        assert result.returncode == 1
        assert result.stderr == "Error: no store at ./sessions\n"
    assert os.listdir(tmp_path) == []


def test_writers_create_the_store(tmp_path: Path, seeded: Path) -> None:
    exported = tmp_path / "main.jsonl"
    assert (
        invoke(
            "export", "cli:main", "-f", "jsonl", "-o", str(exported), "--storage-dir", str(seeded)
        ).exit_code
        == 0
    )
    new = tmp_path / "new"
    assert invoke("import", str(exported), "--storage-dir", str(new)).exit_code == 0
    assert "cli:main" in invoke("list", "--storage-dir", str(new)).stdout
    db = tmp_path / "copy.db"
    assert invoke("copy", str(seeded), f"sqlite:///{db}").exit_code == 0
    assert db.is_file()
    result = invoke("copy", str(tmp_path / "nosuch"), f"sqlite:///{db}")
    assert result.exit_code == 1 and "no store at" in result.stderr
    assert not (tmp_path / "nosuch").exists()


def test_a_postgres_database_that_does_not_exist_is_one_line() -> None:
    psycopg = pytest.importorskip("psycopg")
    try:
        psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", connect_timeout=1).close()
    except psycopg.OperationalError:
        pytest.skip("no PostgreSQL server at 127.0.0.1:5432")
    url = "postgresql://postgres@127.0.0.1:5432/terrarium_no_such_database"
    result = invoke("list", "--storage-dir", url)
    assert result.exit_code == 1
    assert len(result.stderr.strip().splitlines()) == 1
    assert "terrarium_no_such_database" in result.stderr


# --------------------------------------------------------------------------- list


def test_list_limit_and_the_rest(seeded: Path) -> None:
    everything = invoke("list", "--storage-dir", str(seeded))
    assert len(everything.stdout.splitlines()) == 3 and everything.stderr == ""
    one = invoke("list", "--limit", "1", "--storage-dir", str(seeded))
    assert len(one.stdout.splitlines()) == 2
    assert one.stderr == "1 more (--limit 0 shows all)\n"
    data = json.loads(invoke("list", "-n", "1", "--json", "--storage-dir", str(seeded)).stdout)
    assert len(data["contexts"]) == 1
    assert invoke("list", "-n", "0", "--storage-dir", str(seeded)).stdout == everything.stdout


def test_list_of_a_type_with_no_sessions(seeded: Path) -> None:
    result = invoke("list", "--type", "nosuch", "--storage-dir", str(seeded))
    assert result.exit_code == 0 and result.stdout == ""
    assert result.stderr == f"no sessions of type 'nosuch' in {seeded}\n"


def test_list_on_a_terminal_shows_a_screenful(tmp_path: Path) -> None:
    pexpect = pytest.importorskip("pexpect")
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        for i in range(30):
            create_segment(store, SegmentStartState(), context=f"cli:s{i:02d}")
    terminal = {**env(), "TERM": "xterm", "NO_COLOR": "1", "COLUMNS": "100", "LINES": "12"}
    child = pexpect.spawn(
        sys.executable,
        ["-m", "terrarium", "list", "--storage-dir", str(root)],
        env=terminal,
        dimensions=(12, 100),
        encoding="utf-8",
        timeout=30,
    )
    child.expect(r"(\d+) more \(--limit 0 shows all\)")
    shown = 30 - int(child.match.group(1))
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert shown == 12 - 5  # the height, less the header, its rule, the "more" line, a prompt


# --------------------------------------------------------------------------- wording


def test_counts_are_singular_or_plural(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    add_context(root, "cli:one")
    with FsStore(root) as store:
        head = store.get_head(ContextId.parse("cli:one"))
        assert head is not None
        save_delta(store, head, [{"role": "user", "content": "hi"}])
    assert invoke("show", "cli:one", "--storage-dir", str(root)).stdout.startswith(
        "cli:one  1 message, created"
    )
    stats = invoke("stats", "--storage-dir", str(root)).stdout
    assert stats.startswith("1 session (0 legacy), 1 message, 0 turns in")
    fork = invoke("fork", "cli:one", "cli:two", "--storage-dir", str(root))
    assert fork.stderr == "forked cli:one into cli:two (1 message)\n"
    fsck = invoke("fsck", "--storage-dir", str(root))
    assert "checked 2 sessions, 2 segments, 1 entry in" in fsck.stdout
    assert "0 problems" in fsck.stdout
    segment = next((root / "cli").glob("*/one/*.jsonl"))
    with segment.open("ab") as f:
        f.write(b'{"torn')
    fsck = invoke("fsck", "--storage-dir", str(root))
    assert ": 1 problem, 1 unresolved" in fsck.stdout
    assert fsck.stderr.strip().splitlines()[-1].startswith("Error: 1 problem found")


def test_errors_quote_the_session(tmp_path: Path, seeded: Path) -> None:
    where = f"--storage-dir={seeded}"
    assert invoke("show", "cli:nope", where).stderr == f"Error: no session 'cli:nope' in {seeded}\n"
    assert (
        invoke("stats", "cli:nope", where).stderr == f"Error: no session 'cli:nope' in {seeded}\n"
    )
    assert (
        invoke("clear", "cli:nope", where).stderr == f"Error: no session 'cli:nope' in {seeded}\n"
    )
    assert invoke("delete", "cli:nope", "--yes", where).stderr == (
        f"Error: no session 'cli:nope' in {seeded}\n"
    )
    assert invoke("fork", "cli:nope", "cli:x", where).stderr == (
        f"Error: no session 'cli:nope' in {seeded}\n"
    )
    assert invoke("fork", "cli:main", "cli:big", where).stderr == (
        "Error: session 'cli:big' already exists\n"
    )


@pytest.mark.parametrize("before", [True, False])
def test_importing_the_command_line_leaves_the_collector_as_it_was(before: bool) -> None:
    """The collector is off only while the command line's modules are imported."""
    code = (
        "import gc\n"
        f"gc.enable() if {before} else gc.disable()\n"
        "import terrarium.cli\n"
        "print(gc.isenabled())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env())
    assert out.stdout.strip() == str(before), out.stderr
