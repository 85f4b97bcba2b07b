"""MultiContextManager against a real llama.cpp server (llama-cpp-python) on a tiny random model.

The model's replies are random word pieces (scripts/make_tiny_model.py), so these tests check
structure, never content: what was streamed is what was logged, every call's usage is there
(the server's counts, or an estimate marked as one), a fork is isolated, a compaction starts a
new segment, and a fresh process resumes exactly the history this one wrote. The tiny model
never ends a reply by itself, so every reply is ``max_tokens`` long, finish reason ``length``.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from helpers.logs import segment_lines
from terrarium.agent.multi_context_manager import MultiContextManager
from terrarium.errors import BadResponse, ContextNotFound, ContextTooLong
from terrarium.llm.vllm_client import VLLMClient, chars_to_tokens

from .conftest import N_CTX, LlamaServer

pytestmark = pytest.mark.real_model

MAX_TOKENS = 8
PARAMS = {"max_tokens": MAX_TOKENS, "temperature": 0.0}
SYSTEM = "You are a tiny test model."
SRC = Path(__file__).resolve().parents[2] / "src"


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


def manager_for(server: LlamaServer, root: Path, **kwargs: Any) -> MultiContextManager:
    client = VLLMClient(server.root_url, max_retries=0, default_params=PARAMS)
    return MultiContextManager(client, storage_dir=str(root), **kwargs)


def entries(root: Path, context: str, kind: str) -> list[dict[str, Any]]:
    return [line for line in segment_lines(root, context) if line.get("kind") == kind]


def test_plain_turn_logs_reply_usage_and_finish(llama_server: LlamaServer, root: Path) -> None:
    """A plain turn returns the reply, logs it after the input, and records the server's own
    usage for it (no estimate) under the model id the server reports: the GGUF's path."""

    async def main() -> str:
        async with manager_for(llama_server, root) as manager:
            reply = await manager.process_with_context("cli:main", "hello there", SYSTEM)
            assert manager.client.model == str(llama_server.model_path)
            return reply

    reply = run(main())
    assert reply.strip()

    async def stats() -> tuple[list[Any], dict[str, Any]]:
        async with manager_for(llama_server, root) as manager:
            return manager.history("cli:main"), manager.get_stats("cli:main")

    history, data = run(stats())
    assert history == [
        {"role": "user", "content": "hello there"},
        {"role": "assistant", "content": reply},
    ]
    assert data["turns"] == 1 and data["last_run"] == "completed"
    assert data["system_prompt"] == SYSTEM
    usage = data["usage"]
    assert usage["calls"] == 1 and usage["estimated_calls"] == 0
    assert usage["completion_tokens"] == MAX_TOKENS
    assert usage["prompt_tokens"] > chars_to_tokens("hello there")  # the template's tokens too
    (logged,) = entries(root, "cli:main", "usage")
    assert logged["model"] == str(llama_server.model_path)
    assert "estimated" not in logged
    (completed,) = entries(root, "cli:main", "run_completed")
    assert completed["finish_reason"] == "length"


def test_streamed_turn_estimates_the_usage_the_server_omits(
    llama_server: LlamaServer, root: Path
) -> None:
    """A streamed turn logs exactly the text it yielded. The server ignores
    ``stream_options.include_usage`` and has no ``/tokenize``, so the turn's usage is the
    characters estimate, marked as one, and the stats keep it apart."""

    async def main() -> tuple[list[str], list[Any], dict[str, Any]]:
        async with manager_for(llama_server, root) as manager:
            deltas = [
                delta
                async for delta in manager.stream_with_context("cli:main", "stream please", SYSTEM)
            ]
            return deltas, manager.history("cli:main"), manager.get_stats("cli:main")

    deltas, history, data = run(main())
    assert len(deltas) > 1  # token by token, not one block
    assert history == [
        {"role": "user", "content": "stream please"},
        {"role": "assistant", "content": "".join(deltas)},
    ]
    usage = data["usage"]
    assert usage["calls"] == usage["estimated_calls"] == 1
    assert usage["estimated_completion_tokens"] == usage["completion_tokens"]
    assert usage["completion_tokens"] == chars_to_tokens("".join(deltas))
    (logged,) = entries(root, "cli:main", "usage")
    assert logged["estimated"] == "chars"
    assert logged["model"] == str(llama_server.model_path)
    (completed,) = entries(root, "cli:main", "run_completed")
    assert completed["finish_reason"] == "length"


