"""``terrarium gateway`` over real HTTP, driven by the official ``openai`` client, with the
fake model server as its upstream. Every body is validated with the client's own types."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion
from openai.types.conversations import (
    Conversation,
    ConversationDeletedResource,
    ConversationItem,
    ConversationItemList,
)
from openai.types.responses import Response, ResponseItemList, ResponseStreamEvent
from pydantic import TypeAdapter

from fakeserver import FakeReply, FakeServer, FakeToolCall
from helpers.gateway import GatewayProcess
from terrarium.model import ContextId
from terrarium.sessions import restore, save_delta
from terrarium.stores.url import open_store

MODEL = "fake-model"
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
ITEM: TypeAdapter[Any] = TypeAdapter(ConversationItem)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gateway") / "sessions"


@pytest.fixture(scope="module")
def gateway(fake: FakeServer, storage: Path) -> Iterator[GatewayProcess]:
    with GatewayProcess(storage, fake.base_url) as process:
        yield process


@pytest.fixture
def client(gateway: GatewayProcess, fake: FakeServer) -> Iterator[openai.OpenAI]:
    fake.clear_faults()
    fake.reply = lambda messages: _echo(messages)
    with openai.OpenAI(base_url=gateway.url, api_key="unused", max_retries=0) as c:
        yield c


def _echo(messages: list[dict[str, Any]]) -> str:
    last = next(m for m in reversed(messages) if m.get("role") == "user")
    content = last.get("content")
    return f"echo: {content if isinstance(content, str) else content[0]['text']}"


def created(client: openai.OpenAI, **params: Any) -> dict[str, Any]:
    """``responses.create`` as raw JSON, validated as a ``Response``."""
    raw = client.responses.with_raw_response.create(model=MODEL, **params)
    body: dict[str, Any] = json.loads(raw.text)
    Response.model_validate(body)
    return body


def retrieved(client: openai.OpenAI, response_id: str) -> dict[str, Any]:
    raw = client.responses.with_raw_response.retrieve(response_id)
    body: dict[str, Any] = json.loads(raw.text)
    Response.model_validate(body)
    return body


def text_of(body: dict[str, Any]) -> str:
    return "".join(
        part["text"]
        for item in body["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def state_of(storage: Path, context: str) -> Any:
    with open_store(str(storage), create=False) as store:
        return restore(store, ContextId.parse(context))


def test_a_chain_of_responses_is_kept_and_sent_whole(
    client: openai.OpenAI, fake: FakeServer
) -> None:
    """A response continuing the newest one appends; the upstream gets the whole history."""
    first = created(client, input="hello", instructions="be brief", metadata={"k": "v"})
    assert first["status"] == "completed" and text_of(first) == "echo: hello"
    assert first["id"].startswith("resp_") and len(first["id"]) > 40
    second = created(client, input="again", previous_response_id=first["id"])
    assert fake.last_request["messages"] == [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "echo: hello"},
        {"role": "user", "content": "again"},
    ]  # instructions are not carried over, as OpenAI does
    again = retrieved(client, first["id"])
    assert again["output"] == first["output"] and again["metadata"] == {"k": "v"}
    assert again["instructions"] == "be brief" and again["usage"]["total_tokens"] > 0
    raw = client.responses.input_items.with_raw_response.list(second["id"])
    items = ResponseItemList.model_validate(json.loads(raw.text))
    assert [item.type for item in items.data] == ["message"]
    assert items.data[0].content[0].text == "again"  # type: ignore[union-attr]
    assert retrieved(client, second["id"])["previous_response_id"] == first["id"]


def test_continuing_an_older_response_forks_and_keeps_both_branches(
    client: openai.OpenAI, fake: FakeServer, storage: Path
) -> None:
    """Two answers to one response are two branches: neither clobbers the other."""
    root = created(client, input="start")
    left = created(client, input="left", previous_response_id=root["id"])
    right = created(client, input="right", previous_response_id=root["id"])
    assert [m["content"] for m in fake.last_request["messages"]] == [
        "start",
        "echo: start",
        "right",
    ]
    deeper = created(client, input="deeper", previous_response_id=left["id"])
    assert [m["content"] for m in fake.last_request["messages"]][-2:] == ["echo: left", "deeper"]
    for body in (root, left, right, deeper):
        assert text_of(retrieved(client, body["id"])) == text_of(body)
    context = f"resp:{root['id'][6:32]}"
    with open_store(str(storage), create=False) as store:
        head = store.get_head(ContextId.parse(context))
        assert head is not None
        assert len(store.list_segments(head.session_id)) == 2  # the fork; deeper appended
    state = state_of(storage, context)
    assert [item["content"][0]["text"] for item in state.history][-2:] == ["deeper", "echo: deeper"]


def test_a_stream_is_the_documented_event_sequence(client: openai.OpenAI) -> None:
    """Events validate as the client's types, numbered from 0, one id, then stored."""
    with client.responses.with_streaming_response.create(
        model=MODEL, input="stream me", stream=True
    ) as raw:
        lines = [line for line in raw.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line[6:]) for line in lines]
    for event in events:
        EVENTS.validate_python(event)
    kinds = [event["type"] for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    ids = {event["response"]["id"] for event in events if "response" in event}
    assert len(ids) == 1
    deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert deltas == "echo: stream me"
    final = events[-1]["response"]
    assert retrieved(client, final["id"])["output"] == final["output"]


def test_store_false_keeps_nothing(client: openai.OpenAI, storage: Path) -> None:
    with open_store(str(storage)) as store:
        before = {c.context for c in store.list_contexts()}
    body = created(client, input="forget me", store=False)
    assert text_of(body) == "echo: forget me" and body["store"] is False
    with open_store(str(storage)) as store:
        assert {c.context for c in store.list_contexts()} == before
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(body["id"])


def test_a_deleted_response_is_gone_and_its_chain_stays(client: openai.OpenAI) -> None:
    first = created(client, input="one")
    second = created(client, input="two", previous_response_id=first["id"])
    client.responses.delete(first["id"])
    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.retrieve(first["id"])
    assert missing.value.body == {  # type: ignore[comparison-overlap]
        "message": f"Response with id '{first['id']}' not found.",
        "type": "not_found_error",
        "param": None,
        "code": "not_found",
    }
    with pytest.raises(openai.NotFoundError):
        created(client, input="x", previous_response_id=first["id"])
    with pytest.raises(openai.NotFoundError):
        client.responses.delete(first["id"])
    third = created(client, input="three", previous_response_id=second["id"])
    assert text_of(retrieved(client, third["id"])) == "echo: three"


def test_function_calls_round_trip(client: openai.OpenAI, fake: FakeServer) -> None:
    """A function call goes out as a tool, comes back as an item, its output goes up."""
    fake.reply = FakeReply(tool_calls=[FakeToolCall("weather", '{"city": "Oslo"}', "call_7")])
    tool = {
        "type": "function",
        "name": "weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
    first = created(client, input="weather?", tools=[tool])
    assert fake.last_request["tools"][0]["function"]["name"] == "weather"
    call = first["output"][-1]
    assert call["type"] == "function_call" and call["call_id"] == "call_7"
    assert json.loads(call["arguments"]) == {"city": "Oslo"}
    fake.reply = "It is sunny."
    output = {"type": "function_call_output", "call_id": "call_7", "output": "sunny"}
    second = created(client, input=[output], previous_response_id=first["id"], tools=[tool])
    assert text_of(second) == "It is sunny."
    sent = fake.last_request["messages"]
    assert sent[-2]["tool_calls"][0]["id"] == "call_7"
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_7", "content": "sunny"}


def test_conversations_hold_items_and_responses(client: openai.OpenAI, fake: FakeServer) -> None:
    raw = client.conversations.with_raw_response.create(
        items=[{"role": "user", "content": "remember 42"}], metadata={"topic": "numbers"}
    )
    conv = Conversation.model_validate(json.loads(raw.text))
    assert conv.metadata == {"topic": "numbers"} and conv.id.startswith("conv_")
    reply = created(client, input="what number?", conversation=conv.id)
    assert [m["content"] for m in fake.last_request["messages"]] == [
        "remember 42\n\nwhat number?"
    ]  # two user items in a row go up as one message
    assert reply["conversation"] == {"id": conv.id}
    added = client.conversations.items.with_raw_response.create(
        conv.id, items=[{"type": "message", "role": "user", "content": "noted"}]
    )
    ConversationItemList.model_validate(json.loads(added.text))
    listed = client.conversations.items.with_raw_response.list(conv.id, order="asc")
    items = ConversationItemList.model_validate(json.loads(listed.text)).data
    texts = [item.content[0].text for item in items]  # type: ignore[union-attr]
    assert texts == ["remember 42", "what number?", "echo: remember 42\n\nwhat number?", "noted"]
    page = client.conversations.items.list(conv.id, limit=2, order="asc", after=items[0].id)
    assert [i.id for i in page.data] == [items[1].id, items[2].id] and page.has_more
    one = client.conversations.items.with_raw_response.retrieve(
        items[1].id, conversation_id=conv.id
    )
    ITEM.validate_python(json.loads(one.text))
    client.conversations.items.delete(items[3].id, conversation_id=conv.id)  # the last: rewind
    client.conversations.items.delete(items[0].id, conversation_id=conv.id)  # one inside
    left = [i.id for i in client.conversations.items.list(conv.id, order="asc")]
    assert left == [items[1].id, items[2].id]
    updated = client.conversations.update(conv.id, metadata={"topic": "other"})
    assert client.conversations.retrieve(conv.id).metadata == {"topic": "other"} == updated.metadata
    deleted = client.conversations.with_raw_response.delete(conv.id)
    ConversationDeletedResource.model_validate(json.loads(deleted.text))
    with pytest.raises(openai.NotFoundError):
        client.conversations.retrieve(conv.id)
    with pytest.raises(openai.NotFoundError):
        created(client, input="x", conversation=conv.id)


def test_a_conversation_continued_outside_the_gateway_lists_items(
    client: openai.OpenAI, fake: FakeServer, storage: Path
) -> None:
    """A conversation is an ordinary context: ``terrarium chat conv:...`` (or a compaction)
    logs Chat messages in it, without ids. The Conversations API lists them as message items
    with ids that stay the same from one read to the next, which get and delete take (before,
    they were listed as logged, which the openai client could not read, and had no id)."""
    conv = client.conversations.create(items=[{"role": "user", "content": "from the API"}])
    with open_store(str(storage)) as store:
        head = store.get_head(ContextId.parse(f"conv:{conv.id}"))
        assert head is not None
        chat = [
            {"role": "user", "content": "from the chat"},
            {"role": "assistant", "content": "ok"},
        ]
        save_delta(store, head, chat)
    raw = client.conversations.items.with_raw_response.list(conv.id, order="asc")
    items = ConversationItemList.model_validate(json.loads(raw.text)).data
    assert [(i.role, i.content[0].text) for i in items] == [  # type: ignore[union-attr]
        ("user", "from the API"),
        ("user", "from the chat"),
        ("assistant", "ok"),
    ]
    ids = [item.id for item in items]
    assert all(ids) and len(set(ids)) == 3
    assert [i.id for i in client.conversations.items.list(conv.id, order="asc")] == ids
    one = client.conversations.items.retrieve(ids[1], conversation_id=conv.id)
    assert one.id == ids[1]
    client.conversations.items.delete(ids[1], conversation_id=conv.id)
    assert [i.id for i in client.conversations.items.list(conv.id, order="asc")] == [
        ids[0],
        ids[2],
    ]
    reply = created(client, input="and now?", conversation=conv.id)
    assert text_of(reply) == "echo: and now?"


def test_chat_completions_pass_through_and_record_sessions(
    client: openai.OpenAI, fake: FakeServer, storage: Path
) -> None:
    """A named session is kept; an edited earlier turn is a fork, the old branch stays."""
    headers = {"X-Session-Id": "ui-1"}
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "a"}]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=history,
        extra_headers=headers,  # type: ignore[arg-type]
    )
    answer = ChatCompletion.model_validate(json.loads(raw.text))
    history += [{"role": "assistant", "content": answer.choices[0].message.content or ""}]
    history += [{"role": "user", "content": "b"}]
    client.chat.completions.create(model=MODEL, messages=history, extra_headers=headers)  # type: ignore[arg-type]
    state = state_of(storage, "chat:ui-1")
    assert [m["content"] for m in state.history] == ["sys", "a", "echo: a", "b", "echo: b"]
    edited = [*history[:1], {"role": "user", "content": "A!"}]
    stream = client.chat.completions.create(
        model=MODEL,
        messages=edited,
        stream=True,
        extra_headers=headers,  # type: ignore[arg-type]
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == "echo: A!"
    state = state_of(storage, "chat:ui-1")
    assert [m["content"] for m in state.history] == ["sys", "A!", "echo: A!"]
    with open_store(str(storage), create=False) as store:
        assert len(store.list_segments(state.session_id)) == 2
    client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "meta"}],
        metadata={"session_id": "ui-2"},
    )
    assert "metadata" not in fake.last_request
    assert [m["content"] for m in state_of(storage, "chat:ui-2").history] == ["meta", "echo: meta"]


