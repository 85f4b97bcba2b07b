"""A failed turn never makes the next turn fail (docs/cli.md, "When a reply fails").

A turn logs the user's input before the model is called. When the call fails (a 4xx such as
vLLM's "maximum context length", a 5xx, the server down, a stream dropped, a client raising,
cancellation, Ctrl-C) the input stays in the log with a ``run_errored`` entry after it, which
marks the run failed. The next turn is sent with the history from before the failure and its
own input only; the failed input is sent again only when asked (``/retry``, ``chat --retry``,
``MultiContextManager.retry_with_context``). Logs with user messages in a row for another
reason (written by hand, imported) are still sent folded, as strict chat templates want.

Every test here talks to the fake server through the real ``openai`` client over HTTP:
``strict_roles`` answers HTTP 400 to two user messages in a row, ``context_window`` answers
vLLM's 400 to a prompt over that many tokens.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import given
from hypothesis import strategies as st

from fakeserver import ROLES_MESSAGE, FakeServer, context_length_message
from helpers.logs import segment_lines as lines_of
from terrarium import (
    ContextId,
    FsStore,
    MemoryStore,
    SegmentStartState,
    create_segment,
    restore,
    save_delta,
)
from terrarium.agent.multi_context_manager import MultiContextManager
from terrarium.agent.session_manager import PersistentSession
from terrarium.cli import cli as terrarium_cli
from terrarium.errors import ContextTooLong, LLMError, NothingToRetry
from terrarium.formats.openai import chat_messages
from terrarium.llm.vllm_client import ChatResult, StreamEvent, VLLMClient
from terrarium.model import add_wire_message, wire_messages
from terrarium.sessions import collect_state

TERRARIUM = [sys.executable, "-m", "terrarium.cli"]


def interruptible() -> None:
    """In the child, before it runs: SIGINT as a terminal sends it, even when this test runs
    in the background of a shell that ignores it (a child inherits SIG_IGN, and Python then
    installs no KeyboardInterrupt handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture
def strict() -> Iterator[FakeServer]:
    """A fake model server that refuses two user (or assistant) messages in a row."""
    with FakeServer(strict_roles=True) as server:
        yield server


def make_manager(server: FakeServer, root: Path, **kwargs: Any) -> MultiContextManager:
    client = VLLMClient(base_url=server.root_url, max_retries=0, backoff_base=0.001)
    return MultiContextManager(client, storage_dir=str(root), **kwargs)


def history_of(root: Path, context: str) -> list[dict[str, Any]]:
    with FsStore(root) as store:
        return restore(store, context).history


def user_runs(messages: Sequence[dict[str, Any]]) -> int:
    """How many times a user message directly follows another."""
    roles = [m.get("role") for m in messages]
    return sum(a == b == "user" for a, b in itertools.pairwise(roles))


def errored_lines(root: Path, context: str) -> list[dict[str, Any]]:
    return [line for line in lines_of(root, context) if line["kind"] == "run_errored"]


def cli(*args: str, stdin: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    return subprocess.run(
        [*TERRARIUM, *args], input=stdin, capture_output=True, text=True, cwd=cwd, env=env,
        timeout=60,
    )  # fmt: skip


# --------------------------------------------------------------------------- the fake server


def test_strict_fake_server_refuses_consecutive_user_messages(strict: FakeServer) -> None:
    """The test double can fail: user/user is a 400 in the templates' words; alternation is not."""

    async def main() -> None:
        client = VLLMClient(base_url=strict.root_url, max_retries=0)
        try:
            with pytest.raises(LLMError, match="roles must alternate"):
                await client.chat(
                    [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
                )
            call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ok = [
                {"role": "system", "content": "s"},
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "1"},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": "b"},
            ]
            assert (await client.chat(ok)).text == "echo: b"
        finally:
            await client.aclose()

    asyncio.run(main())
    assert ROLES_MESSAGE.startswith("Conversation roles must alternate")


def test_context_window_mode_refuses_long_prompts(strict: FakeServer) -> None:
    """The test double can fail: over the window, vLLM's 400 (a ContextTooLong); under, a reply."""
    strict.context_window = 50

    async def main() -> None:
        client = VLLMClient(base_url=strict.root_url, max_retries=0)
        try:
            with pytest.raises(ContextTooLong, match="maximum context length is 50 tokens"):
                await client.chat([{"role": "user", "content": "x" * 400}])
            assert (await client.chat([{"role": "user", "content": "short"}])).text == "echo: short"
        finally:
            await client.aclose()

    asyncio.run(main())
    assert context_length_message(50, 101).startswith("This model's maximum context length is 50")


# --------------------------------------------------------------------------- the command line

PASTE = "".join(f"line {n} of a long paste. " for n in range(150))  # 3,000+ characters
TURN = "a question of about a hundred characters, long enough that a summary of it is shorter"


def chat_cli(root: Path, server: FakeServer, *args: str, stdin: str = "") -> Any:
    return cli("chat", *args, "--base-url", server.base_url, "--retries", "0", "--storage-dir",
               str(root), stdin=stdin, cwd=root.parent)  # fmt: skip


def here(*args: str, input: str = "") -> Result:
    """``terrarium *args`` in this process (click's runner): what the command does, without
    an interpreter's start-up for each of a test's many commands."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("TERRARIUM_")}
    return CliRunner().invoke(
        terrarium_cli, list(args), input=input, env=env, catch_exceptions=False
    )


def chat_here(root: Path, server: FakeServer, *args: str, input: str = "") -> Result:
    return here("chat", *args, "--base-url", server.base_url, "--retries", "0", "--storage-dir",
                str(root), input=input)  # fmt: skip


def test_chat_history_marks_a_failed_message_as_show_does(root: Path, strict: FakeServer) -> None:
    """``/history`` in the chat shows a failed message marked, with its error, as ``show``
    does (it was listed as if the model had answered it)."""
    assert chat_here(root, strict, "cli:h", "-p", "fine").exit_code == 0
    strict.fail_next(503)
    assert chat_here(root, strict, "cli:h", "-p", "lost").exit_code == 1
    result = chat_here(root, strict, "cli:h", input="/history\n")
    assert result.exit_code == 0, result.stderr
    shown = result.stdout
    assert "failed, not sent to the model again: " in shown and "lost" in shown
    assert shown.count("failed, not sent") == 1 and "echo: fine" in shown


def test_cli_too_long_then_the_next_message_goes_through(root: Path, strict: FakeServer) -> None:
    """The issue's case: a paste over the window fails (exit 1, one line saying what to do);
    the next message, -p or piped, is sent without it and succeeds; compact works; the paste
    is shown marked failed and goes again only with --retry. In-process (fifteen commands:
    the real pipes and processes are the other tests' subject)."""
    for n in range(4):
        assert chat_here(root, strict, "cli:ctx", "-p", f"{TURN} {n}").exit_code == 0
    strict.context_window = 400
    failed = chat_here(root, strict, "cli:ctx", "-p", "-", input=PASTE)
    assert failed.exit_code == 1
    [line] = failed.stderr.strip().splitlines()
    assert "maximum context length is 400 tokens" in line
    assert ".;" not in line  # the server's sentence ends where the note begins, in one stop
    assert "marked failed" in line and "--retry" in line
    assert "terrarium compact cli:ctx" in line and "terrarium rewind cli:ctx -n N" in line
    assert "Traceback" not in failed.stderr

    shown = here("show", "cli:ctx", "--json", "--storage-dir", str(root))
    marked = [m for m in json.loads(shown.stdout)["messages"] if "failed" in m]
    assert [m["content"] for m in marked] == [PASTE]
    assert "maximum context length" in marked[0]["failed"]["error"]
    plain = here("show", "cli:ctx", "--storage-dir", str(root)).stdout
    assert "failed, not sent to the model again: the request does not fit" in plain
    again = chat_here(root, strict, "cli:ctx", "--retry")
    assert again.exit_code == 1 and "maximum context length" in again.stderr
    assert PASTE in json.dumps(strict.last_request)  # asked for: sent again, and refused again

    short = chat_here(root, strict, "cli:ctx", "-p", "short")
    assert (short.exit_code, short.stdout) == (0, "echo: short\n"), short.stderr
    assert PASTE not in json.dumps(strict.last_request)
    typed = chat_here(root, strict, "cli:ctx", input="typed\n")
    assert (typed.exit_code, typed.stdout) == (0, "echo: typed\n"), typed.stderr
    assert PASTE not in json.dumps(strict.last_request)
    nothing = chat_here(root, strict, "cli:ctx", "--retry")
    assert nothing.exit_code == 1
    error = "Error: nothing to retry in cli:ctx: its last turn did not fail"
    assert nothing.stderr.strip() == error

    assert chat_here(root, strict, "cli:ctx", "-p", "-", input=PASTE).exit_code == 1
    compacted = here(
        "compact", "cli:ctx", "--base-url", strict.base_url, "--storage-dir", str(root)
    )
    assert compacted.exit_code == 0, compacted.stderr
    assert PASTE not in json.dumps(strict.last_request)
    strict.context_window = None
    again = chat_here(root, strict, "cli:ctx", "--retry")  # the failed paste outlived compaction
    assert (again.exit_code, again.stdout) == (0, f"echo: {PASTE}\n"), again.stderr


def test_cli_server_down_then_up(tmp_path: Path) -> None:
    """``echo hi | terrarium chat`` with the server down, then up: the next message goes alone;
    ``--retry`` sends the failed one. In-process, as above."""
    root = tmp_path / "sessions"
    with FakeServer(strict_roles=True) as probe:
        port = probe.port  # a port that is free again once the probe stops
        assert chat_here(root, probe, "cli:x", "-p", "first").exit_code == 0
    down = f"http://127.0.0.1:{port}/v1"
    result = here("chat", "cli:x", "--base-url", down, "--retries", "0", "--storage-dir",
                  str(root), input="hi\n")  # fmt: skip
    assert result.exit_code == 1
    [line] = result.stderr.strip().splitlines()
    assert "cannot reach the model server" in line
    assert f"'terrarium chat cli:x --storage-dir {root} --retry' sends it again" in line
    [errored] = errored_lines(root, "cli:x")
    assert errored["error"] and errored["error_type"]

    with FakeServer(strict_roles=True, port=port) as server:
        result = chat_here(root, server, "cli:x", input="there\n")
        assert result.exit_code == 0, result.stderr
        assert server.last_request["messages"][-1] == {"role": "user", "content": "there"}
        assert "hi" not in json.dumps(server.last_request)
        strict_down = here("chat", "cli:x", "-p", "again", "--base-url", down, "--retries", "0",
                           "--storage-dir", str(root))  # fmt: skip
        assert strict_down.exit_code == 0  # the server is up again on that port
        server.fail_next(503)
        assert chat_here(root, server, "cli:x", "-p", "hi again").exit_code == 1
        result = chat_here(root, server, "cli:x", "--retry")
        assert (result.exit_code, result.stdout) == (0, "echo: hi again\n"), result.stderr
        assert server.last_request["messages"][-3:] == [
            {"role": "user", "content": "again"},
            {"role": "assistant", "content": "echo: again"},
            {"role": "user", "content": "hi again"},
        ]
    assert [m["content"] for m in history_of(root, "cli:x")] == [
        "first",
        "echo: first",
        "hi",  # failed, kept, never sent again
        "there",
        "echo: there",
        "again",
        "echo: again",
        "hi again",  # failed (503)
        "hi again",  # sent again with --retry
        "echo: hi again",
    ]


def test_cli_sigint_mid_reply_from_a_pipe_is_logged(tmp_path: Path, strict: FakeServer) -> None:
    """Ctrl-C (SIGINT) while a piped chat waits for a reply: the run is logged as cancelled,
    the exit status is 130, and the next message goes without the interrupted one."""
    root = tmp_path / "sessions"
    args = ["chat", "cli:p", "--base-url", strict.base_url, "--storage-dir", str(root)]
    assert cli(*args, stdin="hello\n", cwd=tmp_path).returncode == 0
    arrived, release = strict.hold_replies()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    child = subprocess.Popen(
        [*TERRARIUM, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env, preexec_fn=interruptible,
    )  # fmt: skip
    try:
        assert child.stdin is not None
        child.stdin.write("wait for it\n")
        child.stdin.flush()
        assert arrived.wait(30)
        child.send_signal(signal.SIGINT)
        _, stderr = child.communicate(timeout=30)
    finally:
        release.set()
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 130
    assert "Aborted" not in stderr and "Traceback" not in stderr
    assert "interrupted" in stderr and "--retry" in stderr
    assert "interrupted before any reply: your message is kept, marked failed" in stderr
    assert "partial reply" not in stderr  # none came, and none is logged
    [errored] = errored_lines(root, "cli:p")
    assert "partial" not in errored
    assert errored["error"] == "cancelled"
    strict.reply = lambda messages: "fine"
    result = cli(*args, stdin="again\n", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert strict.last_request["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "echo: hello"},
        {"role": "user", "content": "again"},
    ]


def test_cli_ctrl_c_in_one_shot_keeps_the_partial_reply(tmp_path: Path, strict: FakeServer) -> None:
    """Ctrl-C during ``chat -p``'s reply: the partial reply printed and logged (marked
    interrupted), exit status 130 and one note, not click's "Aborted!" and 1."""
    root = tmp_path / "sessions"
    assert chat_cli(root, strict, "cli:i", "-p", "hello").returncode == 0
    strict.chunks = 20
    # 20 pieces 0.3 s apart: "ech" is in by the 3rd, and the signal lands seconds before the end
    strict.chunk_delay = 0.3
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    child = subprocess.Popen(
        [*TERRARIUM, "chat", "cli:i", "-p", "tell me a long story", "--base-url",
         strict.base_url, "--storage-dir", str(root)],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path,
        env=env, preexec_fn=interruptible,
    )  # fmt: skip
    try:
        assert child.stdout is not None
        first = child.stdout.read(3)  # the first piece of the reply: a reply is streaming
        child.send_signal(signal.SIGINT)
        rest, stderr = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert first == b"ech"
    assert child.returncode == 130
    note = stderr.decode()
    assert "Aborted" not in note and "Traceback" not in note
    assert "interrupted: the partial reply is logged" in note
    errored = errored_lines(root, "cli:i")[-1]
    assert errored["error"] == "cancelled"
    # What was printed is what was logged, up to the piece the signal caught on its way out.
    assert errored["partial"].startswith((first + rest).decode().strip())
    shown = cli("show", "cli:i", "--storage-dir", str(root), stdin="", cwd=tmp_path).stdout
    assert "[assistant, interrupted: the partial reply]" in shown


# --------------------------------------------------------------------------- the manager


def test_manager_too_long_then_a_short_turn(root: Path, strict: FakeServer) -> None:
    """Through process_with_context: after a ContextTooLong the next short message succeeds;
    the failed input is kept and marked, compaction works, and only retry_with_context sends
    it again (NothingToRetry once the last turn did not fail)."""
    strict.context_window = 400

    async def main() -> None:
        manager = make_manager(strict, root)
        for n in range(4):
            await manager.process_with_context("game:r", f"{TURN} {n}")
        with pytest.raises(ContextTooLong):
            await manager.process_with_context("game:r", PASTE)
        assert manager.failed_input("game:r") == PASTE
        assert await manager.process_with_context("game:r", "short") == "echo: short"
        assert PASTE not in json.dumps(strict.last_request)
        assert manager.failed_input("game:r") is None
        with pytest.raises(NothingToRetry):
            await manager.retry_with_context("game:r")
        with pytest.raises(ContextTooLong):
            await manager.process_with_context("game:r", PASTE)
        await manager.compact_context("game:r")  # the failed paste is not summarised
        assert PASTE not in json.dumps(strict.last_request)
        assert manager.failed_input("game:r") == PASTE  # still there to retry
        strict.context_window = None
        assert await manager.retry_with_context("game:r") == f"echo: {PASTE}"
        state = manager.get_session("game:r").state
        assert [state.history[i]["content"] for i in sorted(state.failed)] == [PASTE]
        await manager.aclose()

    asyncio.run(main())
    with FsStore(root) as store:
        state = restore(store, "game:r")
    assert [state.history[i]["content"] for i in sorted(state.failed)] == [PASTE]
    assert user_runs(wire_messages(None, state.model_history)) == 0


def test_stream_dropped_mid_reply_then_the_next_turn(root: Path, strict: FakeServer) -> None:
    """A dropped stream keeps the partial text in ``run_errored`` only; the next turn goes
    without the failed input."""
    strict.chunks = 5
    strict.drop_next(after_chunks=3)

    async def main() -> list[str]:
        manager = make_manager(strict, root)
        got: list[str] = []
        with pytest.raises(LLMError):
            async for delta in manager.stream_with_context("game:r", "go on"):
                got.append(delta)
        assert await manager.process_with_context("game:r", "again") == "echo: again"
        await manager.aclose()
        return got

    got = asyncio.run(main())
    [errored] = errored_lines(root, "game:r")
    assert got and errored["partial"] == "".join(got)
    assert strict.last_request["messages"] == [{"role": "user", "content": "again"}]
    assert [m["role"] for m in history_of(root, "game:r")] == ["user", "user", "assistant"]


class FlakyClient(VLLMClient):
    """A real client whose first call raises a plain exception (a bug, not an LLMError)."""

    failures = 1

    async def chat(self, messages: Sequence[Any], **params: Any) -> ChatResult:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("client bug")
        return await super().chat(messages, **params)

    async def stream(self, messages: Sequence[Any], **params: Any) -> AsyncIterator[StreamEvent]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("client bug")
        async for event in super().stream(messages, **params):
            yield event


@pytest.mark.parametrize("stream", [False, True])
def test_a_client_that_raises(root: Path, strict: FakeServer, stream: bool) -> None:
    """Whatever the client raises is logged with its reason; the next request goes without it."""

    async def turn(manager: MultiContextManager, text: str) -> str:
        if stream:
            return "".join([d async for d in manager.stream_with_context("irc:#c", text)])
        return await manager.process_with_context("irc:#c", text)

    async def main() -> None:
        client = FlakyClient(base_url=strict.root_url, max_retries=0)
        client.failures = 0
        async with MultiContextManager(client, storage_dir=str(root)) as manager:
            assert await turn(manager, "zero") == "echo: zero"
            client.failures = 1
            with pytest.raises(RuntimeError, match="client bug"):
                await turn(manager, "first")
            assert manager.get_stats("irc:#c")["last_error"] == "client bug"
            assert await turn(manager, "second") == "echo: second"
            assert await turn(manager, "third") == "echo: third"

    asyncio.run(main())
    [errored] = errored_lines(root, "irc:#c")
    assert (errored["error"], errored["error_type"]) == ("client bug", "RuntimeError")
    assert strict.last_request["messages"] == [
        {"role": "user", "content": "zero"},
        {"role": "assistant", "content": "echo: zero"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": "echo: second"},
        {"role": "user", "content": "third"},
    ]


def test_a_cancelled_task_is_logged_and_the_next_turn_goes_alone(
    root: Path, strict: FakeServer
) -> None:
    """A task cancelled around ``stream_with_context`` logs ``cancelled``; cancellation goes on."""

    async def main() -> None:
        manager = make_manager(strict, root)
        assert await manager.process_with_context("cli:slow", "hello") == "echo: hello"
        arrived, release = strict.hold_replies()

        async def consume() -> None:
            async for _ in manager.stream_with_context("cli:slow", "wait"):
                pass

        task = asyncio.create_task(consume())
        await asyncio.to_thread(arrived.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert errored_lines(root, "cli:slow")[-1]["error"] == "cancelled"
        release.set()
        strict.reply = lambda messages: "ok"
        assert await manager.process_with_context("cli:slow", "now") == "ok"
        await manager.aclose()

    asyncio.run(main())
    assert strict.last_request["messages"][-1] == {"role": "user", "content": "now"}
    assert "wait" not in json.dumps(strict.last_request)


def test_a_stream_closed_early_is_logged_at_once(root: Path, strict: FakeServer) -> None:
    """Closing ``stream_with_context`` mid-reply logs the failure before ``aclose`` returns."""
    strict.chunks = 10

    async def main() -> None:
        manager = make_manager(strict, root)
        stream = manager.stream_with_context("cli:b", "tell me all")
        async with contextlib.aclosing(stream):
            async for _ in stream:
                break
        [errored] = errored_lines(root, "cli:b")
        assert errored["error"] == "cancelled" and errored["partial"]
        assert await manager.process_with_context("cli:b", "short") == "echo: short"
        await manager.aclose()

    asyncio.run(main())


def test_a_failed_compaction_keeps_the_input(root: Path, strict: FakeServer) -> None:
    """The automatic compaction before a turn fails: the input is still logged, with the error,
    and the next turn goes without it."""

    async def main() -> None:
        manager = make_manager(strict, root, token_budget=30, keep_after_compaction=2)
        await manager.process_with_context("cli:c", "x" * 60)
        strict.fail_next(500)
        with pytest.raises(LLMError):
            await manager.process_with_context("cli:c", "the words to keep")
        assert manager.history("cli:c")[-1]["content"] == "the words to keep"
        assert manager.failed_input("cli:c") == "the words to keep"
        await manager.process_with_context("cli:c", "next")
        await manager.aclose()

    asyncio.run(main())
    assert "the words to keep" not in json.dumps(strict.last_request)
    assert user_runs(strict.last_request["messages"]) == 0


def test_autosave_off_keeps_a_turn_after_compaction(root: Path, strict: FakeServer) -> None:
    """With auto-save off, the turn that follows an automatic compaction is saved, not dropped."""

    async def main() -> None:
        manager = make_manager(strict, root, token_budget=30, autosave=False)
        await manager.process_with_context("cli:q", "x" * 60)
        await manager.process_with_context("cli:q", "after the summary")
        await manager.process_with_context("cli:q", "and this")
        manager.close()
        await manager.client.aclose()

    asyncio.run(main())
    texts = [m["content"] for m in history_of(root, "cli:q")]
    assert texts[0].startswith("[Summary of the conversation so far]")  # compacted twice
    assert texts[2:] == [
        "x" * 60,
        "echo: " + "x" * 60,
        "after the summary",  # lost before: queued on a context the cache had dropped
        "echo: after the summary",
        "and this",
        "echo: and this",
    ]


def test_a_fresh_process_sends_the_same_messages(root: Path, strict: FakeServer) -> None:
    """The cached manager and a restore in another process send the same messages: failed
    turns left out of both."""

    async def main() -> None:
        manager = make_manager(strict, root, default_system_prompt="Be brief.")
        await manager.process_with_context("cli:f", "zero")
        strict.fail_next(503)
        with pytest.raises(LLMError):
            await manager.process_with_context("cli:f", "one")
        strict.fail_next(503)
        with pytest.raises(LLMError):
            await manager.process_with_context("cli:f", "two")
        await manager.process_with_context("cli:f", "three")
        await manager.process_with_context("cli:f", "four")
        await manager.aclose()

    asyncio.run(main())
    fourth = strict.requests[-1]["messages"]
    assert fourth == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "zero"},
        {"role": "assistant", "content": "echo: zero"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "echo: three"},
        {"role": "user", "content": "four"},
    ]
    written = [line["item"] for line in lines_of(root, "cli:f") if "item" in line]
    assert history_of(root, "cli:f") == written  # restore gives back the log, every item
    assert [m["content"] for m in written[:5]] == ["zero", "echo: zero", "one", "two", "three"]

    result = cli("chat", "cli:f", "--base-url", strict.base_url, "--storage-dir", str(root),
                 stdin="five\n", cwd=root.parent)  # fmt: skip
    assert result.returncode == 0, result.stderr
    fifth = strict.last_request["messages"]
    assert fifth[: len(fourth)] == fourth
    assert fifth[len(fourth) :] == [
        {"role": "assistant", "content": "echo: four"},
        {"role": "user", "content": "five"},
    ]


def test_a_log_with_consecutive_user_messages_is_repaired(root: Path, strict: FakeServer) -> None:
    """A history written (or imported) with user messages in a row is sent folded."""
    with FsStore(root) as store:
        create_segment(store, SegmentStartState(), context="cli:old")
        head = store.get_head(ContextId.parse("cli:old"))
        assert head is not None
        save_delta(
            store,
            head,
            [
                {"role": "user", "content": "a"},
                {"role": "user", "content": "b"},
                {"role": "assistant", "content": "c"},
                {"role": "user", "content": "d"},
            ],
        )

    async def main() -> str:
        manager = make_manager(strict, root)
        reply = await manager.process_with_context("cli:old", "e")
        await manager.aclose()
        return reply

    assert asyncio.run(main()) == "echo: d\n\ne"
    assert strict.last_request["messages"] == [
        {"role": "user", "content": "a\n\nb"},
        {"role": "assistant", "content": "c"},
        {"role": "user", "content": "d\n\ne"},
    ]


def test_a_legacy_file_with_user_messages_in_a_row(tmp_path: Path, strict: FakeServer) -> None:
    """A legacy JSON session whose last message had no reply resumes; its words go along."""
    root = tmp_path / "sessions"
    legacy = root / "cli" / "2025-11-06" / "old.json"
    legacy.parent.mkdir(parents=True)
    messages = [("user", "Hello!"), ("assistant", "Hi!"), ("user", "Still there?"), ("user", "Hm")]
    legacy.write_text(
        json.dumps(
            {
                "session_id": "old",
                "context_type": "cli",
                "system_prompt": "",
                "messages": [
                    {"role": role, "content": text, "timestamp": "2025-11-06T10:00:00"}
                    for role, text in messages
                ],
            }
        )
    )
    result = cli("chat", "cli:old", "--base-url", strict.base_url, "--storage-dir", str(root),
                 stdin="hello?\n", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert strict.last_request["messages"] == [
        {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hi!"},
        {"role": "user", "content": "Still there?\n\nHm\n\nhello?"},
    ]
    assert [m["content"] for m in history_of(root, "cli:old")][2:5] == [
        "Still there?",
        "Hm",
        "hello?",
    ]


def test_retrying_the_same_input_sends_it_once(root: Path, strict: FakeServer) -> None:
    """A caller that retries a failed input gets one user message, not its words twice."""

    async def main() -> None:
        manager = make_manager(strict, root)
        await manager.process_with_context("irc:#r", "hi")
        strict.fail_next(503)
        with pytest.raises(LLMError):
            await manager.process_with_context("irc:#r", "ping?")
        assert await manager.process_with_context("irc:#r", "ping?") == "echo: ping?"
        await manager.aclose()

    asyncio.run(main())
    assert strict.last_request["messages"][2:] == [{"role": "user", "content": "ping?"}]
    assert [m["content"] for m in history_of(root, "irc:#r")][2:] == [
        "ping?",
        "ping?",
        "echo: ping?",
    ]


# --------------------------------------------------------------------------- the rule itself


def test_folding_keeps_tool_order_parts_and_names() -> None:
    """Only adjacent user messages fold; tool results and tool calls keep their places."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [
        {"role": "user", "content": "q", "name": "ann"},
        {"role": "user", "content": "r", "name": "ann", "reasoning_content": "log only"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {"role": "user", "content": "s", "name": "ann"},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "x"},
        {"role": "user", "content": "y"},
        {"role": "user", "content": "y"},  # a retry of the failed input: sent once
        {"role": "user", "content": "xy"},
    ]
    assert wire_messages("sys", history) == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "q\n\nr", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "1"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "s"},
                {"type": "image_url", "image_url": {"url": "u"}},
            ],
        },
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "x\n\ny\n\nxy"},
    ]
    assert history[0] == {"role": "user", "content": "q", "name": "ann"}  # never changed


_ITEMS = st.one_of(
    st.builds(lambda t: {"role": "user", "content": t}, st.text(max_size=5)),
    st.builds(lambda t: {"role": "assistant", "content": t}, st.text(max_size=5)),
    st.just({"role": "tool", "tool_call_id": "c", "content": "r"}),
    st.just({"role": "system", "content": "[event: x]"}),
)


@given(st.lists(_ITEMS, max_size=30), st.one_of(st.none(), st.just("p")))
def test_folding_is_incremental_and_keeps_every_word(
    history: list[dict[str, Any]], prompt: str | None
) -> None:
    """Item by item equals all at once; no user follows a user; each user text is sent."""
    built = wire_messages(prompt, history)
    kept: list[dict[str, Any]] = wire_messages(prompt, [])
    for item in history:
        add_wire_message(kept, item)
    assert kept == built
    assert user_runs(built) == 0
    users = " ".join(m["content"] for m in built if m["role"] == "user")
    for item in history:
        if item["role"] == "user":
            assert item["content"] in users
    sent = built[1:] if prompt else built
    assert [m for m in sent if m["role"] != "user"] == [i for i in history if i["role"] != "user"]


def _lines(*entries: tuple[str, dict[str, Any]]) -> list[dict[str, Any]]:
    header = {"v": 1, "seq": 0, "ts": "t", "kind": "header", "session_id": str(uuid.uuid4()),
              "segment_id": str(uuid.uuid4()), "context": "cli:r", "history": None}  # fmt: skip
    return [header] + [
        {"v": 1, "seq": n, "ts": "t", "kind": kind, **data}
        for n, (kind, data) in enumerate(entries, start=1)
    ]


def _user(text: str) -> tuple[str, dict[str, Any]]:
    return ("user_input", {"item": {"role": "user", "content": text}})


def _item(role: str, text: str) -> tuple[str, dict[str, Any]]:
    return ("item", {"item": {"role": role, "content": text}})


ERRORED = ("run_errored", {"error": "boom", "error_type": "BadResponse"})


def test_a_failed_run_is_its_last_user_inputs_and_what_follows() -> None:
    """run_errored fails the run's last block of user inputs and the items after it (a tool
    call, its result), never what an earlier run logged, nor anything when the run logged no
    input; a compaction's header starts afresh."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    lines = _lines(
        _user("a"),
        _item("assistant", "b"),  # no run markers: written by hand, as add_message does
        _user("c"),
        _user("c2"),
        ("item", {"item": {"role": "assistant", "content": None, "tool_calls": [call]}}),
        ("item", {"item": {"role": "tool", "tool_call_id": "c1", "content": "1"}}),
        ERRORED,
        ERRORED,  # a second failure with no input of its own fails nothing more
        _user("d"),
        _item("assistant", "e"),
        ("run_completed", {"finish_reason": "stop"}),
        _item("system", "[event]"),
        ERRORED,  # a run that logged no user input
    )
    state = collect_state(lines)
    assert sorted(state.failed) == [2, 3, 4, 5]
    assert state.failed[2]["error"] == "boom"
    assert [m.get("content") for m in state.model_history] == ["a", "b", "d", "e", "[event]"]
    assert len(state.history) == 9  # every item stays in the history


_ENTRIES = st.lists(
    st.one_of(
        st.builds(_user, st.sampled_from(["u", "v"])),
        st.builds(_item, st.sampled_from(["assistant", "system"]), st.just("r")),
        st.just(("run_completed", {"finish_reason": "stop"})),
        st.just(("turn_end", {})),
        st.just(ERRORED),
    ),
    max_size=25,
)


@given(_ENTRIES)
def test_the_runtime_marks_what_a_restore_marks(entries: list[tuple[str, dict[str, Any]]]) -> None:
    """Entry by entry (PersistentSession, the manager's cache) equals a restore of the log: the
    same failed items and the same messages sent."""
    store = MemoryStore()
    session = PersistentSession(store, "cli:r")
    with session._guard():
        session._prepare()
        session._materialise()
        for kind, data in entries:
            session._write([(kind, dict(data))])
    restored = restore(store, "cli:r")
    assert sorted(session.state.failed) == sorted(restored.failed)
    assert session.chat_messages() == chat_messages(restored)
    assert session.state.model_history == restored.model_history
