"""Usage is never silently undercounted: VLLMClient against the fake server, over real HTTP.

Streams ask for usage (``stream_options``), a server refusing that option is asked again
without it, and a reply still without usage gets an estimate: the server's ``/tokenize`` (vLLM
or llama.cpp style) when it has one, else characters / 4.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner

from fakeserver import (
    FakeReply,
    FakeServer,
    FakeToolCall,
    count_tokens,
    tokenize_messages,
    tokenize_text,
)
from helpers.logs import segment_lines
from terrarium import (
    ContextId,
    FsStore,
    PodActiveSegmentRef,
    contexts,
    create_segment,
    save_usage,
)
from terrarium.agent.multi_context_manager import MultiContextManager
from terrarium.cli import cli
from terrarium.llm import ChatResult, VLLMClient
from terrarium.llm.vllm_client import chars_to_tokens
from terrarium.model import TraceEntry, UsageRecord

T = TypeVar("T")

HELLO = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello there, model!"},
]
REPLY = "echo: Hello there, model!"
PROMPT_TEXT = "You are terse.\nHello there, model!"


def run(server: FakeServer, body: Callable[[VLLMClient], Awaitable[T]], **options: Any) -> T:
    """``body(client)`` in a fresh event loop with a client for ``server``, then closed."""
    options.setdefault("backoff_base", 0.001)
    options.setdefault("timeout", 10.0)

    async def main() -> T:
        async with VLLMClient(server.root_url, **options) as client:
            return await body(client)

    return asyncio.run(main())


async def streamed(client: VLLMClient, messages: list[dict[str, Any]] = HELLO) -> ChatResult:
    """The final result of one stream."""
    results = [e.result async for e in client.stream(messages) if e.result is not None]
    assert len(results) == 1
    return results[0]


async def turns(client: VLLMClient, how: str, n: int) -> list[ChatResult]:
    """``n`` calls in a row on one client, streamed or plain."""
    out = []
    for _ in range(n):
        out.append(await streamed(client) if how == "stream" else await client.chat(HELLO))
    return out


# --------------------------------------------------------------------------- server usage


@pytest.mark.parametrize("how", ["stream", "plain"])
def test_server_usage_is_kept_and_nothing_is_estimated(fake_server: FakeServer, how: str) -> None:
    """When the server reports usage it is used as it is: no estimate, no /tokenize call."""
    fake_server.tokenizer = "vllm"
    (result,) = run(fake_server, lambda c: turns(c, how, 1))
    assert result.usage == UsageRecord("fake-model", count_tokens(HELLO), len(REPLY) // 4 + 1)
    assert result.usage.estimated is None
    assert "estimated" not in result.usage.to_dict()
    assert fake_server.tokenize_requests == []


def test_streams_ask_for_usage_with_stream_options(fake_server: FakeServer) -> None:
    """A stream asks for usage (``include_usage``), keeping the caller's other stream options;
    a server that sends usage only when asked then reports it exactly."""

    async def body(client: VLLMClient) -> ChatResult:
        events = [e async for e in client.stream(HELLO, stream_options={"continuous": True})]
        result = events[-1].result
        assert result is not None
        return result

    result = run(fake_server, body)
    assert fake_server.last_request["stream_options"] == {"continuous": True, "include_usage": True}
    assert result.usage is not None and result.usage.estimated is None
    assert result.usage.prompt_tokens == count_tokens(HELLO)


# --------------------------------------------------------------------------- stream_options


def test_refused_stream_options_are_dropped_once_and_remembered() -> None:
    """A server that refuses ``stream_options`` (400 naming it) is asked again at once without
    it, within the same try (``max_retries=0`` still succeeds), and this client never sends it
    again; the usage it then lacks is estimated."""
    entries: list[TraceEntry] = []
    with FakeServer(reject_stream_options=True) as server:
        first, second = run(
            server, lambda c: turns(c, "stream", 2), max_retries=0, on_trace=entries.append
        )
        sent = server.requests
    assert ["stream_options" in r for r in sent] == [True, False, False]
    assert first.text == second.text == REPLY
    for result in (first, second):
        assert result.usage is not None and result.usage.estimated == "chars"
    errors = [e for e in entries if e.event == "error"]
    assert len(errors) == 1 and errors[0].data["retrying"] is True
    assert "stream_options" in errors[0].data["message"]


def test_other_bad_requests_are_not_mistaken_for_refused_stream_options() -> None:
    """A 400 that does not name ``stream_options`` is an error as before, asked once."""
    from terrarium.errors import ContextTooLong

    with FakeServer() as server:
        server.fail_next(400)
        with pytest.raises(ContextTooLong):
            run(server, lambda c: turns(c, "stream", 1), max_retries=0)
        assert len(server.requests) == 1


# --------------------------------------------------------------------------- tokenizers


@pytest.mark.parametrize("how", ["stream", "plain"])
def test_missing_usage_is_counted_by_a_vllm_tokenizer(how: str) -> None:
    """vLLM's /tokenize (at the server root) counts the prompt as chat messages and the reply
    as text without special tokens; the probe is made once per client."""
    with FakeServer(usage_in_streams=False, usage_in_replies=False, tokenizer="vllm") as server:
        first, second = run(server, lambda c: turns(c, how, 2))
        asked = server.tokenize_requests
    expected = UsageRecord(
        "fake-model",
        tokenize_messages(HELLO),
        len(tokenize_text(REPLY)),
        estimated="tokenizer",
    )
    assert first.usage == second.usage == expected
    probe, prompt, reply = asked[:3]
    assert probe == {"model": "fake-model", "prompt": "Hi"}
    assert prompt == {"model": "fake-model", "messages": HELLO}
    assert reply == {"model": "fake-model", "prompt": REPLY, "add_special_tokens": False}
    assert asked[3:] == [prompt, reply]  # no second probe


@pytest.mark.parametrize("how", ["stream", "plain"])
def test_missing_usage_is_counted_by_a_llamacpp_tokenizer(how: str) -> None:
    """llama.cpp's /tokenize (``{"content"}`` -> ``{"tokens"}``) is found after vLLM's style
    gave no count; the prompt is its messages' texts, the reply its text."""
    with FakeServer(usage_in_streams=False, usage_in_replies=False, tokenizer="llamacpp") as server:
        first, second = run(server, lambda c: turns(c, how, 2))
        asked = server.tokenize_requests
    expected = UsageRecord(
        "fake-model",
        len(tokenize_text(PROMPT_TEXT)),
        len(tokenize_text(REPLY)),
        estimated="tokenizer",
    )
    assert first.usage == second.usage == expected
    assert asked[:2] == [{"model": "fake-model", "prompt": "Hi"}, {"content": "Hi"}]
    assert asked[2:] == [{"content": PROMPT_TEXT}, {"content": REPLY}] * 2


