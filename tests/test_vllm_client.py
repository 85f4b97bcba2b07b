"""VLLMClient against the fake model server, over real HTTP with the real openai client."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from fakeserver import FakeReply, FakeServer, FakeToolCall, count_tokens
from terrarium.errors import (
    BadResponse,
    ContextTooLong,
    LLMError,
    ModelNotFound,
    RateLimited,
    ServerUnreachable,
)
from terrarium.llm import ChatResult, ModelAccess, StreamEvent, VLLMClient
from terrarium.llm.vllm_client import normalize_base_url
from terrarium.model import TraceEntry, UsageRecord

T = TypeVar("T")

HELLO = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Hello!"},
]


def run(
    server: FakeServer | None,
    body: Callable[[VLLMClient], Awaitable[T]],
    **options: Any,
) -> T:
    """Run ``body(client)`` in a fresh event loop with a client for ``server``, then close it.

    Backoff is made tiny so retry tests stay fast; ``base_url`` overrides the server's URL.
    """
    options.setdefault("backoff_base", 0.001)
    options.setdefault("backoff_max", 0.01)
    options.setdefault("timeout", 10.0)

    async def main() -> T:
        url = (
            options.pop("base_url") if server is None else options.pop("base_url", server.base_url)
        )
        async with VLLMClient(url, **options) as client:
            return await body(client)

    return asyncio.run(main())


async def collect(
    client: VLLMClient, messages: list[dict[str, Any]], **params: Any
) -> list[StreamEvent]:
    """Every event of one stream."""
    return [event async for event in client.stream(messages, **params)]


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --------------------------------------------------------------------------- base URL, models


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://localhost:8000", "http://localhost:8000/v1"),
        ("http://localhost:8000/", "http://localhost:8000/v1"),
        ("http://localhost:8000/v1", "http://localhost:8000/v1"),
        ("http://localhost:8000/v1/", "http://localhost:8000/v1"),
        ("localhost:11434", "http://localhost:11434/v1"),
        ("https://api.example.com/openai/v1", "https://api.example.com/openai/v1"),
    ],
)
def test_base_url_is_normalised_to_end_in_v1(given: str, expected: str) -> None:
    """With or without /v1 or a trailing slash, the client talks to .../v1."""
    assert normalize_base_url(given) == expected
    assert VLLMClient(given).base_url == expected


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
def test_server_is_reached_with_or_without_v1(fake_server: FakeServer, suffix: str) -> None:
    """Both spellings of the URL reach the same endpoints."""
    models = run(fake_server, VLLMClient.list_models, base_url=fake_server.root_url + suffix)
    assert models == ["fake-model"]


def test_model_is_picked_from_the_server_once(fake_server: FakeServer) -> None:
    """model=None asks /v1/models once, takes the first model, and reuses it."""
    fake_server.models = ["first-model", "second-model"]

    async def body(client: VLLMClient) -> str:
        assert client.model is None
        await client.chat(HELLO)
        await client.chat(HELLO)
        return await client.resolve_model()

    assert run(fake_server, body) == "first-model"
    assert fake_server.model_list_calls == 1
    assert [r["model"] for r in fake_server.requests] == ["first-model", "first-model"]


def test_calls_that_start_together_share_one_model_lookup(fake_server: FakeServer) -> None:
    """Ten first calls at once (a manager serving many contexts) ask /v1/models once."""
    fake_server.models = ["first-model"]

    async def body(client: VLLMClient) -> list[ChatResult]:
        return await asyncio.gather(*(client.chat(HELLO) for _ in range(10)))

    results = run(fake_server, body)
    assert fake_server.model_list_calls == 1
    assert [r.model for r in results] == ["first-model"] * 10


def test_explicit_model_skips_the_lookup(fake_server: FakeServer) -> None:
    """A model given to the client or the call is used as is."""
    fake_server.models = ["a", "b"]

    async def body(client: VLLMClient) -> None:
        await client.chat(HELLO)
        await client.chat(HELLO, model="a")

    run(fake_server, body, model="b")
    assert fake_server.model_list_calls == 0
    assert [r["model"] for r in fake_server.requests] == ["b", "a"]


def test_server_without_models_raises_model_not_found(fake_server: FakeServer) -> None:
    """An empty model list is ModelNotFound, naming the server."""
    fake_server.models = []
    with pytest.raises(ModelNotFound, match=r"serves no models"):
        run(fake_server, lambda c: c.chat(HELLO))


def test_unknown_model_raises_model_not_found(fake_server: FakeServer) -> None:
    """vLLM's 404 'model does not exist' is ModelNotFound, and is not retried."""
    with pytest.raises(ModelNotFound, match=r"'no-such-model' not found"):
        run(fake_server, lambda c: c.chat(HELLO, model="no-such-model"))
    with pytest.raises(ModelNotFound):
        run(fake_server, lambda c: collect(c, HELLO, model="no-such-model"))
    assert len(fake_server.requests) == 2


