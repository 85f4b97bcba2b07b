"""The interactive chat and the session picker, driven in a real pseudo-terminal with pexpect.

Every wait is an ``expect`` on output (with a timeout), never a sleep. prompt_toolkit redraws
only what changed, so the tests match short strings that are written whole: the prompt
(``cli:main>``), replies, notes. ``PROMPT_TOOLKIT_NO_CPR`` stops it from asking the terminal
for the cursor position, which pexpect's terminal never answers.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fakeserver import FakeServer
from helpers.logs import segment_lines
from terrarium import (
    FsStore,
    SegmentStartState,
    create_compacted_segment,
    create_segment,
    restore,
    save_delta,
)
from terrarium.model import ContextId

pexpect = pytest.importorskip("pexpect")

REPO = Path(__file__).resolve().parents[1]
TIMEOUT = 20


def terminal_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    env.update(TERM="xterm", NO_COLOR="1", PROMPT_TOOLKIT_NO_CPR="1", COLUMNS="120", LINES="40")
    return env


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "sessions"


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    children: list[Any] = []

    def start(*args: str, script: list[str] | None = None) -> Any:
        command = script or [sys.executable, "-m", "terrarium.cli"]
        child = pexpect.spawn(
            command[0],
            [*command[1:], *args],
            env=terminal_env(),
            cwd=str(tmp_path),
            dimensions=(40, 120),
            encoding="utf-8",
            codec_errors="replace",
            timeout=TIMEOUT,
        )
        children.append(child)
        return child

    yield start
    for child in children:
        if child.isalive():
            child.terminate(force=True)
        child.close()


def add_context(root: Path, context: str, turns: int) -> None:
    with FsStore(root) as store:
        create_segment(store, SegmentStartState(), context=context)
        head = store.get_head(ContextId.parse(context))
        assert head is not None
        for n in range(turns):
            save_delta(
                store,
                head,
                [
                    {"role": "user", "content": f"question {n}"},
                    {"role": "assistant", "content": f"answer {n}"},
                ],
            )


def history(root: Path, context: str) -> list[dict[str, Any]]:
    with FsStore(root) as store:
        return restore(store, context).history


def leave(child: Any) -> None:
    """Ctrl-D at the prompt leaves with exit code 0."""
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_picker_filter_choose_chat_stats_fork_switch(
    root: Path, fake_server: FakeServer, spawn: Any
) -> None:
    add_context(root, "cli:main", 2)
    add_context(root, "irc:#python", 1)
    child = spawn("chat", "--base-url", fake_server.base_url, "--storage-dir", str(root))
    child.expect("Pick a session")
    child.expect("4 messages")  # cli:main, newest first within its type
    child.expect("#python")
    child.send("pyth")  # filter: only irc:#python is left, and it is selected
    child.expect("cli:pyth")  # the "new session" row names what the filter would create
    child.send("\r")
    child.expect("irc:#python: 2 messages")
    child.expect("irc:#python>")

    child.send("hello there\r")
    child.expect("echo: hello there")
    child.expect("irc:#python>")

    child.send("/stats\r")
    child.expect("model calls")
    child.expect("irc:#python>")

    child.send("/fork side\r")
    child.expect("now in irc:side")
    child.expect("irc:side>")
    child.send("on the side\r")
    child.expect("echo: on the side")
    child.expect("irc:side>")

    child.send("/switch cli:main\r")
    child.expect(r"now in cli:main \(4 messages\)")
    child.expect("cli:main>")
    child.send("/history\r")
    child.expect("answer 1")
    child.expect("cli:main>")
    leave(child)

    assert [m["content"] for m in history(root, "irc:#python")] == [
        "question 0",
        "answer 0",
        "hello there",
        "echo: hello there",
    ]
    assert len(history(root, "irc:side")) == 6
    assert len(history(root, "cli:main")) == 4


def test_picker_new_session_and_cancel(root: Path, fake_server: FakeServer, spawn: Any) -> None:
    add_context(root, "cli:main", 1)
    legacy = root / "cli" / "2025-11-06" / "old.json"
    legacy.parent.mkdir(parents=True)
    legacy.write_text(
        json.dumps(
            {
                "session_id": "old",
                "context_type": "cli",
                "system_prompt": "",
                "messages": [{"role": "user", "content": "hi", "timestamp": "2025-11-06T10:00:00"}],
            }
        )
    )
    child = spawn("chat", "--base-url", fake_server.base_url, "--storage-dir", str(root))
    child.expect("Pick a session")
    child.expect(r"\(legacy\)")  # legacy JSON sessions are listed too
    child.send("fresh")
    child.expect("cli:fresh")
    child.send("\r")
    child.expect("cli:fresh>")
    child.send("first words\r")
    child.expect("echo: first words")
    child.expect("cli:fresh>")
    leave(child)
    assert len(history(root, "cli:fresh")) == 2

    child = spawn("chat", "--base-url", fake_server.base_url, "--storage-dir", str(root))
    child.expect("Pick a session")
    child.sendcontrol("c")
    child.expect("no session chosen")
    child.expect(pexpect.EOF)
    assert "resume with" not in child.before  # nothing was opened
    child.close()
    assert child.exitstatus == 0


def test_prompt_on_a_terminal_does_not_wait_for_stdin(
    root: Path, fake_server: FakeServer, spawn: Any
) -> None:
    """``chat -p TEXT`` on a terminal sends TEXT alone and exits: a terminal's stdin is not
    read (only a pipe's is added to the prompt)."""
    child = spawn("chat", "cli:t", "-p", "hi there", "--base-url", fake_server.base_url,
                  "--storage-dir", str(root))  # fmt: skip
    child.expect("echo: hi there")
    child.expect("resume with: terrarium chat cli:t")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    assert fake_server.last_request["messages"] == [{"role": "user", "content": "hi there"}]


def test_picker_new_session_without_a_name_gets_one(
    root: Path, fake_server: FakeServer, spawn: Any
) -> None:
    """Enter on "+ new session" with no name typed starts a session named by the time."""
    add_context(root, "cli:main", 1)
    child = spawn("chat", "--base-url", fake_server.base_url, "--storage-dir", str(root))
    child.expect("Pick a session")
    child.expect(r"\+ new session \(type its name, or Enter for a new one named by the time\)")
    child.expect("2 messages")
    child.sendcontrol("p")  # up, to the new-session row
    child.send("\r")
    child.expect(r"(cli:\d{8}-\d{6}-[0-9a-f]{4})>")
    name = child.match.group(1)
    child.send("first words\r")
    child.expect("echo: first words")
    child.expect(f"{name}>")
    leave(child)
    assert history(root, name) == [
        {"role": "user", "content": "first words"},
        {"role": "assistant", "content": "echo: first words"},
    ]


def test_up_brings_back_the_messages_of_a_resumed_session(
    root: Path, fake_server: FakeServer, spawn: Any
) -> None:
    """Resuming a session, Up recalls its earlier messages, newest first, as a shell recalls
    commands (before, only what was typed since the chat started); they are read from the
    session, so no history file is kept outside the store."""
    add_context(root, "cli:main", 2)
    child = spawn(
        "chat", "cli:main", "--base-url", fake_server.base_url, "--storage-dir", str(root)
    )
    # Up: the last message sent in this session; Up again: the one before it
    _up_twice_sends(child, fake_server, "question 0")


def _up_twice_sends(child: Any, fake_server: FakeServer, expected: str) -> None:
    """At the prompt, Up twice then Enter: ``expected`` is what the model is sent."""
    child.expect("cli:main>")
    child.send("\x1b[A")
    child.send("\x1b[A")
    child.send("\r")
    child.expect(f"echo: {expected}")
    child.expect("cli:main>")
    leave(child)
    assert fake_server.last_request["messages"][-1] == {"role": "user", "content": expected}


def test_up_recalls_what_the_user_typed_not_a_compactions_summary(
    root: Path, fake_server: FakeServer, spawn: Any
) -> None:
    """A compaction's summary is logged as a user message; Up recalled it as if typed. It
    recalls only the user's own messages: here the one turn the compaction kept."""
    add_context(root, "cli:main", 2)
    with FsStore(root) as store:
        state = restore(store, ContextId.parse("cli:main"))
        summary = {"role": "user", "content": "[Summary of the conversation so far]\nquestions"}
        ack = {"role": "assistant", "content": "Understood."}
        history = [summary, ack, *state.history[-2:]]  # question 1 and answer 1 kept
        create_compacted_segment(store, state, history, context="cli:main")
    child = spawn(
        "chat", "cli:main", "--base-url", fake_server.base_url, "--storage-dir", str(root)
    )
    # Up: question 1; Up again: nothing older was typed (it was the summary)
    _up_twice_sends(child, fake_server, "question 1")


def test_ctrl_c_interrupts_a_reply_and_the_chat_goes_on(
    root: Path, fake_server: FakeServer, spawn: Any
) -> None:
    fake_server.chunks = 20
    # 20 pieces 0.3 s apart: "ech" is in by the 2nd, and Ctrl-C lands seconds before the end
    fake_server.chunk_delay = 0.3
    fake_server.strict_roles = True  # two user messages in a row would be refused (HTTP 400)
    child = spawn(
        "chat", "cli:main", "--base-url", fake_server.base_url, "--storage-dir", str(root)
    )
    child.expect("cli:main>")
    child.send("tell me a long story please\r")
    child.expect("ech")  # the first piece of the reply has arrived: a reply is streaming
    child.sendcontrol("c")
    child.expect("interrupted: the partial reply is logged, marked interrupted")
    child.expect("/retry sends it again")
    child.expect("cli:main>")

    fake_server.chunk_delay = 0
    child.send("again\r")
    child.expect("echo: again")  # the interrupted words do not go with "again"
    child.expect("cli:main>")
    leave(child)

    assert fake_server.last_request["messages"] == [{"role": "user", "content": "again"}]
    assert [m["content"] for m in history(root, "cli:main")] == [
        "tell me a long story please",
        "again",
        "echo: again",
    ]
    kinds = [line["kind"] for line in segment_lines(root, "cli:main")]
    assert kinds.count("run_errored") == 1 and kinds[-2:] == ["run_completed", "turn_end"]
    errored = next(
        line for line in segment_lines(root, "cli:main") if line["kind"] == "run_errored"
    )
    assert errored["error"] == "cancelled"
    assert errored["partial"].startswith("ech")


def test_too_long_paste_then_short_message_retry_rewind_compact(
    root: Path, fake_server: FakeServer, spawn: Any
) -> None:
    """The issue's case on a terminal: a paste over the model's window fails with a note saying
    why and what to do; the next message goes without it; /compact works; /retry sends the
    paste again; /rewind drops messages."""
    with FsStore(root) as store:
        create_segment(store, SegmentStartState(), context="cli:ctx")
        head = store.get_head(ContextId.parse("cli:ctx"))
        assert head is not None
        for n in range(4):  # long enough that a summary of them is shorter
            save_delta(store, head, [
                {"role": "user", "content": f"question {n}: " + "why " * 20},
                {"role": "assistant", "content": f"answer {n}: " + "because " * 10},
            ])  # fmt: skip
    fake_server.context_window = 400
    paste = "word " * 400  # 2,000 characters: 500 tokens
    child = spawn("chat", "cli:ctx", "--base-url", fake_server.base_url, "--retries", "0",
                  "--storage-dir", str(root))  # fmt: skip
    child.expect("cli:ctx>")
    child.send(paste.strip() + "\r")
    child.expect("maximum context length is 400 tokens")
    child.expect("shorten it, or make room with /compact or /rewind N, then /retry")
    child.expect("cli:ctx>")
    child.send("short\r")
    child.expect("echo: short")
    child.expect("cli:ctx>")
    assert "word word" not in json.dumps(fake_server.last_request)
    child.send("/retry\r")
    child.expect("nothing to retry in cli:ctx: its last turn did not fail")
    child.expect("cli:ctx>")
    child.send(paste.strip() + "\r")
    child.expect("maximum context length is 400 tokens")
    child.expect("cli:ctx>")
    child.send("/compact\r")
    child.expect(r"compacted cli:ctx: 12 messages -> 7")  # the failed paste carried along
    child.expect("cli:ctx>")
    fake_server.context_window = 1000
    child.send("/retry\r")
    child.expect("echo: word word")
    child.expect("cli:ctx>")
    child.send("/rewind 2\r")
    child.expect(r"rewound cli:ctx: dropped 2 messages, 7 messages left")
    child.expect("cli:ctx>")
    leave(child)
    contents = [m["content"] for m in history(root, "cli:ctx")]
    assert contents[0].startswith("[Summary of the conversation so far]")
    assert contents[-1] == paste.strip()  # the failed paste, still marked failed
    with FsStore(root) as store:
        state = restore(store, "cli:ctx")
    assert sorted(state.failed) == [len(contents) - 1]


def test_multiline_input_and_unreachable_server(root: Path, spawn: Any) -> None:
    add_context(root, "cli:main", 1)
    child = spawn(
        "chat", "cli:main", "--base-url", "http://127.0.0.1:9/v1", "--retries", "0",
        "--storage-dir", str(root),
    )  # fmt: skip
    child.expect("cli:main>")
    child.send("line one")
    child.send("\x1b\r")  # Esc+Enter (what Alt+Enter sends): a new line, not sent yet
    child.send("line two\r")
    child.expect("cannot reach the model server at http://127.0.0.1:9/v1")
    child.expect("--base-url")
    child.expect("your message is kept, marked failed, and is not sent with your next one")
    child.expect("/retry sends it again")
    child.expect("cli:main>")  # still in the chat
    child.send("/clear\r")
    child.expect("cleared cli:main")
    child.expect("cli:main>")
    child.send("/switch brand-new\r")
    child.expect("cli:brand-new>")
    child.send("first words\r")  # a new session whose first message gets no answer
    child.expect("cannot reach the model server")
    child.expect("nothing was kept: cli:brand-new begins with its first answered message")
    child.expect("Up brings your message back")
    child.expect("cli:brand-new>")
    child.send("/history\r")
    child.expect("cli:brand-new has no messages yet")
    child.expect("cli:brand-new>")
    leave(child)
    with FsStore(root) as store:
        head = store.get_head(ContextId.parse("cli:main"))
        assert head is not None
        first = store.read_segment(head.session_id, store.list_segments(head.session_id)[0])
        assert store.get_head(ContextId.parse("cli:brand-new")) is None
    sent = [e["item"]["content"] for e in first.entries if e["kind"] == "user_input"]
    assert sent == ["question 0", "line one\nline two"]


def test_seed_chat_py_on_a_terminal(root: Path, fake_server: FakeServer, spawn: Any) -> None:
    """``python chat.py`` opens the picker; ``--delete-session`` asks before deleting."""
    add_context(root, "cli:main", 1)
    chat_py = [sys.executable, str(REPO / "chat.py")]
    child = spawn("--base-url", fake_server.base_url, "--storage-dir", str(root), script=chat_py)
    child.expect("Pick a session")
    child.expect("2 messages")
    child.send("\r")
    child.expect("cli:main>")
    leave(child)

    child = spawn("--delete-session", "main", "--storage-dir", str(root), script=chat_py)
    child.expect(r"Delete cli:main and all its history\? \[y/N\]")
    child.send("y\r")
    child.expect("deleted cli:main")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    with FsStore(root) as store:
        assert store.list_contexts() == []


def test_picker_previews_and_a_typed_name_that_exists(
    root: Path, fake_server: FakeServer, spawn: Any
) -> None:
    """Each session shows its first user message and last reply; typing ``main`` selects
    cli:main although the newer cli:mainframe matches the filter too."""
    add_context(root, "cli:main", 2)
    add_context(root, "cli:mainframe", 1)  # newer: listed first
    child = spawn("chat", "--base-url", fake_server.base_url, "--storage-dir", str(root))
    child.expect("Pick a session")
    child.expect("question 0 -> answer 0")  # cli:mainframe's preview
    child.expect("question 0 -> answer 1")  # cli:main's: first question, last answer
    child.send("main")
    child.expect("exists: Enter opens it")  # the new-session row no longer offers to create it
    child.expect(r"> main +4 messages")  # selected, although cli:mainframe is newer
    child.send("\r")
    child.expect("cli:main: 4 messages")
    child.expect("cli:main>")
    child.sendcontrol("d")
    child.expect(f"resume with: terrarium chat cli:main --storage-dir {root}")
    leave(child)


def test_picker_reads_previews_only_for_the_sessions_on_screen() -> None:
    """A thousand sessions: one screenful of previews is read, and each only once."""
    from prompt_toolkit.application import create_app_session
    from prompt_toolkit.input import create_pipe_input
    from prompt_toolkit.output import DummyOutput

    from terrarium.cli.picker import Picker
    from terrarium.index._listing import ContextSummary

    rows = [
        ContextSummary(f"cli:s{n}", "2025-11-06", 2, f"2025-11-06T{n:06d}", "", "")
        for n in range(1000)
    ]
    read: list[ContextId] = []

    def preview(context: ContextId) -> tuple[str, str]:
        read.append(context)
        return (f"first of {context.name} " + "word " * 40, "last reply")

    with create_pipe_input() as keys, create_app_session(input=keys, output=DummyOutput()):
        picker = Picker(rows, "cli", preview)
        rows_on_screen = DummyOutput().get_size().rows
        text = "".join(fragment[1] for fragment in picker.render())
        assert 0 < len(read) < rows_on_screen
        assert read == [r.id for r in rows[: len(read)]]
        columns = DummyOutput().get_size().columns
        assert all(len(line) <= columns for line in text.splitlines())
        assert "first of s0 word" in text and "\u2026 -> last reply" in text
        assert f"({1000 - len(read)} more below, 0 above)" in text
        picker.render()
        assert len(read) == len(set(read))  # a second draw reads nothing again
        first_screen = len(read)
        for _ in range(first_screen + 2):
            picker._move(1)
        picker.render()
        assert rows[first_screen + 2].id in read  # scrolled: the selected row is shown
        assert len(read) < 2 * rows_on_screen
