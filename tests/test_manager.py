"""MultiContextManager over the real openai client, real HTTP and the fake model server."""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import terrarium
from fakeserver import FakeServer
from helpers.logs import segment_lines
from terrarium import FsStore, MemoryStore, restore
from terrarium.agent.multi_context_manager import MultiContextManager
from terrarium.errors import ContextNotFound, InvalidContextId, LLMError
from terrarium.llm.vllm_client import VLLMClient
from terrarium.model import ContextId

SRC = Path(__file__).resolve().parents[1] / "src"


def make_manager(server: FakeServer, root: Path, **kwargs: Any) -> MultiContextManager:
    client = VLLMClient(base_url=server.root_url, max_retries=0, backoff_base=0.001)
    return MultiContextManager(client, storage_dir=str(root), **kwargs)


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "sessions"


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_seed_api_example_end_to_end(fake_server: FakeServer, root: Path) -> None:
    """The seed's Python API example works as written and leaves a valid log on disk."""

    async def main() -> None:
        client = VLLMClient(base_url=fake_server.root_url)
        manager = MultiContextManager(client, storage_dir=str(root))
        response = await manager.process_with_context(
            context_id="irc:#python",
            user_message="What's a decorator?",
            system_prompt="You are a helpful IRC bot. Be concise.",
        )
        assert response == "echo: What's a decorator?"
        await manager.process_with_context("cli:main", "hello")
        contexts = manager.list_all_contexts()
        assert set(contexts) == {"irc", "cli"}
        (cli,) = contexts["cli"]
        assert cli["session_id"] == "main"
        assert cli["message_count"] == 2
        assert len(cli["date"]) == 10
        stats = manager.get_stats("cli:main")
        assert stats["context_id"] == "cli:main"
        assert stats["message_count"] == 2
        manager.clear_context("cli:main")
        assert manager.get_stats("cli:main")["message_count"] == 0
        assert manager.delete_context("cli:main") is True
        assert "cli" not in manager.list_all_contexts()
        await manager.aclose()

    run(main())
    folder = next((root / "irc").glob("*/#python"))
    assert (folder / "head.json").exists()
    lines = segment_lines(root, "irc:#python")
    assert [line["kind"] for line in lines] == [
        "header",
        "user_input",
        "item",
        "usage",
        "run_completed",
        "turn_end",
    ]
    assert [line["seq"] for line in lines] == list(range(6))
    assert lines[0]["system_prompt"] == "You are a helpful IRC bot. Be concise."
    assert lines[1]["item"] == {"role": "user", "content": "What's a decorator?"}
    assert lines[2]["item"]["content"] == "echo: What's a decorator?"
    assert lines[3]["prompt_tokens"] > 0
    assert not list((root / "cli").glob("*/main"))


def test_short_forms_are_exported() -> None:
    """terrarium.MultiContextManager and terrarium.VLLMClient are the same classes."""
    assert terrarium.MultiContextManager is MultiContextManager
    assert terrarium.VLLMClient is VLLMClient


def test_invalid_context_id_writes_nothing(fake_server: FakeServer, root: Path) -> None:
    """A bad context id is a one-line InvalidContextId and nothing reaches the store."""
    manager = make_manager(fake_server, root)
    with pytest.raises(InvalidContextId, match="expected 'type:name'"):
        run(manager.process_with_context("nocolon", "hi"))
    assert manager.list_all_contexts() == {}
    assert fake_server.requests == []
    manager.close()


def test_stream_persists_like_process(fake_server: FakeServer, root: Path) -> None:
    """stream_with_context yields deltas and logs the same entries as process_with_context."""
    fake_server.chunks = 4

    async def main() -> list[str]:
        manager = make_manager(fake_server, root)
        deltas = [d async for d in manager.stream_with_context("web:s1", "tell me a story")]
        await manager.aclose()
        return deltas

    deltas = run(main())
    assert len(deltas) > 1
    assert "".join(deltas) == "echo: tell me a story"
    kinds = [line["kind"] for line in segment_lines(root, "web:s1")]
    assert kinds == ["header", "user_input", "item", "usage", "run_completed", "turn_end"]