def test_picked_model_is_looked_up_again_after_model_not_found(fake_server: FakeServer) -> None:
    """If the server changes model under a picked one, the next call picks again."""

    async def body(client: VLLMClient) -> str:
        await client.chat(HELLO)
        fake_server.models = ["new-model"]
        with pytest.raises(ModelNotFound):
            await client.chat(HELLO)
        return (await client.chat(HELLO)).model

    assert run(fake_server, body) == "new-model"
    assert fake_server.model_list_calls == 2


# --------------------------------------------------------------------------- results


def test_chat_returns_message_text_usage(fake_server: FakeServer) -> None:
    """A plain chat returns the assistant message, its text, finish reason and usage."""
    result = run(fake_server, lambda c: c.chat(HELLO))
    assert result == ChatResult(
        message={"role": "assistant", "content": "echo: Hello!"},
        text="echo: Hello!",
        usage=UsageRecord(
            model="fake-model",
            prompt_tokens=count_tokens(HELLO),
            completion_tokens=len("echo: Hello!") // 4 + 1,
            cached_tokens=0,
        ),
        finish_reason="stop",
        model="fake-model",
    )
    assert fake_server.last_request.get("stream") in (None, False)


def test_stream_yields_deltas_then_the_result(fake_server: FakeServer) -> None:
    """Deltas arrive in pieces, and the last event carries the same result chat() gives."""
    fake_server.chunks = 4
    events = run(fake_server, lambda c: collect(c, HELLO))
    deltas = [e.delta for e in events[:-1]]
    assert len(deltas) == 4
    assert all(e.result is None for e in events[:-1])
    final = events[-1].result
    assert final is not None
    assert "".join(deltas) == final.text == "echo: Hello!"
    assert final.message == {"role": "assistant", "content": "echo: Hello!"}
    assert final.finish_reason == "stop"
    assert final.usage == UsageRecord("fake-model", count_tokens(HELLO), 4, 0)
    sent = fake_server.last_request
    assert sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}


def test_cached_tokens_are_reported(fake_server: FakeServer) -> None:
    """A request that extends the previous one reports its prefix as cached tokens."""
    first = run(fake_server, lambda c: c.chat(HELLO))
    history = [*HELLO, first.message, {"role": "user", "content": "And again?"}]
    second = run(fake_server, lambda c: collect(c, history))[-1].result
    third = run(fake_server, lambda c: c.chat([{"role": "user", "content": "other"}]))
    assert first.usage is not None and first.usage.cached_tokens == 0
    assert second is not None and second.usage is not None
    assert second.usage.cached_tokens == count_tokens(HELLO) > 0
    assert second.usage.prompt_tokens == count_tokens(history)
    assert third.usage is not None and third.usage.cached_tokens == 0


def test_reply_depends_on_the_history_sent(fake_server: FakeServer) -> None:
    """The fake server's reply callable sees the messages sent."""
    fake_server.reply = lambda messages: f"{len(messages)} messages"
    assert run(fake_server, lambda c: c.chat(HELLO)).text == "2 messages"


TOOL_REPLY = FakeReply(
    content="",
    tool_calls=[
        FakeToolCall("get_weather", '{"city": "Paris", "unit": "celsius"}', id="call_a"),
        FakeToolCall("get_time", '{"tz": "Europe/Paris"}', id="call_b"),
    ],
)
EXPECTED_TOOL_CALLS = [
    {
        "id": "call_a",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
    },
    {
        "id": "call_b",
        "type": "function",
        "function": {"name": "get_time", "arguments": '{"tz": "Europe/Paris"}'},
    },
]


def test_streamed_tool_calls_are_assembled_by_index(fake_server: FakeServer) -> None:
    """Tool-call deltas (name first, arguments in pieces) become whole OpenAI tool calls."""
    fake_server.reply = TOOL_REPLY
    fake_server.chunks = 5
    final = run(fake_server, lambda c: collect(c, HELLO))[-1].result
    assert final is not None
    assert final.finish_reason == "tool_calls"
    assert final.text == ""
    assert final.message == {
        "role": "assistant",
        "content": None,
        "tool_calls": EXPECTED_TOOL_CALLS,
    }
    assert final.tool_calls == EXPECTED_TOOL_CALLS