def test_fork_then_compaction(llama_server: LlamaServer, root: Path) -> None:
    """A fork copies the history and then goes its own way; a compaction replaces the older
    turns with the model's summary on a new segment, keeps the last turn, counts its call, and
    the conversation goes on after it."""

    async def main() -> None:
        async with manager_for(llama_server, root, keep_after_compaction=2) as manager:
            for text in ("first", "second", "third"):
                await manager.process_with_context("cli:main", text, SYSTEM)
            before = manager.history("cli:main")
            assert [m["role"] for m in before] == ["user", "assistant"] * 3

            forked = manager.fork_context("cli:main", "cli:branch")
            assert forked["message_count"] == 6
            streamed = [d async for d in manager.stream_with_context("cli:branch", "only here")]
            branch = manager.history("cli:branch")
            assert branch[:6] == before
            assert branch[6:] == [
                {"role": "user", "content": "only here"},
                {"role": "assistant", "content": "".join(streamed)},
            ]
            assert manager.history("cli:main") == before

            summary = await manager.compact_context("cli:main")
            compacted = manager.history("cli:main")
            assert compacted[0] == {
                "role": "user",
                "content": f"[Summary of the conversation so far]\n{summary}",
            }
            assert compacted[1]["role"] == "assistant"
            assert compacted[2:] == before[-2:]
            data = manager.get_stats("cli:main")
            assert data["segments"] == 2 and data["system_prompt"] == SYSTEM
            assert data["usage"]["calls"] == 4  # three turns and the summary

            reply = await manager.process_with_context("cli:main", "after the summary")
            assert manager.history("cli:main")[4:] == [
                {"role": "user", "content": "after the summary"},
                {"role": "assistant", "content": reply},
            ]
            assert manager.get_stats("cli:main")["usage"]["calls"] == 5
            # a fork's figures are its own: the parent's calls stay the parent's
            assert manager.get_stats("cli:branch")["usage"]["calls"] == 1

    run(main())


RESUME = textwrap.dedent(
    """
    import asyncio, json, sys
    sys.path.insert(0, sys.argv[1])
    from terrarium.agent.multi_context_manager import MultiContextManager
    from terrarium.llm.vllm_client import VLLMClient

    async def main():
        client = VLLMClient(sys.argv[3], max_retries=0, default_params={params})
        async with MultiContextManager(client, storage_dir=sys.argv[2]) as manager:
            before = manager.history("cli:main"), manager.get_stats("cli:main")
            deltas = [d async for d in manager.stream_with_context("cli:main", "resumed")]
            after = manager.history("cli:main"), manager.get_stats("cli:main")
        print(json.dumps({{"before": before, "deltas": deltas, "after": after}}))

    asyncio.run(main())
    """
).format(params=PARAMS)