@pytest.mark.parametrize("how", ["stream", "plain"])
def test_without_a_tokenizer_usage_is_estimated_from_characters(how: str) -> None:
    """No /tokenize: four characters a token, rounded up; the server is probed only once."""
    with FakeServer(usage_in_streams=False, usage_in_replies=False) as server:
        first, second = run(server, lambda c: turns(c, how, 2))
        asked = server.tokenize_requests
    expected = UsageRecord(
        "fake-model", math.ceil(len(PROMPT_TEXT) / 4), math.ceil(len(REPLY) / 4), estimated="chars"
    )
    assert first.usage == second.usage == expected
    assert len(asked) == 2  # both probe styles once, then never again


def test_chars_estimate_counts_tool_calls_and_reasoning() -> None:
    """A reply of tool calls and reasoning is not estimated as zero tokens."""
    reply = FakeReply(reasoning="think hard", tool_calls=[FakeToolCall("get", '{"q": "x"}')])
    with FakeServer(usage_in_streams=False) as server:
        server.reply = reply
        (result,) = run(server, lambda c: turns(c, "stream", 1))
    assert result.usage is not None
    assert result.usage.completion_tokens == chars_to_tokens('think hard\nget\n{"q": "x"}')
    assert chars_to_tokens("") == 0 and chars_to_tokens("abcde") == 2