def test_plain_chat_returns_tool_calls(fake_server: FakeServer) -> None:
    """The non-streaming answer carries the same tool calls."""
    fake_server.reply = TOOL_REPLY
    result = run(fake_server, lambda c: c.chat(HELLO, tools=[]))
    assert result.message == {
        "role": "assistant",
        "content": None,
        "tool_calls": EXPECTED_TOOL_CALLS,
    }


def test_reasoning_content_is_kept(fake_server: FakeServer) -> None:
    """vLLM's reasoning_content streams as reasoning deltas and lands in the message."""
    fake_server.reply = FakeReply(content="42", reasoning="six times seven")
    events = run(fake_server, lambda c: collect(c, HELLO))
    assert "".join(e.reasoning_delta for e in events) == "six times seven"
    assert "".join(e.delta for e in events) == "42"
    expected = {"role": "assistant", "content": "42", "reasoning_content": "six times seven"}
    assert events[-1].result is not None
    assert events[-1].result.message == expected
    assert events[-1].result.reasoning == "six times seven"
    assert run(fake_server, lambda c: c.chat(HELLO)).message == expected


# --------------------------------------------------------------------------- requests sent


def test_messages_are_sent_exactly_as_given(fake_server: FakeServer) -> None:
    """Messages reach the server unchanged: same keys, same order, same values, no stamps."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": 'Sys ünïcödé ✓ \n\t "quoted"'},
        {"content": "keys in odd order", "role": "user", "name": "alice"},
        {"role": "assistant", "content": None, "tool_calls": EXPECTED_TOOL_CALLS},
        {"role": "tool", "tool_call_id": "call_a", "content": '{"temp": 21.5}'},
        {"role": "user", "content": [{"type": "text", "text": "part"}], "x_custom": {"n": 1.5}},
    ]
    snapshot = json.dumps(messages)

    async def body(client: VLLMClient) -> None:
        await client.chat(messages)
        await collect(client, messages)

    run(fake_server, body)
    assert json.dumps(messages) == snapshot  # not mutated
    for raw in fake_server.raw_requests:
        assert json.dumps(json.loads(raw)["messages"]) == snapshot


def test_params_and_default_params_are_sent(fake_server: FakeServer) -> None:
    """Known and server-specific parameters (top_k) go in the body; per-call ones win."""

    async def body(client: VLLMClient) -> None:
        await client.chat(HELLO, temperature=0.2, top_k=20)
        await collect(client, HELLO, repetition_penalty=1.1)

    run(fake_server, body, default_params={"temperature": 0.7, "max_tokens": 64})
    first, second = fake_server.requests
    assert first["temperature"] == 0.2
    assert first["max_tokens"] == 64
    assert first["top_k"] == 20
    assert second["temperature"] == 0.7
    assert second["repetition_penalty"] == 1.1


def test_reserved_params_are_refused(fake_server: FakeServer) -> None:
    """``stream`` and ``messages`` belong to the client, not to **params."""
    with pytest.raises(TypeError, match="stream"):
        run(fake_server, lambda c: c.chat(HELLO, stream=True))


# --------------------------------------------------------------------------- retries, errors


def test_transient_errors_are_retried(fake_server: FakeServer) -> None:
    """Two 503s then success: chat() succeeds on the third try with the same request."""
    fake_server.fail_next(503, count=2)
    result = run(fake_server, lambda c: c.chat(HELLO), max_retries=3)
    assert result.text == "echo: Hello!"
    assert len(fake_server.requests) == 3
    assert fake_server.raw_requests[0] == fake_server.raw_requests[2]


def test_stream_failing_before_the_first_delta_is_retried(fake_server: FakeServer) -> None:
    """A stream refused (500) or cut before any text is retried transparently."""
    fake_server.fail_next(500)
    fake_server.drop_next(after_chunks=1)  # only the role chunk, no text
    events = run(fake_server, lambda c: collect(c, HELLO), max_retries=2)
    assert "".join(e.delta for e in events) == "echo: Hello!"
    assert len(fake_server.requests) == 3


def test_rate_limit_after_retries_raises_rate_limited(fake_server: FakeServer) -> None:
    """429 on every try: RateLimited after max_retries + 1 requests."""
    fake_server.fail_next(429, count=10)
    with pytest.raises(RateLimited, match=r"after 3 attempts"):
        run(fake_server, lambda c: c.chat(HELLO), max_retries=2)
    assert len(fake_server.requests) == 3


def test_persistent_server_error_raises_bad_response(fake_server: FakeServer) -> None:
    """5xx on every try ends as BadResponse naming the status."""
    fake_server.fail_next(500, count=10)
    with pytest.raises(BadResponse, match=r"answered 500 after 2 attempts"):
        run(fake_server, lambda c: collect(c, HELLO), max_retries=1)


def test_unreachable_server_names_the_url() -> None:
    """Connection refused is ServerUnreachable; the message names the URL and the settings."""
    url = f"http://127.0.0.1:{closed_port()}"
    for call in (VLLMClient.list_models, lambda c: c.chat(HELLO), lambda c: collect(c, HELLO)):
        with pytest.raises(ServerUnreachable) as info:
            run(None, call, base_url=url, model="m", max_retries=1)
        message = str(info.value)
        assert f"{url}/v1" in message
        assert "--base-url" in message and "TERRARIUM_BASE_URL" in message
        assert "\n" not in message


def test_timeout_raises_server_unreachable(fake_server: FakeServer) -> None:
    """A server that does not answer within the timeout is ServerUnreachable ("timed out")."""
    fake_server.delay = 60.0  # cut short when the fixture stops the server
    with pytest.raises(ServerUnreachable, match=r"timed out after 0.05s .* after 2 attempts"):
        run(fake_server, lambda c: c.chat(HELLO), timeout=0.05, max_retries=1, model="m")
    assert len(fake_server.requests) == 2


def test_a_call_s_timeout_is_a_request_option(fake_server: FakeServer) -> None:
    """``timeout`` given to one call bounds that call (it is not sent in the body); the
    client's own timeout is left for the others."""
    fake_server.delay = 0.5

    async def body(client: VLLMClient) -> str:
        with pytest.raises(ServerUnreachable, match="timed out"):
            await client.chat(HELLO, timeout=0.05)
        return (await client.chat(HELLO)).text

    assert run(fake_server, body, max_retries=0) == "echo: Hello!"
    assert all("timeout" not in request for request in fake_server.requests)