def test_an_upstream_failure_is_an_openai_error_and_a_failed_turn(
    client: openai.OpenAI, fake: FakeServer, storage: Path
) -> None:
    """The client gets OpenAI's error shape; the turn is kept, failed; the next one works."""
    conv = client.conversations.create()
    fake.fail_next(503)
    with pytest.raises(openai.APIStatusError) as failed:
        created(client, input="lost?", conversation=conv.id)
    assert failed.value.status_code == 502
    assert set(failed.value.body) == {"message", "type", "param", "code"}  # type: ignore[arg-type]
    state = state_of(storage, f"conv:{conv.id}")
    assert state.failed and state.history[-1]["content"][0]["text"] == "lost?"
    after = created(client, input="retry", conversation=conv.id)
    assert text_of(after) == "echo: retry"
    assert [m["content"] for m in fake.last_request["messages"]] == ["retry"]
    fake.drop_next(after_chunks=2)
    with client.responses.create(model=MODEL, input="drop", stream=True, conversation=conv.id) as s:
        kinds = [event.type for event in s]
    assert kinds[-1] == "response.failed"
    fake.malformed_next()
    with pytest.raises(openai.APIStatusError) as garbled:
        created(client, input="garbled", conversation=conv.id)
    assert garbled.value.status_code == 502
    assert garbled.value.body["code"] == "bad_upstream_reply"  # type: ignore[index]
    assert text_of(created(client, input="fine", conversation=conv.id)) == "echo: fine"
    assert [m["content"] for m in fake.last_request["messages"]] == [
        "retry",
        "echo: retry",
        "fine",
    ]  # no failed turn is sent again