@pytest.mark.parametrize("how", ["stream", "plain"])
def test_a_failing_tokenizer_never_fails_the_turn(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A tokenizer answering 500 gives a chars estimate and a logged warning, the reply intact;
    a passing failure is probed again next call, and a tokenizer failing after a good probe
    is used again once it recovers."""
    with FakeServer(usage_in_streams=False, usage_in_replies=False, tokenizer="vllm") as server:
        server.tokenizer_status = 500

        async def body(client: VLLMClient) -> list[ChatResult]:
            results = await turns(client, how, 1)
            server.tokenizer_status = None
            results += await turns(client, how, 1)  # probed again: now it works
            server.tokenizer_status = 503
            results += await turns(client, how, 1)  # fails after a good probe
            server.tokenizer_status = None
            results += await turns(client, how, 1)  # used again, no new probe
            return results

        with caplog.at_level(logging.WARNING, logger="terrarium.llm.vllm_client"):
            results = run(server, body)
        asked = server.tokenize_requests
    assert [r.text for r in results] == [REPLY] * 4
    assert [r.usage.estimated if r.usage else None for r in results] == [
        "chars",
        "tokenizer",
        "chars",
        "tokenizer",
    ]
    assert sum(1 for r in asked if r.get("prompt") == "Hi") == 2  # one failed probe, one good
    assert "usage estimated from characters" in caplog.text


# --------------------------------------------------------------------------- the log and stats


def usage_lines(store_root: Path, context: str) -> list[dict[str, Any]]:
    """The ``usage`` entries of a context's head segment on disk."""
    return [line for line in segment_lines(store_root, context) if line["kind"] == "usage"]


def test_turns_log_one_usage_entry_each_marked_when_estimated(tmp_path: Path) -> None:
    """Each turn logs exactly one usage entry: the server's when it sent one, else an estimate
    marked ``estimated``; stats count both and say how much was estimated, and the manager's
    in-memory totals equal a fresh replay."""
    root = tmp_path / "sessions"
    with FakeServer(usage_in_replies=False) as server:

        async def main() -> tuple[dict[str, Any], dict[str, Any]]:
            client = VLLMClient(server.root_url, max_retries=0)
            manager = MultiContextManager(client, storage_dir=str(root))
            await manager.process_with_context("cli:main", "Hello there, model!")
            async for _ in manager.stream_with_context("cli:main", "again"):
                pass  # streamed: the server reports usage when asked
            cached = manager.get_stats("cli:main")
            await manager.aclose()
            with FsStore(root) as store:
                return cached, contexts.get_stats(store, ContextId("cli", "main"))

        cached, fresh = asyncio.run(main())
    estimated, exact = usage_lines(root, "cli:main")
    assert estimated["estimated"] == "chars"
    assert "estimated" not in exact
    assert fresh["usage"] == cached["usage"]
    usage = fresh["usage"]
    assert usage["calls"] == 2 and usage["estimated_calls"] == 1
    assert usage["prompt_tokens"] == estimated["prompt_tokens"] + exact["prompt_tokens"]
    assert usage["estimated_prompt_tokens"] == estimated["prompt_tokens"] > 0
    assert usage["estimated_completion_tokens"] == estimated["completion_tokens"] > 0


def _seed_usage(root: Path) -> None:
    with FsStore(root) as store:
        for name, records in (
            ("cli:main", [EXACT_RECORD, ESTIMATED_RECORD]),
            ("cli:exact", [EXACT_RECORD]),
        ):
            session_id, segment_id = create_segment(store, context=name)
            for record in records:
                save_usage(store, PodActiveSegmentRef(session_id, segment_id), record)


EXACT_RECORD = UsageRecord("m", prompt_tokens=100, completion_tokens=20, cached_tokens=40)
ESTIMATED_RECORD = UsageRecord("m", prompt_tokens=30, completion_tokens=7, estimated="tokenizer")


def stats(*args: str) -> str:
    result = CliRunner().invoke(cli, ["stats", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_stats_mark_estimated_figures(tmp_path: Path) -> None:
    """``terrarium stats`` puts ``~`` before a figure that is partly estimated and says how
    much; figures the server reported all of stay bare; ``--json`` has the estimated part."""
    root = tmp_path / "sessions"
    _seed_usage(root)
    where = ("--storage-dir", str(root))
    one = stats("cli:main", *where)
    assert "~130 (40 cached, 30 estimated)" in one
    assert "~27 (7 estimated)" in one
    assert "2 (1 estimated)" in one
    exact = stats("cli:exact", *where)
    assert "~" not in exact and "estimated" not in exact
    assert "100 (40 cached)" in exact

    total = stats(*where)
    assert "tokens: ~230 prompt (80 cached), ~47 completion in 3 calls (1 estimated)" in total
    data = json.loads(stats("--json", *where))["usage"]
    assert data == {
        "prompt_tokens": 230,
        "completion_tokens": 47,
        "cached_tokens": 80,
        "calls": 3,
        "estimated_prompt_tokens": 30,
        "estimated_completion_tokens": 7,
        "estimated_calls": 1,
    }
    one_json = json.loads(stats("cli:main", "--json", *where))["usage"]
    assert (one_json["estimated_calls"], one_json["estimated_prompt_tokens"]) == (1, 30)
