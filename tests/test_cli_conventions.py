"""What users of llm, Claude Code and Codex expect of the command line (issue 16): one-shot
prompts (``chat -p``), ``chat --last``, the resume hint, ``show -n``, format aliases, and
``copy``/``import`` summaries. The chat behaviours run against the fake model server, in
this process through click's runner (stdin and stdout are then not terminals, as with pipes);
a one-shot prompt also runs the console module in a real subprocess with real pipes.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fakeserver import FakeServer
from terrarium import (
    FsStore,
    PodActiveSegmentRef,
    SegmentStartState,
    create_segment,
    restore,
    save_delta,
)
from terrarium.cli import cli
from terrarium.model import ContextId

TERRARIUM = [sys.executable, "-m", "terrarium.cli"]


def run_process(
    *args: str, stdin: str | bytes = "", cwd: Path, **env: str
) -> subprocess.CompletedProcess[bytes]:
    """``terrarium ARGS`` in a subprocess, stdin and stdout pipes, no TERRARIUM_* variables
    but those given."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    full_env.update(env)
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run(
        [*TERRARIUM, *args], input=data, capture_output=True, cwd=cwd, env=full_env, timeout=60
    )


def run(
    *args: str, stdin: str | bytes = "", cwd: Path, **env: str
) -> subprocess.CompletedProcess[bytes]:
    """``terrarium ARGS`` as :func:`run_process` runs it, in this process (click's runner, in
    ``cwd``): what the command prints and exits with, without an interpreter's start-up."""
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("TERRARIUM_")}
    data = stdin.encode() if isinstance(stdin, str) else stdin
    here = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(cli, list(args), input=data, env={**unset, **env})
    finally:
        os.chdir(here)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return subprocess.CompletedProcess(
        [*TERRARIUM, *args], result.exit_code, result.stdout_bytes, result.stderr_bytes
    )


def invoke(*args: str, input: str | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def add_context(root: Path, context: str, turns: list[tuple[str, str]]) -> None:
    with FsStore(root) as store:
        create_segment(store, SegmentStartState(), context=context)
    for user, assistant in turns:
        add_turn(root, context, user, assistant)


def add_turn(root: Path, context: str, user: str, assistant: str) -> None:
    with FsStore(root) as store:
        head = store.get_head(ContextId.parse(context))
        assert head is not None
        save_delta(
            store,
            head,
            [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}],
        )


def history(root: Path, context: str) -> list[str]:
    with FsStore(root) as store:
        return [str(m["content"]) for m in restore(store, context).history]


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TERRARIUM_STORAGE_DIR", "TERRARIUM_STORE", "TERRARIUM_BASE_URL"):
        monkeypatch.delenv(name, raising=False)


# --------------------------------------------------------------------------- chat -p