def test_resume_in_a_fresh_process(llama_server: LlamaServer, root: Path) -> None:
    """Another process restores the history and stats this one wrote, byte for byte, and its
    streamed turn continues it: sent with the whole history, seen here afterwards."""

    async def main() -> tuple[list[Any], dict[str, Any]]:
        async with manager_for(llama_server, root) as manager:
            await manager.process_with_context("cli:main", "one", SYSTEM)
            _ = [d async for d in manager.stream_with_context("cli:main", "two")]
            return manager.history("cli:main"), manager.get_stats("cli:main")

    history, data = run(main())
    child = subprocess.run(
        [sys.executable, "-c", RESUME, str(SRC), str(root), llama_server.root_url],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert child.returncode == 0, child.stderr
    seen = json.loads(child.stdout)
    seen_history, seen_stats = seen["before"]
    assert seen_history == history
    for key in ("message_count", "turns", "usage", "segment_id", "system_prompt", "last_run"):
        assert seen_stats[key] == data[key], key
    after_history, after_stats = seen["after"]
    assert after_history == [
        *history,
        {"role": "user", "content": "resumed"},
        {"role": "assistant", "content": "".join(seen["deltas"])},
    ]
    assert after_stats["turns"] == 3 and after_stats["usage"]["calls"] == 3

    async def reread() -> list[Any]:
        async with manager_for(llama_server, root) as manager:
            return manager.history("cli:main")

    assert run(reread()) == after_history


def test_prompt_past_the_context_window(llama_server: LlamaServer, root: Path) -> None:
    """A prompt longer than the server's window fails as ContextTooLong (the server words it as
    OpenAI does). As a new context's first turn it leaves nothing; after an answered turn the
    input stays logged, marked failed, with an errored run naming the limit."""
    too_long = " ".join(["word"] * (N_CTX + 100))  # one token per "▁word"

    async def main() -> None:
        async with manager_for(llama_server, root) as manager:
            with pytest.raises(ContextTooLong):
                await manager.process_with_context("cli:new", too_long, SYSTEM)
            with pytest.raises(ContextNotFound):
                manager.get_stats("cli:new")
            reply = await manager.process_with_context("cli:main", "hello", SYSTEM)
            with pytest.raises(ContextTooLong):
                await manager.process_with_context("cli:main", too_long)
            data = manager.get_stats("cli:main")
            assert data["last_run"] == "errored"
            assert "maximum context length" in data["last_error"]
            assert manager.failed_input("cli:main") == too_long
            assert manager.history("cli:main") == [
                {"role": "user", "content": "hello"},
                {"role": "assistant", "content": reply},
                {"role": "user", "content": too_long},
            ]

    run(main())


def test_streamed_prompt_past_the_window_is_a_cut_stream(
    llama_server: LlamaServer, root: Path
) -> None:
    """Streamed, the same prompt gets HTTP 200 and a stream that ends before any chunk (the
    server raises after sending its headers): a BadResponse, not retried, logged as errored."""
    too_long = " ".join(["word"] * (N_CTX + 100))

    async def main() -> None:
        client = VLLMClient(llama_server.root_url, max_retries=2, backoff_base=0.001)
        async with MultiContextManager(client, storage_dir=str(root)) as manager:
            assert (await manager.process_with_context("cli:main", "hello", **PARAMS)).strip()
            with pytest.raises(BadResponse, match="ended after 0 chunks"):
                _ = [d async for d in manager.stream_with_context("cli:main", too_long)]
            data = manager.get_stats("cli:main")
            assert data["last_run"] == "errored"
            assert data["usage"]["calls"] == 1  # the answered turn only
            reply = await manager.process_with_context("cli:other", "still serving", **PARAMS)
            assert reply.strip()

    run(main())


def test_unknown_model_name_is_served_by_the_loaded_model(
    llama_server: LlamaServer, root: Path
) -> None:
    """The server answers any model name with the model it has, echoing the name asked for,
    so a wrong name is no ModelNotFound here: the turn succeeds under that name."""

    async def main() -> None:
        client = VLLMClient(llama_server.root_url, model="no-such-model", default_params=PARAMS)
        async with MultiContextManager(client, storage_dir=str(root)) as manager:
            assert (await manager.process_with_context("cli:main", "hi")).strip()

    run(main())
    (logged,) = entries(root, "cli:main", "usage")
    assert logged["model"] == "no-such-model"
    assert logged["completion_tokens"] == MAX_TOKENS