def test_an_upstream_4xx_is_passed_on_as_the_server_said_it(
    client: openai.OpenAI, fake: FakeServer
) -> None:
    """The model server's own 4xx (here vLLM's context-length error) reaches the client with
    its status, message and code; a reply that is not JSON at all is a 502."""
    fake.fail_next(400, message="too long for this model", code="context_length_exceeded")
    with pytest.raises(openai.BadRequestError) as refused:
        created(client, input="long")
    assert refused.value.body == {
        "message": "too long for this model",
        "type": "invalid_request_error",
        "param": None,
        "code": "context_length_exceeded",
    }
    fake.fail_next(500)
    with pytest.raises(openai.APIStatusError) as failed:
        created(client, input="broken")
    assert failed.value.status_code == 502
    assert failed.value.body["message"] == (  # type: ignore[index]
        "the model server answered HTTP 500: Internal server error"
    )


def test_a_stream_the_upstream_refuses_is_its_http_error(
    client: openai.OpenAI, fake: FakeServer, storage: Path
) -> None:
    """A streamed request the model server refuses before its stream begins gets the HTTP
    status a plain one gets, as the server itself (and OpenAI) answer it, so a client that
    catches ``BadRequestError`` to compact and retry works streamed too (it was a 200 with an
    error line, or ``response.failed``); the turn is kept, failed, and the next one works."""
    fake.fail_next(400, message="too long for this model", code="context_length_exceeded")
    headers = {"X-Session-Id": "refused-stream"}
    messages = [{"role": "user", "content": "too long"}]
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            stream=True,
            extra_headers=headers,
        )
    assert refused.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    state = state_of(storage, "chat:refused-stream")
    assert state.failed and [m["content"] for m in state.history] == ["too long"]
    conv = client.conversations.create()
    fake.fail_next(503)
    with pytest.raises(openai.APIStatusError) as failed:
        client.responses.create(model=MODEL, input="down", stream=True, conversation=conv.id)
    assert failed.value.status_code == 502
    assert state_of(storage, f"conv:{conv.id}").failed
    with client.responses.create(model=MODEL, input="up", stream=True, conversation=conv.id) as s:
        assert [e.type for e in s][-1] == "response.completed"
    assert [m["content"] for m in fake.last_request["messages"]] == ["up"]