def test_prompt_sends_one_turn_prints_the_reply_and_a_resume_hint(
    tmp_path: Path, fake_server: FakeServer
) -> None:
    url = fake_server.base_url
    result = run_process(
        "chat", "cli:demo", "-p", "what is up?", cwd=tmp_path, TERRARIUM_BASE_URL=url
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"echo: what is up?\n"  # the reply only
    assert result.stderr == b"resume with: terrarium chat cli:demo\n"
    assert history(tmp_path / "sessions", "cli:demo") == ["what is up?", "echo: what is up?"]


def test_prompt_without_a_session_starts_a_new_one_and_last_continues_it(
    tmp_path: Path, fake_server: FakeServer
) -> None:
    """``chat -p`` with no session named starts a new one each time, named ``cli:`` and a
    time-ordered id, and says on stderr how to resume it; ``--last`` (``-c``) continues the
    one active last, of ``--type`` when given."""
    url, root = fake_server.base_url, tmp_path / "sessions"
    made = []
    for text in ("hello", "again"):
        result = run("chat", "--prompt", text, cwd=tmp_path, TERRARIUM_BASE_URL=url)
        assert result.returncode == 0 and result.stdout == f"echo: {text}\n".encode()
        hint = result.stderr.decode()
        assert re.fullmatch(r"resume with: terrarium chat cli:\d{8}-\d{6}-[0-9a-f]{4}\n", hint)
        made.append(hint.split()[-1])
    assert made[0] != made[1] and made[0][:19] <= made[1][:19]  # time-ordered
    assert [history(root, c) for c in made] == [["hello", "echo: hello"], ["again", "echo: again"]]
    with FsStore(root) as store:
        assert sorted(str(h.context) for h in store.list_contexts()) == sorted(made)

    result = run("chat", "-c", "-p", "more", cwd=tmp_path, TERRARIUM_BASE_URL=url)
    assert result.returncode == 0, result.stderr
    assert history(root, made[1])[-2:] == ["more", "echo: more"]
    irc = run("chat", "--type", "irc", "-p", "in irc", cwd=tmp_path, TERRARIUM_BASE_URL=url)
    assert irc.stderr.decode().startswith("resume with: terrarium chat irc:")
    add_turn(root, made[0], "newest", "echo: newest")  # cli is now active last
    result = run("chat", "--last", "--type", "irc", "-p", "irc again", cwd=tmp_path,
                 TERRARIUM_BASE_URL=url)  # fmt: skip
    assert result.returncode == 0, result.stderr
    irc_name = irc.stderr.decode().split()[-1]
    assert result.stderr.decode() == f"resume with: terrarium chat {irc_name}\n"
    assert history(root, irc_name)[-2:] == ["irc again", "echo: irc again"]
    none = run("chat", "--last", "--type", "game", "-p", "x", cwd=tmp_path)
    assert none.returncode == 1
    assert none.stderr == b"Error: no session of type 'game' to continue in ./sessions\n"


def test_prompt_dash_sends_all_of_stdin_as_one_turn(
    tmp_path: Path, fake_server: FakeServer
) -> None:
    """``cat question.txt | terrarium chat cli:x -p -`` is one message, lines kept; without -p
    the same input is one message per line."""
    question = "first line\n\n  indented second line\nthird\n"
    url = fake_server.base_url
    result = run("chat", "cli:x", "-p", "-", stdin=question, cwd=tmp_path, TERRARIUM_BASE_URL=url)
    assert result.returncode == 0, result.stderr
    sent = "first line\n\n  indented second line\nthird"  # the final newline is not sent
    assert result.stdout == f"echo: {sent}\n".encode()
    assert len(fake_server.requests) == 1
    assert fake_server.last_request["messages"] == [{"role": "user", "content": sent}]
    result = run("chat", "cli:y", stdin=question, cwd=tmp_path, TERRARIUM_BASE_URL=url)
    assert result.returncode == 0
    assert len(fake_server.requests) == 4  # three non-empty lines, three turns
    assert history(tmp_path / "sessions", "cli:y")[::2] == [
        "first line",
        "  indented second line",
        "third",
    ]


def test_prompt_with_piped_stdin_sends_both_as_one_message(
    tmp_path: Path, fake_server: FakeServer
) -> None:
    """``printf 'file' | terrarium chat cli:x -p "summarise this"``: the prompt, a blank line,
    then stdin, as one message; empty stdin adds nothing; stdin that is not UTF-8 sends
    nothing."""
    url = fake_server.base_url
    result = run("chat", "cli:x", "-p", "summarise this", stdin="line one\nline two\n",
                 cwd=tmp_path, TERRARIUM_BASE_URL=url)  # fmt: skip
    assert result.returncode == 0, result.stderr
    sent = "summarise this\n\nline one\nline two"
    assert fake_server.last_request["messages"] == [{"role": "user", "content": sent}]
    assert result.stdout == f"echo: {sent}\n".encode()
    result = run("chat", "cli:y", "-p", "just this", stdin="", cwd=tmp_path,
                 TERRARIUM_BASE_URL=url)  # fmt: skip
    assert fake_server.last_request["messages"] == [{"role": "user", "content": "just this"}]
    bad = run("chat", "cli:z", "-p", "summarise", stdin=b"caf\xe9\n", cwd=tmp_path,
              TERRARIUM_BASE_URL=url)  # fmt: skip
    assert bad.returncode == 1 and b"not valid UTF-8: byte 0xe9 at offset 3" in bad.stderr
    assert len(fake_server.requests) == 2  # nothing sent


def test_prompt_json_prints_one_object(tmp_path: Path, fake_server: FakeServer) -> None:
    """``chat -p --json``: stdout is one JSON object (the reply, the session, the finish
    reason, the model and the usage), the resume hint on stderr; --json alone is refused."""
    url = fake_server.base_url
    result = run("chat", "-p", "hi", "--json", cwd=tmp_path, TERRARIUM_BASE_URL=url)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    sent = fake_server.last_request["messages"]  # the fake counts characters // 4 + 1 each
    assert data == {
        "context_id": data["context_id"],
        "reply": "echo: hi",
        "finish_reason": "stop",
        "model": "fake-model",
        "usage": {
            "prompt_tokens": len(sent[0]["content"]) // 4 + 1,
            "completion_tokens": len("echo: hi") // 4 + 1,
            "cached_tokens": 0,
            "estimated": None,
        },
    }
    assert data["context_id"].startswith("cli:")
    assert result.stderr.decode() == f"resume with: terrarium chat {data['context_id']}\n"
    fake_server.fail_next(503)
    failed = run("chat", data["context_id"], "-p", "again", "--json", "--retries", "0",
                 cwd=tmp_path, TERRARIUM_BASE_URL=url)  # fmt: skip
    assert failed.returncode == 1 and failed.stdout == b""
    retried = run("chat", "-c", "--retry", "--json", cwd=tmp_path, TERRARIUM_BASE_URL=url)
    assert retried.returncode == 0, retried.stderr
    assert json.loads(retried.stdout)["reply"] == "echo: again"
    alone = run("chat", "cli:x", "--json", cwd=tmp_path)
    assert alone.returncode == 2 and b"--json prints the reply of -p or --retry" in alone.stderr


def test_prompt_failure_is_one_line_and_keeps_the_input(tmp_path: Path) -> None:
    """In a session that exists the failed message is kept (marked failed); a new session's
    unanswered first message leaves nothing (tests/test_cli.py has more)."""
    add_context(tmp_path / "sessions", "cli:x", [("hi", "hello")])
    result = run(
        "chat", "cli:x", "-p", "are you there?", "--retries", "0",
        cwd=tmp_path, TERRARIUM_BASE_URL="http://127.0.0.1:9/v1",
    )  # fmt: skip
    assert result.returncode == 1
    assert result.stdout == b""
    lines = result.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "http://127.0.0.1:9/v1" in lines[0]  # no resume hint either
    stats = json.loads(run("stats", "cli:x", "--json", cwd=tmp_path).stdout)
    assert stats["message_count"] == 3 and stats["last_run"] == "errored"


def test_prompt_refuses_empty_or_undecodable_input(tmp_path: Path) -> None:
    empty = run("chat", "-p", "-", stdin="\n", cwd=tmp_path)
    assert empty.returncode == 2 and b"the prompt is empty" in empty.stderr
    bad = run("chat", "cli:x", "-p", "-", stdin=b"caf\xe9\n", cwd=tmp_path)
    assert bad.returncode == 1
    assert b"not valid UTF-8: byte 0xe9 at offset 3" in bad.stderr
    assert not (tmp_path / "sessions").exists()  # nothing sent, nothing logged


# --------------------------------------------------------------------------- chat --last


def test_last_continues_the_most_recently_active_session(
    tmp_path: Path, fake_server: FakeServer
) -> None:
    root = tmp_path / "sessions"
    add_context(root, "irc:#python", [("old", "older")])
    add_context(root, "cli:main", [("hi", "hello")])
    add_context(root, "game:run1", [("go", "went")])  # newest, and not of the default type
    url = fake_server.base_url
    result = run("chat", "--last", "-p", "and now?", cwd=tmp_path, TERRARIUM_BASE_URL=url)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"echo: and now?\n"
    assert history(root, "game:run1") == ["go", "went", "and now?", "echo: and now?"]
    # a turn makes cli:main the last active; piped input continues it
    add_turn(root, "cli:main", "me again", "echo: me again")
    result = run("chat", "--last", stdin="piped\n", cwd=tmp_path, TERRARIUM_BASE_URL=url)
    assert result.returncode == 0 and history(root, "cli:main")[-2:] == ["piped", "echo: piped"]
    assert result.stderr == b"resume with: terrarium chat cli:main\n"


def test_last_on_an_empty_store_fails_and_conflicts_with_a_name(tmp_path: Path) -> None:
    empty = run("chat", "--last", "-p", "hi", cwd=tmp_path)
    assert empty.returncode == 1
    assert empty.stderr == b"Error: no session to continue in ./sessions\n"
    both = invoke("chat", "cli:x", "--last", "--storage-dir", str(tmp_path / "s"), input="")
    assert both.exit_code == 2 and "--last" in both.stderr


# --------------------------------------------------------------------------- resume hint


def test_resume_hint_quotes_for_the_shell_and_names_a_non_default_store(
    tmp_path: Path, fake_server: FakeServer
) -> None:
    url = fake_server.base_url
    store = tmp_path / "my sessions"
    result = run(
        "chat", "irc:#python", "-p", "hi", "--storage-dir", str(store),
        cwd=tmp_path, TERRARIUM_BASE_URL=url,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.decode() == (
        f"resume with: terrarium chat 'irc:#python' --storage-dir '{store}'\n"
    )
    # a store named by the environment is implied: the same command finds it again
    result = run(
        "chat", "cli:env", "-p", "hi", cwd=tmp_path, TERRARIUM_BASE_URL=url,
        TERRARIUM_STORAGE_DIR=str(store),
    )  # fmt: skip
    assert result.stderr == b"resume with: terrarium chat cli:env\n"
    # a chat that sent nothing leaves no session, so no hint
    result = run("chat", "cli:nothing", stdin="/help\n", cwd=tmp_path, TERRARIUM_BASE_URL=url)
    assert result.returncode == 0 and result.stderr == b""


# --------------------------------------------------------------------------- show -n


def test_show_last_n_messages(tmp_path: Path) -> None:
    root = tmp_path / "s"
    add_context(root, "cli:main", [("q1", "a1"), ("q2", "a2"), ("q3", "a3")])
    text = invoke("show", "cli:main", "-n", "3", "--storage-dir", str(root)).stdout
    assert "cli:main  6 messages" in text and "(3 earlier messages not shown)" in text
    assert "q1" not in text and "a2" in text and "q3" in text and "a3" in text
    one = invoke("show", "cli:main", "--last", "5", "--storage-dir", str(root)).stdout
    assert "(1 earlier message not shown)" in one and "q1" not in one and "a1" in one
    data = json.loads(
        invoke("show", "cli:main", "-n", "2", "--json", "--storage-dir", str(root)).stdout
    )
    assert data["message_count"] == 6
    assert [m["content"] for m in data["messages"]] == ["q3", "a3"]
    everything = invoke("show", "cli:main", "-n", "10", "--storage-dir", str(root)).stdout
    assert "earlier" not in everything and "q1" in everything
    assert invoke("show", "cli:main", "-n", "-1", "--storage-dir", str(root)).exit_code == 2


# --------------------------------------------------------------------------- format aliases


def test_format_aliases_on_export_and_in_chat(tmp_path: Path, fake_server: FakeServer) -> None:
    root = tmp_path / "s"
    add_context(root, "cli:main", [("hi", "hello")])
    markdown = invoke("export", "cli:main", "-f", "markdown", "--storage-dir", str(root)).stdout
    for alias in ("md", "MD", "txt", "text"):
        result = invoke("export", "cli:main", "-f", alias, "--storage-dir", str(root))
        assert result.exit_code == 0 and result.stdout == markdown, alias
    jsonl = invoke("export", "cli:main", "-f", "ndjson", "--storage-dir", str(root)).stdout
    assert json.loads(jsonl.splitlines()[0])["kind"] == "header"
    ambiguous = invoke("export", "cli:main", "-f", "json", "--storage-dir", str(root))
    assert ambiguous.exit_code == 2
    assert "'json' is ambiguous: use openai or terrarium-json" in ambiguous.stderr
    unknown = invoke("export", "cli:main", "-f", "docx", "--storage-dir", str(root))
    assert unknown.exit_code == 2 and "md (markdown)" in unknown.stderr
    # inside the chat: /export md writes TYPE_NAME.md
    result = run(
        "chat", "cli:main", "--storage-dir", str(root), stdin="/export md\n/export txt -\n",
        cwd=tmp_path, TERRARIUM_BASE_URL=fake_server.base_url,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "cli_main.md").read_text() == markdown
    assert result.stdout.decode() == markdown


# --------------------------------------------------------------------------- import summaries


def test_import_prints_one_summary_line_and_a_rerun_says_it_skipped_everything(
    tmp_path: Path,
) -> None:
    source = tmp_path / "src"
    for name in ("a", "b", "c"):
        add_context(source, f"cli:{name}", [("hi", "hello")])
    folder = tmp_path / "exports"
    folder.mkdir()
    for name in ("a", "b", "c"):
        invoke("export", f"cli:{name}", "-f", "jsonl", "-o", str(folder / f"{name}.jsonl"),
               "--storage-dir", str(source))  # fmt: skip
    target = tmp_path / "target"
    files = [str(folder / f"{n}.jsonl") for n in ("a", "b")]
    first = invoke("import", *files, "--storage-dir", str(target))
    assert first.exit_code == 0, first.output
    assert first.stderr == f"imported 2 sessions into {target}\n"
    again = invoke("import", *files, "--storage-dir", str(target))
    assert again.exit_code == 0
    assert again.stderr == f"nothing to import: 2 sessions already in {target}\n"
    verbose = invoke("import", *files, str(folder / "c.jsonl"), "-v", "--storage-dir", str(target))
    assert verbose.exit_code == 0
    lines = verbose.stderr.splitlines()
    assert lines[0].startswith(f"skipped {files[0]}: ") and "already exists" in lines[0]
    assert lines[2] == f"imported cli:c (2 messages) from {folder / 'c.jsonl'}"
    assert lines[3] == f"imported 1 session into {target}; 2 already there"
    assert len(lines) == 4


# --------------------------------------------------------------------------- issue 26, item 10


def test_search_with_no_hit_exits_1_as_grep_does(tmp_path: Path) -> None:
    root = tmp_path / "s"
    add_context(root, "cli:main", [("parsing dates", "use fromisoformat")])
    found = invoke("search", "dates", "--storage-dir", str(root))
    assert found.exit_code == 0 and "cli:main" in found.stdout
    for extra in ([], ["--json"]):
        none = invoke("search", "zebra", *extra, "--storage-dir", str(root))
        assert none.exit_code == 1, none.output
    assert json.loads(invoke("search", "zebra", "--json", "--storage-dir", str(root)).stdout) == {
        "query": "zebra",
        "hits": [],
    }


@pytest.mark.parametrize(
    ("args", "option", "value", "why"),
    [
        (["search", "x", "--since", "2026-13-45"], "--since", "2026-13-45", "month must be"),
        (["export", "--all", "-o", "out", "--since", "2026-13-45"], "--since", "2026-13-45",
         "month"),
        (["export", "--all", "-o", "out", "--until", "2026-11-01T25:00"], "--until",
         "2026-11-01T25:00", "hour must be"),
        (["search", "x", "--since", "yesterday"], "--since", "yesterday", "Invalid isoformat"),
    ],
)  # fmt: skip
def test_a_bad_date_names_the_option_and_the_value(
    tmp_path: Path, args: list[str], option: str, value: str, why: str
) -> None:
    root = tmp_path / "s"
    add_context(root, "cli:main", [("q", "a")])
    result = invoke(*args, "--storage-dir", str(root))
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert f"Invalid value for '{option}': '{value}' is not a date" in line and why in line
    assert "2026-11-01T12:00:00Z" in line


def test_show_fork_delete_take_a_bare_name_as_chat_does(tmp_path: Path) -> None:
    """``main`` is ``cli:main`` for every command that takes a session, as for ``chat``."""
    root = tmp_path / "s"
    add_context(root, "cli:main", [("q", "a")])
    store = ["--storage-dir", str(root)]
    assert "cli:main  2 messages" in invoke("show", "main", *store).stdout
    assert invoke("stats", "main", "--json", *store).exit_code == 0
    forked = invoke("fork", "main", "copy", *store)
    assert forked.exit_code == 0 and "forked cli:main into cli:copy" in forked.stderr
    deleted = invoke("delete", "copy", *store)
    assert deleted.exit_code == 0 and "deleted cli:copy" in deleted.stderr
    assert [
        c["context_id"] for c in json.loads(invoke("list", "--json", *store).stdout)["contexts"]
    ] == ["cli:main"]


def test_a_mistyped_session_gets_a_did_you_mean(tmp_path: Path) -> None:
    root = tmp_path / "s"
    add_context(root, "cli:main", [("q", "a")])
    add_context(root, "irc:#python", [("q", "a")])
    store = ["--storage-dir", str(root)]
    for args, wanted in [
        (["show", "cli:maim"], "did you mean cli:main?"),
        (["show", "python"], "did you mean 'irc:#python'?"),
        (["stats", "irc:#pyhton"], "did you mean 'irc:#python'?"),
        (["fork", "cli:mian", "x"], "did you mean cli:main?"),
        (["delete", "mainn"], "did you mean cli:main?"),
        (["clear", "irc:main"], "did you mean cli:main?"),
    ]:
        result = invoke(*args, *store)
        assert result.exit_code == 1
        assert result.stderr.strip().endswith(wanted), (args, result.stderr)
    nothing = invoke("show", "cli:zzzzzz", *store)
    assert nothing.stderr.strip() == f"Error: no session 'cli:zzzzzz' in {root}"


@pytest.mark.parametrize(
    "args",
    [
        ["show", "cli:mian"],
        ["stats", "cli:mian"],
        ["delete", "cli:mian"],
        ["delete", "cli:mian", "--purge", "--yes"],
        ["clear", "cli:mian"],
        ["rewind", "cli:mian"],
        ["fork", "cli:mian", "x"],
        ["compact", "cli:mian"],
        ["export", "cli:mian"],
        ["export", "cli:mian", "cli:main", "-o", "{out}/"],
        ["search", "hello", "-c", "cli:mian"],
        ["search", "hello", "-c", "cli:mian", "--archived", "--json"],
        ["archive", "cli:mian"],
        ["archive", "cli:main", "cli:mian"],
        ["unarchive", "cli:mian"],
        ["pin", "cli:mian"],
        ["unpin", "cli:mian"],
        ["copy", "{root}", "{out}", "-c", "cli:mian"],
    ],
)
def test_every_command_says_a_session_is_missing_alike(tmp_path: Path, args: list[str]) -> None:
    """Each command that takes a session says the same of a missing one: the store named and
    the close ones suggested; nothing is done (an archive of two archives neither)."""
    root = tmp_path / "s"
    add_context(root, "cli:main", [("hello", "world")])
    filled = [a.format(root=root, out=tmp_path / "out") for a in args]
    result = invoke(*filled, "--storage-dir", str(root))
    assert result.exit_code == 1
    assert result.stderr == f"Error: no session 'cli:mian' in {root}; did you mean cli:main?\n"
    assert result.stdout == ""
    assert not (tmp_path / "out").exists()
    listed = json.loads(invoke("list", "--json", "--storage-dir", str(root)).stdout)["contexts"]
    assert [c["context_id"] for c in listed] == ["cli:main"]  # hot: an archived one is not listed


def test_one_message_is_not_messages(tmp_path: Path, fake_server: FakeServer) -> None:
    """Counts of one read '1 message' (and so on) wherever the chat counts."""
    root = tmp_path / "sessions"
    add_context(root, "cli:one", [])
    with FsStore(root) as store:
        head = store.get_head(ContextId.parse("cli:one"))
        assert head is not None
        save_delta(store, head, [{"role": "user", "content": "only this"}])
    url = fake_server.base_url
    result = run("chat", "cli:other", stdin="/switch one\n", cwd=tmp_path, TERRARIUM_BASE_URL=url)
    assert result.returncode == 0, result.stderr
    assert "now in cli:one (1 message)" in result.stderr.decode()
    rewound = run("rewind", "cli:one", "-n", "2", cwd=tmp_path)
    assert rewound.returncode == 1
    assert b"cannot rewind cli:one by 2 items: its history has only 1;" in rewound.stderr
    add_context(root, "cli:empty", [])
    rewound = run("rewind", "cli:empty", cwd=tmp_path)
    assert b"cannot rewind cli:empty by 1 item: its history has only 0;" in rewound.stderr


def test_a_store_warning_is_one_line_saying_warning(tmp_path: Path) -> None:
    """What the store warns of while a command runs (here a lost ``head.json`` that a rewind
    rebuilds) reaches stderr once, as ``warning: ...`` like the command's own warnings."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        ref = PodActiveSegmentRef(*create_segment(store, SegmentStartState(), context="cli:main"))
        for text in ("one", "two"):
            save_delta(store, ref, [{"role": "user", "content": text}])
        folder = store.folder_of(ContextId("cli", "main"))
    assert folder is not None
    (folder / "head.json").unlink()
    done = subprocess.run(
        [sys.executable, "-m", "terrarium", "--storage-dir", str(root), "rewind", "cli:main"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")},
    )
    assert done.returncode == 0, done.stderr
    [warning] = [line for line in done.stderr.splitlines() if "head.json" in line]
    assert warning.startswith("warning: ") and "head.json: rebuilt from the segments" in warning