def test_prefix_cache_friendly_requests(fake_server: FakeServer, root: Path) -> None:
    """Messages sent on turn n+1 start with exactly the messages sent on turn n."""

    async def main() -> None:
        manager = make_manager(fake_server, root)
        for i in range(5):
            await manager.process_with_context("cli:apc", f"turn {i}", system_prompt="sys")
        await manager.aclose()

    run(main())
    sent = [r["messages"] for r in fake_server.requests]
    assert len(sent) == 5
    for before, after in itertools.pairwise(sent):
        assert after[: len(before)] == before
        assert after[len(before)]["role"] == "assistant"
    assert sent[0] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "turn 0"},
    ]
    # Restarting the process (a new manager, cold cache) sends the very same prefix.
    seen = len(fake_server.requests)

    async def again() -> None:
        manager = make_manager(fake_server, root)
        await manager.process_with_context("cli:apc", "turn 5", system_prompt="sys")
        await manager.aclose()

    run(again())
    assert fake_server.requests[seen]["messages"][: len(sent[-1])] == sent[-1]


def test_server_error_keeps_input_and_logs_error(fake_server: FakeServer, root: Path) -> None:
    """A failed call leaves the input and an errored run in the log; the next call works."""

    async def main() -> None:
        manager = make_manager(fake_server, root)
        await manager.process_with_context("irc:#err", "zero")
        fake_server.fail_next(500)
        with pytest.raises(LLMError):
            await manager.process_with_context("irc:#err", "first")
        stats = manager.get_stats("irc:#err")
        assert stats["last_run"] == "errored"
        assert stats["last_error"]
        # the failed input stays, marked failed, and is not sent again (tests/test_failed_turns.py)
        assert await manager.process_with_context("irc:#err", "second") == "echo: second"
        await manager.aclose()

    run(main())
    kinds = [line["kind"] for line in segment_lines(root, "irc:#err")]
    assert kinds[6:8] == ["user_input", "run_errored"]
    assert kinds[-1] == "turn_end"
    with FsStore(root) as store:
        history = restore(store, "irc:#err").history
    assert [m["content"] for m in history][2:] == ["first", "second", "echo: second"]