def test_the_upstream_key_and_client_headers_go_with_every_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plain call and a stream both carry $TERRARIUM_UPSTREAM_API_KEY and the openai
    client's own headers, though each is sent its own way (``gateway/upstream.py``)."""
    monkeypatch.setenv("TERRARIUM_UPSTREAM_API_KEY", "upstream-key")
    with FakeServer() as upstream, GatewayProcess(tmp_path / "s", upstream.base_url) as gw:
        with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as c:
            created(c, input="plain")
            with c.responses.create(model=MODEL, input="streamed", stream=True) as s:
                list(s)
        assert len(upstream.request_headers) == 2
        for headers in upstream.request_headers:
            assert headers["authorization"] == "Bearer upstream-key"
            assert headers["content-type"] == "application/json"
            assert headers["user-agent"].startswith("AsyncOpenAI/Python")


def test_an_unreachable_upstream_is_a_502(tmp_path: Path) -> None:
    with (
        socket_closed_port() as port,
        GatewayProcess(tmp_path / "s", f"http://127.0.0.1:{port}/v1") as gw,
    ):
        with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as c:
            with pytest.raises(openai.APIStatusError) as failed:
                c.responses.create(model=MODEL, input="hi")
    assert failed.value.status_code == 502
    assert "cannot reach the model server" in failed.value.message


@pytest.mark.parametrize("given", ["{base}", "{base}/", "{host}"])
def test_an_upstream_without_v1_is_read_as_the_chat_reads_it(
    tmp_path: Path, fake: FakeServer, given: str
) -> None:
    """``--upstream`` takes a server URL as ``chat --base-url`` does: ``/v1`` added when
    missing, a trailing slash dropped, ``http://`` when no scheme is given."""
    base = fake.base_url.removesuffix("/v1")
    upstream = given.format(base=base, host=base.removeprefix("http://"))
    with GatewayProcess(tmp_path / "s", upstream) as gw:
        assert gw.banner[0].rstrip().endswith(f"-> {fake.base_url}")
        with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as c:
            assert c.responses.create(model=MODEL, input="hi").output_text == "echo: hi"


