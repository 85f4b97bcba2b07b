"""A failed or interrupted turn keeps the user's words and never breaks the next request.

A turn logs the user's input before the model is called. When the call fails (server down,
stream dropped, client raising, cancellation, Ctrl-C) the input stays in the log with a
``run_errored`` entry after it and no reply, so the next input follows a user message. The
runtime sends such a run of user messages as one (texts joined by a blank line), because strict
chat templates refuse two in a row; the log itself keeps every message as written.

Every test here talks to the fake server (``strict_roles``: it answers HTTP 400 to a request with
two user messages in a row, as vLLM does for such templates) through the real ``openai`` client.
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
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fakeserver import ROLES_MESSAGE, FakeServer
from helpers.logs import segment_lines as lines_of
from terrarium import ContextId, FsStore, SegmentStartState, create_segment, restore, save_delta
from terrarium.agent.multi_context_manager import MultiContextManager
from terrarium.errors import LLMError
from terrarium.llm.vllm_client import ChatResult, StreamEvent, VLLMClient
from terrarium.model import add_wire_message, wire_messages

TERRARIUM = [sys.executable, "-m", "terrarium.cli"]


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


# --------------------------------------------------------------------------- the command line


def test_cli_server_down_then_up_sends_the_kept_words(tmp_path: Path) -> None:
    """``echo hi | terrarium chat`` with the server down, then up: one user message, both texts."""
    root = tmp_path / "sessions"
    with FakeServer(strict_roles=True) as probe:
        port = probe.port  # a port that is free again once the probe stops
    down = f"http://127.0.0.1:{port}/v1"
    result = cli("chat", "cli:x", "--base-url", down, "--retries", "0", "--storage-dir",
                 str(root), stdin="hi\n", cwd=tmp_path)  # fmt: skip
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    [errored] = errored_lines(root, "cli:x")
    assert errored["error"] and errored["error_type"]

    with FakeServer(strict_roles=True, port=port) as server:
        result = cli("chat", "cli:x", "--base-url", server.base_url, "--storage-dir", str(root),
                     stdin="there\n", cwd=tmp_path)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert server.last_request["messages"] == [{"role": "user", "content": "hi\n\nthere"}]
        result = cli("chat", "cli:x", "--base-url", server.base_url, "--storage-dir", str(root),
                     stdin="and on\n", cwd=tmp_path)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout == "echo: and on\n"
    assert [m["content"] for m in history_of(root, "cli:x")] == [
        "hi",
        "there",
        "echo: hi\n\nthere",
        "and on",
        "echo: and on",
    ]


def test_cli_sigint_mid_reply_from_a_pipe_is_logged(tmp_path: Path, strict: FakeServer) -> None:
    """Ctrl-C (SIGINT) while a piped chat waits for a reply: the run is logged as cancelled."""
    root = tmp_path / "sessions"
    arrived, release = strict.hold_replies()
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    args = ["chat", "cli:p", "--base-url", strict.base_url, "--storage-dir", str(root)]
    child = subprocess.Popen(
        [*TERRARIUM, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        assert child.stdin is not None
        child.stdin.write("wait for it\n")
        child.stdin.flush()
        assert arrived.wait(30)
        child.send_signal(signal.SIGINT)
        child.communicate(timeout=30)
    finally:
        release.set()
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode != 0
    [errored] = errored_lines(root, "cli:p")
    assert errored["error"] == "cancelled"
    strict.reply = lambda messages: "fine"
    result = cli(*args, stdin="again\n", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert strict.last_request["messages"] == [{"role": "user", "content": "wait for it\n\nagain"}]


# --------------------------------------------------------------------------- the manager


def test_stream_dropped_mid_reply_then_the_next_turn(root: Path, strict: FakeServer) -> None:
    """A dropped stream keeps the partial text in ``run_errored`` only; the next turn folds."""
    strict.chunks = 5
    strict.drop_next(after_chunks=3)

    async def main() -> list[str]:
        manager = make_manager(strict, root)
        got: list[str] = []
        with pytest.raises(LLMError):
            async for delta in manager.stream_with_context("game:r", "go on"):
                got.append(delta)
        assert await manager.process_with_context("game:r", "again") == "echo: go on\n\nagain"
        await manager.aclose()
        return got

    got = asyncio.run(main())
    [errored] = errored_lines(root, "game:r")
    assert got and errored["partial"] == "".join(got)
    sent = strict.last_request["messages"]
    assert sent == [{"role": "user", "content": "go on\n\nagain"}]
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
    """Whatever the client raises is logged with its reason; the next request has both texts."""

    async def turn(manager: MultiContextManager, text: str) -> str:
        if stream:
            return "".join([d async for d in manager.stream_with_context("irc:#c", text)])
        return await manager.process_with_context("irc:#c", text)

    async def main() -> None:
        client = FlakyClient(base_url=strict.root_url, max_retries=0)
        async with MultiContextManager(client, storage_dir=str(root)) as manager:
            with pytest.raises(RuntimeError, match="client bug"):
                await turn(manager, "first")
            assert manager.get_stats("irc:#c")["last_error"] == "client bug"
            assert await turn(manager, "second") == "echo: first\n\nsecond"
            assert await turn(manager, "third") == "echo: third"

    asyncio.run(main())
    [errored] = errored_lines(root, "irc:#c")
    assert (errored["error"], errored["error_type"]) == ("client bug", "RuntimeError")
    assert strict.last_request["messages"] == [
        {"role": "user", "content": "first\n\nsecond"},
        {"role": "assistant", "content": "echo: first\n\nsecond"},
        {"role": "user", "content": "third"},
    ]


def test_a_cancelled_task_is_logged_and_the_next_turn_folds(root: Path, strict: FakeServer) -> None:
    """A task cancelled around ``stream_with_context`` logs ``cancelled``; cancellation goes on."""
    arrived, release = strict.hold_replies()

    async def main() -> None:
        manager = make_manager(strict, root)

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
    assert strict.last_request["messages"] == [{"role": "user", "content": "wait\n\nnow"}]


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
        assert await manager.process_with_context("cli:b", "short") == "echo: tell me all\n\nshort"
        await manager.aclose()

    asyncio.run(main())


def test_a_failed_compaction_keeps_the_input(root: Path, strict: FakeServer) -> None:
    """The automatic compaction before a turn fails: the input is still logged, with the error."""

    async def main() -> None:
        manager = make_manager(strict, root, token_budget=30, keep_after_compaction=2)
        await manager.process_with_context("cli:c", "x" * 60)
        strict.fail_next(500)
        with pytest.raises(LLMError):
            await manager.process_with_context("cli:c", "the words to keep")
        assert manager.history("cli:c")[-1]["content"] == "the words to keep"
        await manager.process_with_context("cli:c", "next")
        await manager.aclose()

    asyncio.run(main())
    assert "the words to keep" in json.dumps(strict.requests)
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
    """The cached manager and a restore in another process send the same folded messages."""

    async def main() -> None:
        manager = make_manager(strict, root, default_system_prompt="Be brief.")
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
    third = strict.requests[-1]["messages"]
    assert third == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "one\n\ntwo\n\nthree"},
        {"role": "assistant", "content": "echo: one\n\ntwo\n\nthree"},
        {"role": "user", "content": "four"},
    ]
    written = [line["item"] for line in lines_of(root, "cli:f") if "item" in line]
    assert history_of(root, "cli:f") == written  # restore gives back the log, unfolded
    assert [m["content"] for m in written[:3]] == ["one", "two", "three"]

    result = cli("chat", "cli:f", "--base-url", strict.base_url, "--storage-dir", str(root),
                 stdin="five\n", cwd=root.parent)  # fmt: skip
    assert result.returncode == 0, result.stderr
    fifth = strict.last_request["messages"]
    assert fifth[: len(third)] == third
    assert fifth[len(third) :] == [
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
    strict.fail_next(503)

    async def main() -> None:
        manager = make_manager(strict, root)
        with pytest.raises(LLMError):
            await manager.process_with_context("irc:#r", "ping?")
        assert await manager.process_with_context("irc:#r", "ping?") == "echo: ping?"
        await manager.aclose()

    asyncio.run(main())
    assert strict.last_request["messages"] == [{"role": "user", "content": "ping?"}]
    assert [m["content"] for m in history_of(root, "irc:#r")] == ["ping?", "ping?", "echo: ping?"]


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