@pytest.mark.parametrize("autosave", [True, False])
def test_a_new_context_begins_with_its_first_answered_turn(
    fake_server: FakeServer, root: Path, autosave: bool
) -> None:
    """A first turn the model did not answer at all (an error, a cancellation before any
    text) leaves no context; one with a reply, or part of one, creates it."""
    arrived, release = fake_server.hold_replies("late")

    async def main() -> None:
        manager = make_manager(fake_server, root, autosave=autosave)
        fake_server.fail_next(500)
        with pytest.raises(LLMError):
            await manager.process_with_context("cli:new", "lost in the void")
        task = asyncio.create_task(manager.process_with_context("cli:new", "cancelled too"))
        await asyncio.to_thread(arrived.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        for context in ("cli:new", "cli:other"):
            with pytest.raises(ContextNotFound):
                manager.get_stats(context)
        assert manager.list_all_contexts() == {}
        fake_server.reply = lambda messages: "hello back"
        assert await manager.process_with_context("cli:new", "hello") == "hello back"
        assert manager.get_stats("cli:new")["message_count"] == 2
        fake_server.chunks = 4
        fake_server.drop_next(after_chunks=2)  # one piece of the reply, then the stream ends
        with pytest.raises(LLMError):
            async for _ in manager.stream_with_context("cli:cut", "tell me"):
                pass
        manager.save()
        await manager.aclose()

    run(main())
    with FsStore(root) as store:
        assert [m["content"] for m in restore(store, "cli:new").history] == [
            "hello",
            "hello back",
        ]
        cut = restore(store, "cli:cut")
    assert [m["content"] for m in cut.history] == ["tell me"]  # kept, with its partial reply
    errored = [line for line in segment_lines(root, "cli:cut") if line["kind"] == "run_errored"]
    assert errored[0]["partial"] == "hel"


def test_cancellation_is_logged(fake_server: FakeServer, root: Path) -> None:
    """A cancelled call keeps the input, logs the run as errored 'cancelled', and recovers."""

    async def main() -> None:
        manager = make_manager(fake_server, root)
        await manager.process_with_context("cli:slow", "hello")
        arrived, release = fake_server.hold_replies()
        task = asyncio.create_task(manager.process_with_context("cli:slow", "wait"))
        await asyncio.to_thread(arrived.wait, 30)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        release.set()
        fake_server.reply = lambda messages: f"echo: {messages[-1]['content']}"
        assert await manager.process_with_context("cli:slow", "now") == "echo: now"
        await manager.aclose()

    run(main())
    lines = segment_lines(root, "cli:slow")
    errored = next(line for line in lines if line["kind"] == "run_errored")
    assert errored["error"] == "cancelled"
    assert [line["item"]["content"] for line in lines if "item" in line][2] == "wait"


def test_cancelled_while_waiting_for_the_store_lock(fake_server: FakeServer, root: Path) -> None:
    """A turn cancelled while its worker thread waits for the context's store lock (another
    process's turn) releases that lock once the thread gets it: the next turn runs."""

    async def main() -> None:
        manager = make_manager(fake_server, root)
        await manager.process_with_context("cli:held", "first")
        context = ContextId.parse("cli:held")
        other = FsStore(root)  # another process's turn, holding the context's lock
        holder = other.lock_context(context)
        holder.__enter__()
        task = asyncio.create_task(manager.process_with_context("cli:held", "dropped"))
        await asyncio.sleep(0.2)  # the turn's thread is waiting in flock
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        holder.__exit__(None, None, None)  # now that thread gets the lock, then lets go
        reply = await asyncio.wait_for(manager.process_with_context("cli:held", "next"), 10)
        assert reply == "echo: next"
        other.close()
        await manager.aclose()

    run(main())
    with FsStore(root) as store:
        history = restore(store, "cli:held").history
    users = [m["content"] for m in history if m["role"] == "user"]
    assert users == ["first", "next"]  # the cancelled turn wrote nothing


def _concurrent_turns(server: FakeServer, contexts: int, turns: int) -> None:
    """``contexts`` contexts x ``turns`` turns at once on a cache of 10, plus 40 interleaved
    calls on one context: all kept, in order."""
    store = MemoryStore()

    async def main() -> None:
        client = VLLMClient(base_url=server.root_url, max_retries=0)
        manager = MultiContextManager(client, store=store, cache_size=10)

        async def converse(n: int) -> None:
            for turn in range(turns):
                reply = await manager.process_with_context(f"web:c{n}", f"c{n} t{turn}")
                assert reply == f"echo: c{n} t{turn}"

        shared = [manager.process_with_context("web:shared", f"s{i}") for i in range(40)]
        await asyncio.gather(*(converse(n) for n in range(contexts)), *shared)
        await manager.aclose()

    run(main())
    for n in range(contexts):
        history = restore(store, f"web:c{n}").history
        expected: list[str] = []
        for turn in range(turns):
            expected += [f"c{n} t{turn}", f"echo: c{n} t{turn}"]
        assert [m["content"] for m in history] == expected
    shared_history = [m["content"] for m in restore(store, "web:shared").history]
    # Arrival order is creation order of the coroutines: s0, s1, ... each followed by its echo.
    assert shared_history == [x for i in range(40) for x in (f"s{i}", f"echo: s{i}")]


def test_concurrent_contexts_and_same_context_ordering(fake_server: FakeServer) -> None:
    """25 contexts x 6 turns at once (more contexts than the cache holds), plus interleaved
    calls on one context: all kept, in order."""
    _concurrent_turns(fake_server, 25, 6)


@pytest.mark.slow
def test_concurrent_contexts_and_same_context_ordering_long(fake_server: FakeServer) -> None:
    """The same, 50 contexts x 20 turns."""
    _concurrent_turns(fake_server, 50, 20)


def test_cache_eviction_and_external_writes(fake_server: FakeServer, root: Path) -> None:
    """Evicted contexts lose nothing; a write by another process is seen on next use."""

    async def main() -> None:
        manager = make_manager(fake_server, root, cache_size=2, autosave=False)
        for n in range(5):
            await manager.process_with_context(f"cli:e{n}", f"hello {n}")
        # Evicted contexts were saved on eviction; the two cached ones still wait for save().
        assert manager.get_stats("cli:e4")["unsaved_entries"] > 0
        assert manager.save() > 0
        for n in range(5):
            assert manager.history(f"cli:e{n}")[-1]["content"] == f"echo: hello {n}"

        other = make_manager(fake_server, root)
        await other.process_with_context("cli:e4", "from elsewhere")
        await other.aclose()
        manager.set_autosave("cli:e4", True)
        reply = await manager.process_with_context("cli:e4", "and me")
        assert reply == "echo: and me"
        await manager.aclose()

    run(main())
    with FsStore(root) as store:
        for n in range(5):
            assert restore(store, f"cli:e{n}").history[1]["content"] == f"echo: hello {n}"
        contents = [m["content"] for m in restore(store, "cli:e4").history]
    assert contents == [
        "hello 4",
        "echo: hello 4",
        "from elsewhere",
        "echo: from elsewhere",
        "and me",
        "echo: and me",
    ]
    # and the last request carried the other process's turn
    assert fake_server.requests[-1]["messages"][-2]["content"] == "echo: from elsewhere"


def test_autosave_off_keeps_entries_until_save(fake_server: FakeServer, root: Path) -> None:
    """With autosave off, nothing but the context header is written until save()."""

    async def main() -> None:
        manager = make_manager(fake_server, root, autosave=False)
        await manager.process_with_context("cli:draft", "one")
        stats = manager.get_stats("cli:draft")
        assert stats["autosave"] is False
        assert stats["unsaved_entries"] == 5
        assert [line["kind"] for line in segment_lines(root, "cli:draft")] == ["header"]
        assert manager.save("cli:draft") == 5
        assert manager.get_stats("cli:draft")["unsaved_entries"] == 0
        await manager.aclose()

    run(main())
    assert len(segment_lines(root, "cli:draft")) == 6


def test_fork_and_compact(fake_server: FakeServer, root: Path) -> None:
    """fork_context copies history into an isolated context; compact_context summarises."""

    async def main() -> None:
        manager = make_manager(fake_server, root, keep_after_compaction=2)
        for i in range(3):
            await manager.process_with_context("cli:main", f"m{i}", system_prompt="sys")
        stats = manager.fork_context("cli:main", "cli:experiment")
        assert stats["message_count"] == 6
        await manager.process_with_context("cli:experiment", "only here")
        assert len(manager.history("cli:main")) == 6

        fake_server.reply = "SUMMARY"
        summary = await manager.compact_context("cli:main")
        assert summary == "SUMMARY"
        history = manager.history("cli:main")
        assert history[0]["content"].endswith("SUMMARY")
        assert [m["content"] for m in history[-2:]] == ["m2", "echo: m2"]
        stats = manager.get_stats("cli:main")
        assert stats["segments"] == 2
        assert stats["system_prompt"] == "sys"
        await manager.aclose()

    run(main())


def test_automatic_compaction_on_token_budget(fake_server: FakeServer, root: Path) -> None:
    """A turn whose prompt would pass the token budget compacts the context first."""

    def reply(messages: list[dict[str, Any]]) -> str:
        if "Summarise the conversation" in str(messages[-1]["content"]):
            return "short summary"
        return "x" * 400

    fake_server.reply = reply

    async def main() -> None:
        manager = make_manager(fake_server, root, token_budget=300, keep_after_compaction=0)
        for i in range(6):
            await manager.process_with_context("irc:#busy", f"q{i}")
        stats = manager.get_stats("irc:#busy")
        assert stats["segments"] > 1
        assert stats["message_count"] < 12
        await manager.aclose()

    run(main())


def test_missing_context_errors(fake_server: FakeServer, root: Path) -> None:
    """Stats, clear and history of an unknown context raise ContextNotFound."""
    manager = make_manager(fake_server, root)
    with pytest.raises(ContextNotFound):
        manager.get_stats("cli:nope")
    with pytest.raises(ContextNotFound):
        manager.clear_context("cli:nope")
    assert manager.delete_context("cli:nope") is False
    manager.close()


def test_trace_written_when_enabled(fake_server: FakeServer, root: Path) -> None:
    """trace=True writes raw stream events beside the segment; off by default."""

    async def main() -> None:
        manager = make_manager(fake_server, root, trace=True)
        _ = [d async for d in manager.stream_with_context("cli:t", "trace me")]
        await manager.aclose()

    run(main())
    traces = list(root.glob("cli/*/t/*.trace.jsonl"))
    assert len(traces) == 1
    events = [json.loads(line)["event"] for line in traces[0].read_text().splitlines()]
    assert events[0] == "request"
    assert "chunk" in events


CHILD = textwrap.dedent(
    """
    import asyncio, sys
    sys.path.insert(0, sys.argv[1])
    from terrarium.agent.multi_context_manager import MultiContextManager
    from terrarium.llm.vllm_client import VLLMClient

    async def main():
        client = VLLMClient(base_url=sys.argv[2], max_retries=0)
        manager = MultiContextManager(client, storage_dir=sys.argv[3])
        for i in range(int(sys.argv[5])):
            for c in range(3):
                await manager.process_with_context(f"cli:shared{c}", f"{sys.argv[4]}-{i}")
        await manager.aclose()

    asyncio.run(main())
    """
)


def test_two_processes_share_one_storage_dir(fake_server: FakeServer, root: Path) -> None:
    """Two processes on the same contexts: every turn kept once, each reply after its input."""
    turns = 15
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                CHILD,
                str(SRC),
                fake_server.root_url,
                str(root),
                name,
                str(turns),
            ]
        )
        for name in ("a", "b")
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    with FsStore(root) as store:
        for c in range(3):
            history = [m["content"] for m in restore(store, f"cli:shared{c}").history]
            assert len(history) == 4 * turns
            for question, answer in zip(history[::2], history[1::2], strict=True):
                assert answer == f"echo: {question}"
            assert sorted(history[::2]) == sorted(f"{p}-{i}" for p in "ab" for i in range(turns))