@pytest.mark.timeout(20)
def test_retry_after_header_replaces_the_backoff(fake_server: FakeServer) -> None:
    """A 429 with Retry-After: 0 is retried at once, not after the (here huge) backoff."""
    fake_server.fail_next(429, retry_after=0.0)
    result = run(fake_server, lambda c: c.chat(HELLO), backoff_base=300.0, backoff_max=600.0)
    assert result.text == "echo: Hello!"
    assert len(fake_server.requests) == 2


def test_context_length_error_raises_context_too_long(fake_server: FakeServer) -> None:
    """vLLM's 400 'maximum context length' is ContextTooLong, not retried."""
    fake_server.fail_next(400)
    with pytest.raises(ContextTooLong, match=r"maximum context length is 4096"):
        run(fake_server, lambda c: c.chat(HELLO))
    fake_server.fail_next(400, message="too long", code="context_length_exceeded")
    with pytest.raises(ContextTooLong):
        run(fake_server, lambda c: collect(c, HELLO))
    assert len(fake_server.requests) == 2


def test_other_client_errors_raise_bad_response(fake_server: FakeServer) -> None:
    """A 400 about something else is BadResponse and is not retried."""
    fake_server.fail_next(400, message="temperature must be positive")
    with pytest.raises(BadResponse, match="temperature must be positive"):
        run(fake_server, lambda c: c.chat(HELLO))
    assert len(fake_server.requests) == 1


def test_midstream_drop_raises_after_the_deltas_without_retry(fake_server: FakeServer) -> None:
    """A stream cut after text was yielded raises an LLMError; the request is not replayed."""
    fake_server.drop_next(after_chunks=3)  # role chunk + two text pieces
    received: list[str] = []

    async def body(client: VLLMClient) -> None:
        async for event in client.stream(HELLO):
            received.append(event.delta)

    with pytest.raises(LLMError, match="not retried"):
        run(fake_server, body, max_retries=3)
    assert len(received) == 2 and all(received)
    assert len(fake_server.requests) == 1


def test_malformed_json_raises_bad_response(fake_server: FakeServer) -> None:
    """Invalid JSON in a plain answer or in a stream event is BadResponse."""
    fake_server.malformed_next()
    with pytest.raises(BadResponse, match="malformed"):
        run(fake_server, lambda c: c.chat(HELLO))
    fake_server.malformed_next(after_chunks=0)
    with pytest.raises(BadResponse, match="malformed"):
        run(fake_server, lambda c: collect(c, HELLO))
    fake_server.malformed_next(after_chunks=2)
    with pytest.raises(BadResponse):
        run(fake_server, lambda c: collect(c, HELLO))
    assert len(fake_server.requests) == 3