def socket_closed_port() -> Any:
    import contextlib
    import socket

    @contextlib.contextmanager
    def port() -> Iterator[int]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            yield sock.getsockname()[1]  # bound, not listening: connections are refused

    return port()


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        (b"{not json", 400, None),
        (b"[]", 400, None),
        (b'{"input": "x"}', 400, "model"),
        (b'{"model": "m", "input": 5}', 400, "input"),
        (b'{"model": "m", "input": "x", "tools": [{"type": "web_search"}]}', 400, "tools"),
        (b'{"model": "m", "input": "x", "background": true}', 400, "background"),
        (
            b'{"model": "m", "input": "x", "previous_response_id": "resp_nope"}',
            404,
            "previous_response_id",
        ),
        (b'{"model": "m", "input": "x", "conversation": "conv_nope"}', 404, "conversation"),
        (b'{"model": "m", "input": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None),  # was a 500
    ],
)
def test_bad_requests_get_openai_errors(
    gateway: GatewayProcess, body: bytes, status: int, param: str | None
) -> None:
    answer = httpx.post(f"{gateway.url}/responses", content=body)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["param"] == param
    assert "Traceback" not in answer.text


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            {"type": "nope"},
            "item type 'nope' is not implemented by terrarium gateway (it takes "
            "'function_call', 'function_call_output', 'message', 'reasoning')",
        ),
        (
            {"role": "user", "content": [5]},
            "every part of a message's content must be an object with a string 'type'",
        ),
        (
            {"role": "user", "content": [{"type": "input_text", "text": 5}]},
            "a message's 'input_text' part needs a string 'text'",
        ),
    ],
)
def test_an_input_item_the_gateway_would_drop_is_a_400_naming_it(
    gateway: GatewayProcess, fake: FakeServer, item: dict[str, Any], message: str
) -> None:
    """An item of a type the gateway has no Chat message for, or content parts it cannot
    send, is a 400 saying so (before, the item was dropped and the upstream's own 400, about
    the empty message list it got, named the wrong problem); the upstream is not called."""
    fake.clear_faults()
    calls = len(fake.requests)
    body = {"model": MODEL, "input": [item]}
    answer = httpx.post(f"{gateway.url}/responses", json=body)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["message"]) == ("input", message)
    assert len(fake.requests) == calls


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/responses", {"model": MODEL}, "input"),
        ("/responses", {"model": MODEL, "input": []}, "input"),
        ("/responses", {"model": MODEL, "input": ""}, "input"),
        ("/chat/completions", {"model": MODEL, "messages": []}, "messages"),
        ("/chat/completions", {"model": MODEL, "messages": [], "stream": True}, "messages"),
    ],
)
def test_a_request_with_no_message_is_a_400_and_keeps_nothing(
    gateway: GatewayProcess,
    fake: FakeServer,
    storage: Path,
    path: str,
    body: dict[str, Any],
    param: str,
) -> None:
    """A request with nothing for the model to answer is a 400 naming the parameter; before,
    it went upstream (whose 400 was about a message list the client never sent) and left an
    empty context with a failed run in ``list``."""
    with open_store(str(storage)) as store:
        before = {c.context for c in store.list_contexts()}
    calls = len(fake.requests)
    answer = httpx.post(f"{gateway.url}{path}", json=body, headers={"X-Session-Id": "empty"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["param"] == param
    assert len(fake.requests) == calls
    with open_store(str(storage)) as store:
        assert {c.context for c in store.list_contexts()} == before


def test_adding_no_items_to_a_conversation_is_a_400(gateway: GatewayProcess) -> None:
    """``items`` missing or empty: a 400 naming ``items`` (a 500 IndexError before), and the
    conversation is unchanged."""
    conversation = httpx.post(f"{gateway.url}/conversations", json={"items": "hi"}).json()
    url = f"{gateway.url}/conversations/{conversation['id']}/items"
    for body in ({}, {"items": []}):
        answer = httpx.post(url, json=body)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert (
            error["param"] == "items" and error["message"] == "'items' must list at least one item"
        )
    assert [item["content"][0]["text"] for item in httpx.get(url).json()["data"]] == ["hi"]


def test_unknown_routes_and_large_bodies(gateway: GatewayProcess) -> None:
    missing = httpx.get(f"{gateway.url}/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_route"
    big = httpx.post(f"{gateway.url}/responses", content=b" " * (33 * 1024 * 1024))
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"


def test_without_a_token_only_loopback_hosts_are_answered(gateway: GatewayProcess) -> None:
    refused = httpx.get(f"{gateway.url}/models", headers={"Host": "evil.example"})
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "forbidden"
    assert httpx.get(f"{gateway.url}/models").json()["data"][0]["id"] == MODEL


def test_a_token_is_required_on_every_route(tmp_path: Path, fake: FakeServer) -> None:
    with GatewayProcess(tmp_path / "s", fake.base_url, "--token", "s3cret") as gw:
        for method, path in [("GET", "/models"), ("POST", "/responses"), ("GET", "/x")]:
            answer = httpx.request(method, gw.url + path)
            assert answer.status_code == 401, path
        with openai.OpenAI(base_url=gw.url, api_key="s3cret") as c:
            assert c.responses.create(model=MODEL, input="ok").output_text == "echo: ok"
        with openai.OpenAI(base_url=gw.url, api_key="wrong", max_retries=0) as c:
            with pytest.raises(openai.AuthenticationError):
                c.models.list()


def test_another_host_gets_a_generated_token(tmp_path: Path, fake: FakeServer) -> None:
    with GatewayProcess(tmp_path / "s", fake.base_url, "--host", "0.0.0.0") as gw:
        line = gw.token_line()
        assert line.startswith("token: ") and len(line.split()[1]) >= 24
        url = gw.url.replace("0.0.0.0", "127.0.0.1")
        assert httpx.get(f"{url}/models").status_code == 401
        headers = {"Authorization": f"Bearer {line.split()[1]}"}
        assert httpx.get(f"{url}/models", headers=headers).status_code == 200


def test_many_clients_on_one_conversation_keep_its_order(
    client: openai.OpenAI, gateway: GatewayProcess, storage: Path
) -> None:
    """Twenty clients at once: every turn is kept whole (its input, then its output)."""
    import threading

    conv = client.conversations.create()
    errors: list[BaseException] = []

    def one(n: int) -> None:
        try:
            with openai.OpenAI(base_url=gateway.url, api_key="x", max_retries=0) as c:
                c.responses.create(model=MODEL, input=f"client {n}", conversation=conv.id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(20)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    texts = [item["content"][0]["text"] for item in state_of(storage, f"conv:{conv.id}").history]
    assert len(texts) == 40
    inputs = texts[0::2]
    assert sorted(inputs) == sorted(f"client {n}" for n in range(20))
    for asked, answered in zip(texts[0::2], texts[1::2], strict=True):
        assert answered.startswith("echo: ") and answered.endswith(asked)


def test_structured_output_is_sent_as_response_format(
    client: openai.OpenAI, fake: FakeServer
) -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    fake.reply = '{"n": 7}'
    body = created(
        client,
        input="a number",
        text={"format": {"type": "json_schema", "name": "number", "schema": schema}},
    )
    assert fake.last_request["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "number", "schema": schema},
    }
    assert body["text"]["format"]["name"] == "number" and text_of(body) == '{"n": 7}'
    assert retrieved(client, body["id"])["text"] == body["text"]


def test_a_dropped_chat_stream_is_an_error_line_and_a_failed_turn(
    client: openai.OpenAI, fake: FakeServer, storage: Path
) -> None:
    fake.drop_next(after_chunks=2)
    messages = [{"role": "user", "content": "will drop"}]
    headers = {"X-Session-Id": "dropped"}
    with pytest.raises(openai.APIError):
        for _ in client.chat.completions.create(
            model=MODEL,
            messages=messages,
            stream=True,
            extra_headers=headers,  # type: ignore[arg-type]
        ):
            pass
    state = state_of(storage, "chat:dropped")
    assert state.failed and [m["content"] for m in state.history] == ["will drop"]
    again = client.chat.completions.create(model=MODEL, messages=messages, extra_headers=headers)  # type: ignore[arg-type]
    assert again.choices[0].message.content == "echo: will drop"
    assert [m["content"] for m in state_of(storage, "chat:dropped").model_history][-1] == (
        "echo: will drop"
    )


def test_a_chat_stream_cut_short_keeps_its_partial_reply(
    gateway: GatewayProcess, client: openai.OpenAI, fake: FakeServer, storage: Path
) -> None:
    """As in the Responses API and the chat loop, a Chat Completions stream that the model
    server drops, or that the client leaves, logs the text streamed so far as the failed
    run's ``partial`` (never as history); a drop is named a drop, not an unreachable server."""
    fake.reply = "one two three four"
    fake.drop_next(after_chunks=2)  # the role chunk and one piece of text
    chat = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "cut"}]}
    with httpx.stream(
        "POST", f"{gateway.url}/chat/completions", json=chat, headers={"X-Session-Id": "cut"}
    ) as answer:
        events = [json.loads(line[6:]) for line in answer.iter_lines() if line]
    assert events[-1]["error"]["code"] == "upstream_dropped"
    [failed] = state_of(storage, "chat:cut").failed.values()
    assert failed["error_type"] == "upstream_dropped"
    assert failed["partial"] == events[1]["choices"][0]["delta"]["content"] == "one tw"

    fake.chunk_delay = 0.2
    try:
        headers = {"X-Session-Id": "left"}
        with httpx.stream(
            "POST", f"{gateway.url}/chat/completions", json=chat, headers=headers
        ) as answer:
            for line in answer.iter_lines():
                if '"one tw"' in line:
                    break
    finally:
        fake.chunk_delay = 0.0

    def partial() -> str:
        [failed] = state_of(storage, "chat:left").failed.values()
        return str(failed["partial"])

    assert "one two three four".startswith(_wait_for(partial)) and partial().startswith("one tw")
    assert [m["content"] for m in state_of(storage, "chat:left").history] == ["cut"]


def test_a_failed_stream_is_retrieved_with_its_partial_output(
    gateway: GatewayProcess, client: openai.OpenAI, fake: FakeServer
) -> None:
    """As OpenAI's API: a stored response whose stream failed part way (the server dropped
    it, or the client left) is retrieved ``failed`` with the text streamed so far as its
    message, ``incomplete``, under the id the stream announced (it was ``output: []``), as
    the stream's ``response.failed`` event shows it."""

    def read(lines: Iterator[str], stop: bool) -> list[dict[str, Any]]:
        events = []
        for line in lines:
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if stop and events[-1]["type"] == "response.output_text.delta":
                    break
        return events

    def failed(rid: str) -> dict[str, Any]:
        try:  # a client that left: its turn is stored a moment later
            body = retrieved(client, rid)
        except openai.NotFoundError as exc:
            raise AssertionError(rid) from exc
        assert body["status"] == "failed" and body["error"]["message"]
        return body

    def check(events: list[dict[str, Any]]) -> str:
        """The retrieved message is the stream's; returns its text."""
        added = next(e for e in events if e["type"] == "response.output_item.added")
        text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        body = _wait_for(lambda: failed(events[0]["response"]["id"]))
        [message] = body["output"]
        assert (message["id"], message["status"]) == (added["item"]["id"], "incomplete")
        assert text and text_of(body).startswith(text)
        if events[-1]["type"] == "response.failed":  # the stream's last word says the same
            assert events[-1]["response"]["output"] == body["output"]
        return text_of(body)

    fake.reply = "one two three four"
    fake.drop_next(after_chunks=2)  # the role chunk and one piece of text
    with client.responses.with_streaming_response.create(
        model=MODEL, input="cut", stream=True
    ) as raw:
        events = read(raw.iter_lines(), stop=False)
    assert check(events) == "one tw"
    fake.chunk_delay = 0.2
    try:
        request = {"model": MODEL, "input": "leave", "stream": True}
        with httpx.stream("POST", f"{gateway.url}/responses", json=request) as answer:
            events = read(answer.iter_lines(), stop=True)
    finally:
        fake.chunk_delay = 0.0
    assert "one two three four".startswith(check(events))


def test_a_stream_cut_in_a_tool_call_keeps_the_text_it_streamed(
    gateway: GatewayProcess, client: openai.OpenAI, fake: FakeServer, storage: Path
) -> None:
    """The chat loop's rule for a failed stream, in both APIs: the reply text streamed before
    the failure is the failed run's ``partial`` (a Responses retrieval shows it as its
    message, ``incomplete``, under the id it was streamed as); its reasoning and a tool call
    cut short (never run, its arguments unfinished) are not kept. The next turn sends none
    of it, and works."""
    fake.reply = FakeReply(
        content="Let me look.",
        reasoning="The user wants weather.",
        tool_calls=[FakeToolCall("weather", '{"city": "Oslo"}', "call_9")],
    )
    cut = 1 + 3 + 3 + 2  # role, reasoning, text, the call's head and a piece of its arguments
    fake.drop_next(after_chunks=cut)
    chat = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "weather?"}]}
    headers = {"X-Session-Id": "cut-call"}
    with httpx.stream(
        "POST", f"{gateway.url}/chat/completions", json=chat, headers=headers
    ) as answer:
        lines = [json.loads(line[6:]) for line in answer.iter_lines() if line]
    assert lines[-1]["error"]["code"] == "upstream_dropped"
    state = state_of(storage, "chat:cut-call")
    [failed] = state.failed.values()
    assert failed["partial"] == "Let me look." and len(state.history) == 1

    fake.drop_next(after_chunks=cut)
    events = _weather_stream(client)
    assert events[-1]["type"] == "response.failed"
    streamed = next(e for e in events if e["type"] == "response.output_text.done")
    body = retrieved(client, events[0]["response"]["id"])
    [message] = body["output"]
    assert (message["id"], message["status"]) == (streamed["item_id"], "incomplete")
    assert text_of(body) == streamed["text"] == "Let me look."
    fake.reply = "sunny"
    after = created(client, input="and now?", previous_response_id=body["id"])
    assert text_of(after) == "sunny"
    assert fake.last_request["messages"] == [{"role": "user", "content": "and now?"}]