def test_search_and_listing_without_restores(fake_server: FakeServer, root: Path) -> None:
    """manager.search finds saved turns; list_all_contexts counts unsaved ones too."""

    async def main() -> None:
        manager = make_manager(fake_server, root)
        await manager.process_with_context("irc:#python", "what is a metaclass?")
        await manager.process_with_context("cli:main", "hello there")
        hits = manager.search("metaclass")
        assert sorted((h.context, h.role) for h in hits) == [
            ("irc:#python", "assistant"),
            ("irc:#python", "user"),
        ]
        assert manager.search("metaclass", role="user")[0].seq == 1
        manager.set_autosave("cli:main", False)
        await manager.process_with_context("cli:main", "not saved yet")
        listed = {
            i["context_id"]: i for items in manager.list_all_contexts().values() for i in items
        }
        assert listed["cli:main"]["message_count"] == 4
        assert listed["irc:#python"]["message_count"] == 2
        await manager.aclose()

    run(main())


def test_a_message_kept_in_a_blob_is_sent_whole_on_the_next_turn(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    """A message over the store's ``blob_threshold`` is logged as a preview and a blob; the
    live conversation still holds it whole, so the next turn sends the model all of it."""
    long = "word " * 2_000  # 10,000 characters: over the threshold below
    store = FsStore(tmp_path / "sessions", blob_threshold=1024)

    async def main() -> None:
        client = VLLMClient(base_url=fake_server.root_url, max_retries=0)
        manager = MultiContextManager(client, store=store)
        for message in ("hello", long, "and again"):  # the first turn of a context is held
            await manager.process_with_context("cli:big", message)
        await manager.aclose()

    run(main())
    sent = [m["content"] for m in fake_server.requests[-1]["messages"] if m["role"] == "user"]
    assert sent == ["hello", long, "and again"]
    assert restore(store, "cli:big").history[2]["content"] == long
    store.close()