def test_backoff_grows_with_jitter_up_to_the_cap() -> None:
    """Waits double per retry, jittered within [ceiling/2, ceiling], capped at backoff_max."""
    client = VLLMClient(backoff_base=1.0, backoff_max=5.0)
    error = ValueError("x")
    for attempt, ceiling in [(0, 1.0), (1, 2.0), (2, 4.0), (3, 5.0), (10, 5.0)]:
        waits = [client._backoff(attempt, error) for _ in range(50)]
        assert all(ceiling / 2 <= w <= ceiling for w in waits)
    asyncio.run(client.aclose())


# --------------------------------------------------------------------------- tracing, lifecycle


def test_trace_hook_sees_request_chunks_response_and_errors(fake_server: FakeServer) -> None:
    """on_trace gets request, every raw chunk, the response, and each error."""
    entries: list[TraceEntry] = []
    fake_server.fail_next(503)
    events = run(fake_server, lambda c: collect(c, HELLO), on_trace=entries.append)
    kinds = [e.event for e in entries]
    chunks = [e for e in entries if e.event == "chunk"]
    assert kinds[:3] == ["request", "error", "request"]
    assert kinds[-1] == "response"
    assert set(kinds[3:-1]) == {"chunk"}
    assert entries[1].data["retrying"] is True
    assert entries[0].data["messages"] == HELLO
    assert chunks[-1].data["usage"]["prompt_tokens"] == count_tokens(HELLO)
    assert events[-1].result is not None
    assert entries[-1].data["message"] == events[-1].result.message
    assert all(e.ts.endswith("Z") for e in entries)

    entries.clear()
    run(fake_server, lambda c: c.chat(HELLO), on_trace=entries.append)
    assert [e.event for e in entries] == ["request", "response"]
    assert entries[1].data["choices"][0]["message"]["content"] == "echo: Hello!"


def test_stream_closed_early_releases_the_connection(fake_server: FakeServer) -> None:
    """Breaking out of a stream and closing it leaves the client usable (and nothing leaks)."""

    async def body(client: VLLMClient) -> str:
        async with contextlib.aclosing(client.stream(HELLO)) as events:
            async for _ in events:
                break
        return (await client.chat(HELLO)).text

    assert run(fake_server, body) == "echo: Hello!"


def test_requests_are_served_concurrently(fake_server: FakeServer) -> None:
    """Many calls at once are all in flight together (a barrier in the reply proves it)."""
    n = 8
    barrier = threading.Barrier(n, timeout=10)

    def reply(messages: list[dict[str, Any]]) -> str:
        barrier.wait()
        return f"echo: {messages[-1]['content']}"

    fake_server.reply = reply

    async def body(client: VLLMClient) -> list[str]:
        calls: list[Awaitable[ChatResult | list[StreamEvent]]] = [
            client.chat([{"role": "user", "content": str(i)}])
            if i % 2
            else collect(client, [{"role": "user", "content": str(i)}])
            for i in range(n)
        ]
        texts = []
        for outcome in await asyncio.gather(*calls):
            result = outcome if isinstance(outcome, ChatResult) else outcome[-1].result
            assert result is not None
            texts.append(result.text)
        return texts

    assert run(fake_server, body, model="fake-model") == [f"echo: {i}" for i in range(n)]
    assert fake_server.peak_concurrency == n


def test_a_release_that_takes_the_body_as_bytes_sends_the_same_request(
    fake_server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On openai releases whose ``post`` has no ``content`` (1.99 to 2.x), the encoded body
    goes as ``body`` (newer ones warn that it is deprecated): the server gets the same JSON,
    extra parameters included, and the answer reads the same."""
    from terrarium.llm import vllm_client

    monkeypatch.setattr(vllm_client, "_POST_TAKES_CONTENT", False)
    with pytest.warns(DeprecationWarning, match="content"):
        result = run(fake_server, lambda c: c.chat(HELLO, top_k=3))
    assert result.text == "echo: Hello!"
    request = fake_server.requests[-1]
    assert request["messages"] == HELLO and request["top_k"] == 3


def test_model_access_makes_the_client_it_describes() -> None:
    """One record says how to reach the model, for the command line's options and the
    dashboard alike: its client asks that server and model with those retries and timeout,
    and holding one (``import terrarium.llm``) imports no ``openai``."""
    client = ModelAccess("http://127.0.0.1:9", model="m", retries=0, timeout=5.0).client()
    assert (client.base_url, client.model) == ("http://127.0.0.1:9/v1", "m")
    assert (client.max_retries, client.timeout) == (0, 5.0)
    asyncio.run(client.aclose())
    check = (
        "import sys, terrarium.llm; terrarium.llm.ModelAccess('x'); print('openai' in sys.modules)"
    )
    imported = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True)
    assert imported.stdout == "False\n", imported.stderr