def test_continuing_a_conversations_response_outside_it_leaves_it_alone(
    client: openai.OpenAI,
) -> None:
    """``previous_response_id`` of a response made in a conversation branches off it: the
    conversation keeps only what was sent to it."""
    conv = client.conversations.create()
    inside = created(client, input="inside", conversation=conv.id)
    outside = created(client, input="outside", previous_response_id=inside["id"])
    further = created(client, input="further", previous_response_id=outside["id"])
    assert text_of(retrieved(client, further["id"])) == "echo: further"
    texts = [i.content[0].text for i in client.conversations.items.list(conv.id, order="asc")]  # type: ignore[union-attr]
    assert texts == ["inside", "echo: inside"]
    assert retrieved(client, outside["id"])["conversation"] is None


def _wait_for(check: Any, seconds: float = 10) -> Any:
    """``check()``, once it no longer fails (an assertion, or a record not there yet: a missing
    key, an unpacking of none) or ``seconds`` have passed."""
    import time

    deadline = time.monotonic() + seconds
    while True:
        try:
            return check()
        except (AssertionError, KeyError, ValueError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_a_client_that_goes_away_mid_stream_leaves_a_failed_turn(
    gateway: GatewayProcess, fake: FakeServer, storage: Path, client: openai.OpenAI
) -> None:
    """As Ctrl-C in the chat loop: the input is kept, marked failed, and never sent again."""
    conv = client.conversations.create()
    fake.chunk_delay = 0.2
    try:
        body = {"model": MODEL, "input": "gone", "stream": True, "conversation": conv.id}
        with httpx.stream("POST", f"{gateway.url}/responses", json=body) as answer:
            for line in answer.iter_lines():
                if "output_text.delta" in line:
                    break
        chat = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "bye"}]}
        headers = {"X-Session-Id": "gone"}
        with httpx.stream(
            "POST", f"{gateway.url}/chat/completions", json=chat, headers=headers
        ) as answer:
            for line in answer.iter_lines():
                if "content" in line:
                    break
    finally:
        fake.chunk_delay = 0.0

    def failed(context: str, text: str) -> None:
        state = state_of(storage, context)
        assert state.failed and text in str(state.history[-1])

    _wait_for(lambda: failed(f"conv:{conv.id}", "gone"))
    _wait_for(lambda: failed("chat:gone", "bye"))
    assert text_of(created(client, input="back", conversation=conv.id)) == "echo: back"
    assert [m["content"] for m in fake.last_request["messages"]] == ["back"]


def test_what_the_gateway_keeps_is_an_ordinary_context(
    client: openai.OpenAI, storage: Path
) -> None:
    """``list``, ``search`` and ``show --segments`` read it like any other."""
    from click.testing import CliRunner

    from terrarium.cli import cli

    root = created(client, input="quokka facts")
    created(client, input="left", previous_response_id=root["id"])
    created(client, input="right", previous_response_id=root["id"])
    context = f"resp:{root['id'][6:32]}"
    runner = CliRunner()
    where = ["--storage-dir", str(storage)]
    listed = runner.invoke(cli, ["list", *where], catch_exceptions=False)
    assert context in listed.output
    found = runner.invoke(cli, ["search", "quokka", *where], catch_exceptions=False)
    assert context in found.output
    shown = runner.invoke(cli, ["show", "--segments", context, *where], catch_exceptions=False)
    assert shown.exit_code == 0 and "fork" in shown.output


def _weather_stream(client: openai.OpenAI) -> list[dict[str, Any]]:
    """The events of a streamed Responses call asking the weather, with a weather tool."""
    tool = {"type": "function", "name": "weather", "parameters": {"type": "object"}}
    with client.responses.with_streaming_response.create(
        model=MODEL,
        input="weather?",
        tools=[tool],
        stream=True,  # type: ignore[list-item]
    ) as raw:
        return [json.loads(line[6:]) for line in raw.iter_lines() if line.startswith("data: ")]


def test_a_stream_with_reasoning_text_and_calls_validates_and_is_stored(
    client: openai.OpenAI, fake: FakeServer
) -> None:
    fake.reply = FakeReply(
        content="Let me look.",
        reasoning="The user wants weather.",
        tool_calls=[FakeToolCall("weather", '{"city": "Oslo"}', "call_9")],
    )
    events = _weather_stream(client)
    for event in events:
        EVENTS.validate_python(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert events[-1]["type"] == "response.completed"
    assert [item["type"] for item in final["output"]] == ["reasoning", "message", "function_call"]
    args = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    assert json.loads(args[0]["arguments"]) == {"city": "Oslo"}
    added = [e["output_index"] for e in events if e["type"] == "response.output_item.added"]
    assert added == [0, 1, 2]
    assert retrieved(client, final["id"])["output"] == final["output"]
    fake.reply = "done"
    output = {"type": "function_call_output", "call_id": "call_9", "output": "rain"}
    created(client, input=[output], previous_response_id=final["id"])
    sent = fake.last_request["messages"]
    assert sent[-2]["content"] == "Let me look." and sent[-2]["tool_calls"][0]["id"] == "call_9"


def test_clients_continuing_one_response_at_once_each_get_a_branch(
    client: openai.OpenAI, gateway: GatewayProcess, fake: FakeServer, storage: Path
) -> None:
    """Ten retries of one turn at the same time: ten branches, none clobbered."""
    from concurrent.futures import ThreadPoolExecutor

    root = created(client, input="root")

    def branch(n: int) -> dict[str, Any]:
        with openai.OpenAI(base_url=gateway.url, api_key="x", max_retries=0) as c:
            return created(c, input=f"branch {n}", previous_response_id=root["id"])

    with ThreadPoolExecutor(10) as pool:
        branches = list(pool.map(branch, range(10)))
    for n, body in enumerate(branches):
        again = retrieved(client, body["id"])
        assert text_of(again) == f"echo: branch {n}"
        more = created(client, input="more", previous_response_id=body["id"])
        sent = [m["content"] for m in fake.last_request["messages"]]
        assert sent == ["root", "echo: root", f"branch {n}", f"echo: branch {n}", "more"]
        assert text_of(more) == "echo: more"
    with open_store(str(storage), create=False) as store:
        head = store.get_head(ContextId("resp", root["id"][6:32]))
        assert head is not None
        assert len(store.list_segments(head.session_id)) == 10  # one appended, nine forks


def test_a_slow_upstream_is_a_504_and_a_failed_turn(tmp_path: Path) -> None:
    with (
        FakeServer(delay=3) as slow,
        GatewayProcess(tmp_path / "s", slow.base_url, "--timeout", "0.5") as gw,
    ):
        with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as c:
            conv = c.conversations.create()
            with pytest.raises(openai.APIStatusError) as failed:
                c.responses.create(model=MODEL, input="slow", conversation=conv.id)
    assert failed.value.status_code == 504
    assert failed.value.body["code"] == "timeout"  # type: ignore[index]
    state = state_of(tmp_path / "s", f"conv:{conv.id}")
    assert state.failed and state.last_run is not None and state.last_run.status == "errored"


def test_sampling_parameters_go_upstream_and_input_items_page(
    client: openai.OpenAI, fake: FakeServer
) -> None:
    items = [{"role": "user", "content": f"part {n}"} for n in range(5)]
    body = created(client, input=items, temperature=0.25, top_p=0.5, max_output_tokens=64)
    sent = fake.last_request
    assert (sent["temperature"], sent["top_p"], sent["max_tokens"]) == (0.25, 0.5, 64)
    again = retrieved(client, body["id"])
    assert (again["temperature"], again["top_p"], again["max_output_tokens"]) == (0.25, 0.5, 64)
    first = client.responses.input_items.list(body["id"], limit=2, order="asc")
    texts = [item.content[0].text for item in first.data]  # type: ignore[union-attr]
    assert texts == ["part 0", "part 1"] and first.has_more
    rest = client.responses.input_items.list(body["id"], after=first.data[-1].id, order="asc")
    assert [i.content[0].text for i in rest.data] == ["part 2", "part 3", "part 4"]  # type: ignore[union-attr]
    newest = client.responses.input_items.list(body["id"], limit=1)
    assert newest.data[0].content[0].text == "part 4"  # type: ignore[union-attr]


def test_the_command_refuses_bad_options_in_one_line(tmp_path: Path) -> None:
    import socket

    from click.testing import CliRunner

    from terrarium.cli import cli

    runner = CliRunner()
    where = ["--storage-dir", str(tmp_path / "s")]
    missing = runner.invoke(cli, ["gateway", *where])
    assert missing.exit_code == 2 and "Missing option '--upstream'" in missing.output
    bad = runner.invoke(cli, ["gateway", *where, "--upstream", "ftp://localhost:8000"])
    assert bad.exit_code == 2 and "use an http:// or https:// URL" in bad.output
    empty = runner.invoke(cli, ["gateway", *where, "--upstream", "http://x/v1", "--token", " "])
    assert empty.exit_code == 2 and "the token may not be empty" in empty.output
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = str(taken.getsockname()[1])
        busy = runner.invoke(cli, ["gateway", *where, "--upstream", "http://x/v1", "--port", port])
    assert busy.exit_code == 1
    assert busy.output.strip().endswith(
        "the port is in use (stop what listens there, or pick another with --port)"
    )
    assert "Traceback" not in busy.output


@pytest.mark.parametrize(
    "header", ["X-Session-Id", "X-Conversation-Id", "X-Chat-Id", "X-OpenWebUI-Chat-Id"]
)
def test_every_session_header_names_a_session(
    client: openai.OpenAI, storage: Path, header: str
) -> None:
    name = f"h-{header.lower()}"
    client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], extra_headers={header: name}
    )
    assert len(state_of(storage, f"chat:{name}").history) == 2


def test_a_session_id_that_is_not_text_is_a_400(gateway: GatewayProcess, fake: FakeServer) -> None:
    """``metadata.session_id`` that is not a string was dropped unsaid, and the chat went
    unrecorded; it is a 400 naming ``metadata``, and the upstream is not called."""
    calls = len(fake.requests)
    messages = [{"role": "user", "content": "x"}]
    for given in (5, ["a"], {"id": "a"}):
        body = {"model": MODEL, "messages": messages, "metadata": {"session_id": given}}
        answer = httpx.post(f"{gateway.url}/chat/completions", json=body)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["param"] == "metadata"
    assert len(fake.requests) == calls


def test_a_chat_without_a_session_is_not_kept(
    client: openai.OpenAI, fake: FakeServer, storage: Path
) -> None:
    with open_store(str(storage)) as store:
        before = {c.context for c in store.list_contexts()}
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "unkept"}]
    )
    assert answer.choices[0].message.content == "echo: unkept"
    with open_store(str(storage)) as store:
        assert {c.context for c in store.list_contexts()} == before


def test_the_server_keeps_idle_connections_longer_than_the_openai_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """uvicorn closes an idle connection after ``KEEP_ALIVE`` s, the openai client (httpx)
    reuses one for ``keepalive_expiry`` s: were the server's the shorter, a client could send a
    request on a connection the server was closing, and get a reset (``httpx.ReadError``)."""
    import socket

    import uvicorn

    from terrarium.cli import serve

    configs: list[Any] = []

    class Server:
        def __init__(self, config: Any) -> None:
            configs.append(config)

        def run(self, sockets: Any) -> None:
            pass

    monkeypatch.setattr(uvicorn, "Server", Server)
    with socket.socket() as sock:
        serve.run_server(object(), sock)
    expiry = openai.DEFAULT_CONNECTION_LIMITS.keepalive_expiry
    assert expiry is not None and configs[0].timeout_keep_alive == serve.KEEP_ALIVE > 2 * expiry


def test_a_message_kept_in_a_blob_is_sent_whole_when_the_chain_goes_on(
    client: openai.OpenAI, fake: FakeServer
) -> None:
    """An input over the store's blob threshold (64 KiB) is logged as a preview and a blob;
    the next response of the chain sends the upstream all of it."""
    long = "word " * 14_000  # 70,000 characters
    first = created(client, input=long)
    created(client, input="and again", previous_response_id=first["id"])
    sent = [m["content"] for m in fake.last_request["messages"] if m["role"] == "user"]
    assert sent == [long, "and again"]
