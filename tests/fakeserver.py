"""A small OpenAI-protocol chat server that stands in for vLLM in tests. Standard library only.

It serves ``GET /v1/models`` and ``POST /v1/chat/completions`` (plain and SSE streaming) on
127.0.0.1, one thread per connection, so a slow reply never blocks the others. Replies are
deterministic and depend on the request (``echo: <last user message>`` by default), usage is a
deterministic token count, and ``prompt_tokens_details.cached_tokens`` mimics vLLM's automatic
prefix caching: the tokens of the longest run of leading messages this request shares with the
previous served request.

Every chat request body is recorded, and faults can be queued per test::

    with FakeServer() as server:
        server.fail_next(503, count=2)      # two 503s, then normal replies
        server.drop_next(after_chunks=2)    # next stream: 2 SSE events, then the socket closes
        server.malformed_next()             # next reply is not valid JSON
        server.delay = 0.2                  # every reply waits 0.2 s before its first byte
        server.strict_roles = True          # refuse user/user or assistant/assistant (HTTP 400)
        server.usage_in_replies = False     # plain replies carry no usage
        server.usage_in_streams = False     # streams carry none, even when asked for
        server.reject_stream_options = True # HTTP 400 naming stream_options, as old servers do
        server.tokenizer = "vllm"           # serve POST /tokenize vLLM's way ("llamacpp": its way)
        server.tokenizer_status = 500       # /tokenize answers that error status instead
        server.context_window = 200         # HTTP 400, vLLM's "maximum context length is 200
                                            # tokens ...", for prompts of more tokens
        ...
        server.requests                     # the chat request bodies received, in order
        server.request_headers              # their headers, names lowercased
        server.tokenize_requests            # the /tokenize request bodies received, in order
        server.chat_times                   # seconds each chat request took the server itself

Run it by hand with ``python tests/fakeserver.py --port 8000`` (serves until Ctrl-C).
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

__all__ = [
    "CONTEXT_LENGTH_MESSAGE",
    "ROLES_MESSAGE",
    "STREAM_OPTIONS_MESSAGE",
    "FakeReply",
    "FakeServer",
    "FakeToolCall",
    "Fault",
    "context_length_message",
    "count_tokens",
    "tokenize_messages",
    "tokenize_text",
]


def context_length_message(window: int, prompt_tokens: int) -> str:
    """vLLM's HTTP 400 for a prompt of ``prompt_tokens`` that does not fit ``window``."""
    return (
        f"This model's maximum context length is {window} tokens. However, you requested "
        f"{prompt_tokens} tokens ({prompt_tokens} in the messages, 0 in the completion). "
        "Please reduce the length of the messages or completion."
    )


CONTEXT_LENGTH_MESSAGE = (
    "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens "
    "(4000 in the messages, 1000 in the completion). Please reduce the length of the messages "
    "or completion."
)
"""The wording vLLM uses when a prompt does not fit the context window (HTTP 400)."""

ROLES_MESSAGE = "Conversation roles must alternate user/assistant/user/assistant/..."
"""What strict chat templates (Llama 2, Mistral, Gemma) raise; vLLM answers it with HTTP 400."""

STREAM_OPTIONS_MESSAGE = "Unrecognized request argument supplied: stream_options"
"""What a server that does not know ``stream_options`` answers (HTTP 400)."""

TokenizerStyle = Literal["vllm", "llamacpp"]

_DEFAULT_MESSAGES = {
    400: CONTEXT_LENGTH_MESSAGE,
    401: "Unauthorized",
    404: "The model `{model}` does not exist.",
    429: "Too many requests, please slow down.",
    500: "Internal server error",
    502: "Bad gateway",
    503: "Service unavailable: the engine is overloaded",
}

_ERROR_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    429: "RateLimitError",
}


@dataclass(frozen=True)
class FakeToolCall:
    """A tool call the fake model makes."""

    name: str
    arguments: str = "{}"
    """The call's arguments as a JSON string, streamed in pieces."""
    id: str | None = None
    """The call id; ``call_<n>`` when None."""


@dataclass(frozen=True)
class FakeReply:
    """A reply with more than text: reasoning, tool calls, a chosen finish reason."""

    content: str = ""
    reasoning: str = ""
    """Sent as ``reasoning_content``, the field vLLM's reasoning parsers fill."""
    tool_calls: Sequence[FakeToolCall] = ()
    finish_reason: str | None = None
    """``stop``, or ``tool_calls`` when there are tool calls, unless set."""


ReplyFn = Callable[[list[dict[str, Any]]], "str | FakeReply"]


@dataclass(frozen=True)
class Fault:
    """One queued fault, consumed by the next chat request."""

    kind: Literal["status", "drop", "malformed"]
    status: int = 500
    """For ``status``: the HTTP status to answer with."""
    message: str | None = None
    """For ``status``: the error message; a vLLM-like default per status when None."""
    code: str | int | None = None
    """For ``status``: the error body's ``code``; the status number when None."""
    retry_after: float | None = None
    """For ``status``: a ``Retry-After`` header value in seconds."""
    after_chunks: int = 0
    """For ``drop`` and streamed ``malformed``: SSE events sent before the fault."""


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(p.get("text", ""))
            for p in content
            if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def count_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """The fake tokenizer: characters of all message contents // 4, plus one per message."""
    chars = sum(len(_content_text(m.get("content"))) for m in messages)
    return chars // 4 + len(messages)


def tokenize_text(text: str) -> list[int]:
    """The fake ``/tokenize``: one token per whitespace-separated word (its length as the id).

    Deliberately unlike :func:`count_tokens` and a characters / 4 estimate, so a test can
    tell which of them produced a count.
    """
    return [len(word) for word in text.split()]


def tokenize_messages(messages: Sequence[Mapping[str, Any]]) -> int:
    """The fake vLLM ``/tokenize`` of chat messages: their words, plus a chat template's 4
    tokens per message and 3 for the generation prompt."""
    words = sum(len(tokenize_text(_content_text(m.get("content")))) for m in messages)
    return words + 4 * len(messages) + 3


def _common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def _split(text: str, pieces: int) -> list[str]:
    """Split text into at most ``pieces`` non-empty parts (one empty part for empty text)."""
    if not text:
        return []
    pieces = max(1, min(pieces, len(text)))
    size = -(-len(text) // pieces)
    return [text[i : i + size] for i in range(0, len(text), size)]


def roles_alternate(messages: Sequence[Mapping[str, Any]]) -> bool:
    """False when two adjacent messages are both ``user`` or both ``assistant``.

    That is what strict chat templates refuse. Tool results may sit between an assistant
    message with tool calls and the next assistant message.
    """
    roles = [m.get("role") for m in messages]
    return not any(a == b and a in ("user", "assistant") for a, b in itertools.pairwise(roles))


def default_reply(messages: list[dict[str, Any]]) -> str:
    """``echo: <content of the last user message>``."""
    for message in reversed(messages):
        if message.get("role") == "user":
            return f"echo: {_content_text(message.get('content'))}"
    return "echo: "


@dataclass
class _State:
    models: list[str]
    reply: ReplyFn
    delay: float
    chunk_delay: float
    chunks: int
    strict_roles: bool = False
    usage_in_replies: bool = True
    usage_in_streams: bool = True
    reject_stream_options: bool = False
    tokenizer: TokenizerStyle | None = None
    tokenizer_status: int | None = None
    context_window: int | None = None
    tokenize_requests: list[Any] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    requests: list[dict[str, Any]] = field(default_factory=list)
    raw_requests: list[bytes] = field(default_factory=list)
    request_headers: list[dict[str, str]] = field(default_factory=list)
    chat_times: list[float] = field(default_factory=list)
    faults: deque[Fault] = field(default_factory=deque)
    previous: list[Any] = field(default_factory=list)
    served: int = 0
    active: int = 0
    peak: int = 0
    model_list_calls: int = 0
    stopping: threading.Event = field(default_factory=threading.Event)


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close() joins the handler threads
    block_on_close = True
    request_queue_size = 256  # many clients connecting at once must not hit a full backlog
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], state: _State) -> None:
        self.state = state
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self.sockets_lock:
            self.open_sockets.discard(request)
        super().shutdown_request(request)

    def disconnect_all(self) -> None:
        """Shut down every open connection so idle keep-alive handler threads end."""
        with self.sockets_lock:
            sockets = list(self.open_sockets)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        """Disable Nagle: headers and body go out in separate writes, like any real server."""
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        """Stay quiet: tests read the recorded requests instead."""

    # ------------------------------------------------------------------ plumbing

    def _send_json(self, status: int, body: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self._send_raw(status, data, headers)

    def _send_raw(self, status: int, data: bytes, headers: Mapping[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _send_error(
        self,
        status: int,
        message: str,
        code: str | int | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        error = {
            "message": message,
            "type": _ERROR_TYPES.get(status, "InternalServerError" if status >= 500 else "Error"),
            "param": None,
            "code": status if code is None else code,
        }
        self._send_json(status, {"error": error}, headers)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    # ------------------------------------------------------------------ routes

    def do_GET(self) -> None:
        """Serve ``/v1/models``."""
        state = self.server.state
        if self.path.rstrip("/") not in ("/v1/models", "/models"):
            self._send_error(404, f"no route {self.path}")
            return
        with state.lock:
            state.model_list_calls += 1
            models = list(state.models)
        created = int(time.time())
        data = [
            {"id": m, "object": "model", "created": created, "owned_by": "fakeserver"}
            for m in models
        ]
        self._send_json(200, {"object": "list", "data": data})

    def do_POST(self) -> None:
        """Serve ``/v1/chat/completions``, and ``/tokenize`` (404 unless a tokenizer is set)."""
        state = self.server.state
        started = time.perf_counter()
        raw = self._read_body()
        if self.path.rstrip("/") == "/tokenize":
            self._tokenize(raw)
            return
        if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
            self._send_error(404, f"no route {self.path}")
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._send_error(400, "request body is not JSON")
            return
        with state.lock:
            state.requests.append(body)
            state.raw_requests.append(raw)
            state.request_headers.append({k.lower(): v for k, v in self.headers.items()})
            fault = state.faults.popleft() if state.faults else None
            state.active += 1
            state.peak = max(state.peak, state.active)
            delay = state.delay
        try:
            self._chat(body, fault, delay)
        finally:
            with state.lock:
                state.active -= 1
                state.chat_times.append(time.perf_counter() - started)

    def _tokenize(self, raw: bytes) -> None:
        """``POST /tokenize`` at the root, as vLLM or llama.cpp's server answer it."""
        state = self.server.state
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        with state.lock:
            state.tokenize_requests.append(body)
        if state.tokenizer is None:
            self._send_error(404, f"no route {self.path}")
            return
        if state.tokenizer_status is not None:
            self._send_error(state.tokenizer_status, "tokenizer unavailable")
            return
        if not isinstance(body, dict):
            self._send_error(400, "request body is not a JSON object")
            return
        if state.tokenizer == "llamacpp":
            # llama.cpp tokenizes "content" and ignores the rest: no content, no tokens.
            content = body.get("content")
            self._send_json(
                200, {"tokens": tokenize_text(content) if isinstance(content, str) else []}
            )
            return
        if isinstance(body.get("messages"), list):
            count = tokenize_messages(body["messages"])
        elif isinstance(body.get("prompt"), str):
            count = len(tokenize_text(body["prompt"])) + int(body.get("add_special_tokens", True))
        else:
            self._send_error(400, "1 validation error: 'prompt' or 'messages' is required")
            return
        if body.get("model") not in state.models:
            self._send_error(404, f"The model `{body.get('model')}` does not exist.")
            return
        self._send_json(200, {"count": count, "max_model_len": 4096, "tokens": list(range(count))})

    def _chat(self, body: dict[str, Any], fault: Fault | None, delay: float) -> None:
        state = self.server.state
        model = body.get("model")
        messages = body.get("messages")
        if delay > 0 and state.stopping.wait(delay):
            self.close_connection = True
            return
        if fault is not None and fault.kind == "status":
            text = fault.message or _DEFAULT_MESSAGES.get(fault.status, "error")
            headers = None if fault.retry_after is None else {"Retry-After": str(fault.retry_after)}
            self._send_error(fault.status, text.format(model=model), fault.code, headers)
            return
        if model not in state.models:
            self._send_error(404, f"The model `{model}` does not exist.", code=404)
            return
        if not isinstance(messages, list) or not messages:
            self._send_error(400, "messages must be a non-empty list")
            return
        if state.strict_roles and not roles_alternate(messages):
            self._send_error(400, ROLES_MESSAGE, code=400)
            return
        window = state.context_window
        if window is not None and count_tokens(messages) > window:
            self._send_error(400, context_length_message(window, count_tokens(messages)), 400)
            return
        if state.reject_stream_options and "stream_options" in body:
            self._send_error(400, STREAM_OPTIONS_MESSAGE, code=None)
            return
        if fault is not None and fault.kind == "malformed" and not body.get("stream"):
            self._send_raw(200, b'{"id": "chatcmpl-broken", "choices": [{"index": 0, "mess')
            return

        reply = state.reply(messages)
        if isinstance(reply, str):
            reply = FakeReply(content=reply)
        prompt_tokens = count_tokens(messages)
        with state.lock:
            prefix = _common_prefix(messages, state.previous)
            state.previous = list(messages)
            state.served += 1
            serial = state.served
        cached = count_tokens(messages[:prefix]) if prefix else 0
        completion_chars = len(reply.content) + len(reply.reasoning)
        completion_chars += sum(len(c.name) + len(c.arguments) for c in reply.tool_calls)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_chars // 4 + 1,
            "total_tokens": prompt_tokens + completion_chars // 4 + 1,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        finish = reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")
        completion_id = f"chatcmpl-fake-{serial}"
        if body.get("stream"):
            options = (body.get("stream_options") or {}) if state.usage_in_streams else {}
            self._stream(completion_id, str(model), reply, finish, usage, options, fault)
            return
        message: dict[str, Any] = {"role": "assistant", "content": reply.content or None}
        if reply.reasoning:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id or f"call_{i}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for i, call in enumerate(reply.tool_calls)
            ]
        elif message["content"] is None:
            message["content"] = ""
        answer = {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
            ],
        }
        if state.usage_in_replies:
            answer["usage"] = usage
        self._send_json(200, answer)

    def _stream(
        self,
        completion_id: str,
        model: str,
        reply: FakeReply,
        finish: str,
        usage: dict[str, Any],
        options: Mapping[str, Any],
        fault: Fault | None,
    ) -> None:
        state = self.server.state
        created = int(time.time())

        def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
            return {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [
                    {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
                ],
            }

        events: list[dict[str, Any]] = [chunk({"role": "assistant", "content": ""})]
        events += [chunk({"reasoning_content": p}) for p in _split(reply.reasoning, state.chunks)]
        events += [chunk({"content": p}) for p in _split(reply.content, state.chunks)]
        for i, call in enumerate(reply.tool_calls):
            head = {
                "index": i,
                "id": call.id or f"call_{i}",
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            events.append(chunk({"tool_calls": [head]}))
            for piece in _split(call.arguments, state.chunks):
                events.append(
                    chunk({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
                )
        events.append(chunk({}, finish))
        if options.get("include_usage"):
            events.append(
                {
                    "id": completion_id,
                    "object": "chat.completion.chunk",
                    "created": created,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def write(data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        for n, event in enumerate(events):
            if (
                fault is not None
                and fault.kind in ("drop", "malformed")
                and n == fault.after_chunks
            ):
                if fault.kind == "malformed":
                    write(b'data: {"id": "chatcmpl-broken", "choices": [{"del\n\n')
                    write(b"")
                    return
                # Drop: no terminating chunk, no [DONE]; the socket just closes.
                self.close_connection = True
                return
            if n and state.chunk_delay > 0 and state.stopping.wait(state.chunk_delay):
                self.close_connection = True
                return
            write(b"data: " + json.dumps(event).encode() + b"\n\n")
        write(b"data: [DONE]\n\n")
        write(b"")  # the terminating zero-length chunk


class FakeServer:
    """An OpenAI-compatible chat server on 127.0.0.1, run in a background thread.

    Use it as a context manager (or call :meth:`start` and :meth:`stop`). Attributes ``delay``,
    ``chunk_delay``, ``reply``, ``models``, ``chunks``, ``strict_roles``, ``context_window``
    and the usage and tokenizer settings may be changed while it runs.
    """

    def __init__(
        self,
        *,
        model: str = "fake-model",
        models: Sequence[str] | None = None,
        reply: ReplyFn | None = None,
        delay: float = 0.0,
        chunk_delay: float = 0.0,
        chunks: int = 3,
        strict_roles: bool = False,
        usage_in_replies: bool = True,
        usage_in_streams: bool = True,
        reject_stream_options: bool = False,
        tokenizer: TokenizerStyle | None = None,
        context_window: int | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        """Configure the server; nothing listens until :meth:`start`.

        Args:
            model: The one model served (ignored when ``models`` is given).
            models: The models ``/v1/models`` lists; may be empty.
            reply: ``(messages) -> str | FakeReply``; ``echo: <last user message>`` by default.
            delay: Seconds each chat reply waits before its first byte.
            chunk_delay: Seconds between streamed SSE events.
            chunks: How many pieces streamed text (and tool arguments) is split into.
            strict_roles: Refuse (HTTP 400, :data:`ROLES_MESSAGE`) a request with two user or
                two assistant messages in a row, as strict chat templates do.
            usage_in_replies: Plain replies carry ``usage`` (llama.cpp's and vLLM's do).
            usage_in_streams: Streams end with a usage chunk when the request asks for it
                (``stream_options.include_usage``); False never sends one.
            reject_stream_options: Refuse any request with ``stream_options`` (HTTP 400,
                :data:`STREAM_OPTIONS_MESSAGE`), as servers that do not know it do.
            tokenizer: Serve ``POST /tokenize`` at the root like vLLM (``{"model", "prompt"}``
                or ``{"model", "messages"}`` -> ``{"count", ...}``) or llama.cpp's server
                (``{"content"}`` -> ``{"tokens"}``); None: no such route (404). Counts are
                :func:`tokenize_text` and :func:`tokenize_messages`.
            context_window: Refuse (HTTP 400, vLLM's words from
                :func:`context_length_message`) a request whose messages count more tokens
                (:func:`count_tokens`) than this; None: no limit.
            host: Address to bind.
            port: Port to bind; 0 picks a free one.
        """
        self._state = _State(
            models=list(models) if models is not None else [model],
            reply=reply or default_reply,
            delay=delay,
            chunk_delay=chunk_delay,
            chunks=chunks,
            strict_roles=strict_roles,
            usage_in_replies=usage_in_replies,
            usage_in_streams=usage_in_streams,
            reject_stream_options=reject_stream_options,
            tokenizer=tokenizer,
            context_window=context_window,
        )
        self._address = (host, port)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> FakeServer:
        """Bind and serve in a background thread."""
        if self._server is not None:
            raise RuntimeError("fake server already started")
        self._state.stopping.clear()
        self._server = _Server(self._address, self._state)
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.01},
            name="fakeserver",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close every connection and join every thread."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        self._state.stopping.set()
        server.shutdown()
        thread.join()
        server.disconnect_all()
        server.server_close()
        self._server = self._thread = None

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ addresses

    @property
    def port(self) -> int:
        """The bound port."""
        if self._server is None:
            raise RuntimeError("fake server not started")
        return int(self._server.server_address[1])

    @property
    def root_url(self) -> str:
        """``http://127.0.0.1:PORT`` (no ``/v1``)."""
        return f"http://{self._address[0]}:{self.port}"

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, what an OpenAI client's ``base_url`` wants."""
        return f"{self.root_url}/v1"

    # ------------------------------------------------------------------ settings

    @property
    def models(self) -> list[str]:
        """The models served."""
        return list(self._state.models)

    @models.setter
    def models(self, value: Sequence[str]) -> None:
        with self._state.lock:
            self._state.models = list(value)

    @property
    def model(self) -> str:
        """The first model served."""
        return self._state.models[0]

    @property
    def reply(self) -> ReplyFn:
        """The reply function ``(messages) -> str | FakeReply``."""
        return self._state.reply

    @reply.setter
    def reply(self, value: ReplyFn | str | FakeReply) -> None:
        if isinstance(value, str | FakeReply):
            fixed = value
            self._state.reply = lambda _messages: fixed
        else:
            self._state.reply = value

    @property
    def delay(self) -> float:
        """Seconds each chat reply waits before its first byte."""
        return self._state.delay

    @delay.setter
    def delay(self, value: float) -> None:
        self._state.delay = value

    @property
    def chunk_delay(self) -> float:
        """Seconds between streamed SSE events."""
        return self._state.chunk_delay

    @chunk_delay.setter
    def chunk_delay(self, value: float) -> None:
        self._state.chunk_delay = value

    @property
    def chunks(self) -> int:
        """How many pieces streamed text is split into."""
        return self._state.chunks

    @chunks.setter
    def chunks(self, value: int) -> None:
        self._state.chunks = value

    @property
    def strict_roles(self) -> bool:
        """Refuse requests whose user/assistant roles do not alternate (HTTP 400)."""
        return self._state.strict_roles

    @strict_roles.setter
    def strict_roles(self, value: bool) -> None:
        self._state.strict_roles = value

    @property
    def usage_in_replies(self) -> bool:
        """Plain replies carry ``usage``."""
        return self._state.usage_in_replies

    @usage_in_replies.setter
    def usage_in_replies(self, value: bool) -> None:
        self._state.usage_in_replies = value

    @property
    def usage_in_streams(self) -> bool:
        """Streams end with a usage chunk when asked for one."""
        return self._state.usage_in_streams

    @usage_in_streams.setter
    def usage_in_streams(self, value: bool) -> None:
        self._state.usage_in_streams = value

    @property
    def reject_stream_options(self) -> bool:
        """Refuse requests with ``stream_options`` (HTTP 400)."""
        return self._state.reject_stream_options

    @reject_stream_options.setter
    def reject_stream_options(self, value: bool) -> None:
        self._state.reject_stream_options = value

    @property
    def tokenizer(self) -> TokenizerStyle | None:
        """The ``/tokenize`` style served (``vllm``, ``llamacpp``), or None for no route."""
        return self._state.tokenizer

    @tokenizer.setter
    def tokenizer(self, value: TokenizerStyle | None) -> None:
        self._state.tokenizer = value

    @property
    def tokenizer_status(self) -> int | None:
        """When set, ``/tokenize`` answers this HTTP error status instead of tokens."""
        return self._state.tokenizer_status

    @tokenizer_status.setter
    def tokenizer_status(self, value: int | None) -> None:
        self._state.tokenizer_status = value

    @property
    def context_window(self) -> int | None:
        """Requests of more tokens than this get vLLM's HTTP 400 (None: no limit)."""
        return self._state.context_window

    @context_window.setter
    def context_window(self, value: int | None) -> None:
        self._state.context_window = value

    # ------------------------------------------------------------------ faults

    def fail_next(
        self,
        status: int = 503,
        count: int = 1,
        *,
        message: str | None = None,
        code: str | int | None = None,
        retry_after: float | None = None,
    ) -> None:
        """Answer the next ``count`` chat requests with HTTP ``status`` and an error body.

        Default messages are vLLM's: 400 is the context-length error, 404 the unknown model.
        """
        self._queue(Fault("status", status, message, code, retry_after), count)

    def hold_replies(self, text: str = "late") -> tuple[threading.Event, threading.Event]:
        """Make replies wait until released: returns ``(arrived, release)``.

        ``arrived`` is set when a request reaches the reply; it then waits (up to 30 s) for
        ``release`` before answering ``text``. For tests that interrupt a turn mid-reply.
        """
        arrived, release = threading.Event(), threading.Event()

        def held(messages: list[dict[str, Any]]) -> str:
            arrived.set()
            release.wait(timeout=30)
            return text

        self.reply = held
        return arrived, release

    def drop_next(self, after_chunks: int = 1, count: int = 1) -> None:
        """Close the connection of the next ``count`` streams after ``after_chunks`` SSE events.

        The first event is the role-only chunk, so ``after_chunks=2`` delivers one text piece.
        No ``[DONE]`` and no terminating chunk are sent. Plain requests get a normal reply.
        """
        self._queue(Fault("drop", after_chunks=after_chunks), count)

    def malformed_next(self, count: int = 1, *, after_chunks: int = 0) -> None:
        """Send invalid JSON as the next ``count`` replies (as the SSE event after_chunks)."""
        self._queue(Fault("malformed", after_chunks=after_chunks), count)

    def _queue(self, fault: Fault, count: int) -> None:
        with self._state.lock:
            self._state.faults.extend([fault] * count)

    def clear_faults(self) -> None:
        """Drop every queued fault."""
        with self._state.lock:
            self._state.faults.clear()

    @property
    def pending_faults(self) -> int:
        """Faults queued and not yet consumed."""
        with self._state.lock:
            return len(self._state.faults)

    # ------------------------------------------------------------------ observations

    @property
    def requests(self) -> list[dict[str, Any]]:
        """Every chat request body received (faulted ones too), oldest first, as decoded JSON."""
        with self._state.lock:
            return list(self._state.requests)

    @property
    def request_headers(self) -> list[dict[str, str]]:
        """The headers of every chat request received (names lowercased), oldest first."""
        with self._state.lock:
            return list(self._state.request_headers)

    @property
    def raw_requests(self) -> list[bytes]:
        """The bodies of :attr:`requests` exactly as they came over the wire."""
        with self._state.lock:
            return list(self._state.raw_requests)

    @property
    def tokenize_requests(self) -> list[Any]:
        """Every ``/tokenize`` request body received (served or not), oldest first (None: not
        JSON)."""
        with self._state.lock:
            return list(self._state.tokenize_requests)

    @property
    def chat_times(self) -> list[float]:
        """Seconds each chat request took the server itself, oldest first: from its headers
        read to its answer written (streams included), the part of a client's wait that is
        neither the network nor the client."""
        with self._state.lock:
            return list(self._state.chat_times)

    @property
    def last_request(self) -> dict[str, Any]:
        """The most recent chat request body."""
        with self._state.lock:
            return self._state.requests[-1]

    @property
    def model_list_calls(self) -> int:
        """How many times ``/v1/models`` was asked."""
        with self._state.lock:
            return self._state.model_list_calls

    @property
    def peak_concurrency(self) -> int:
        """The most chat requests that were being served at the same time."""
        with self._state.lock:
            return self._state.peak


def main(argv: Sequence[str] | None = None) -> None:
    """Serve until Ctrl-C: ``python tests/fakeserver.py --port 8000``."""
    parser = argparse.ArgumentParser(description="A fake OpenAI-compatible chat server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--model", default="fake-model")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--chunk-delay", type=float, default=0.05, help="seconds between chunks")
    parser.add_argument(
        "--strict-roles", action="store_true", help="refuse user/user or assistant/assistant"
    )
    parser.add_argument(
        "--context-window", type=int, default=None, help="refuse prompts of more tokens (400)"
    )
    args = parser.parse_args(argv)
    server = FakeServer(
        model=args.model,
        delay=args.delay,
        chunk_delay=args.chunk_delay,
        strict_roles=args.strict_roles,
        context_window=args.context_window,
        host=args.host,
        port=args.port,
    )
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with server:
        print(f"fake model server: {server.base_url} (model {args.model!r}); Ctrl-C stops it")
        try:
            done.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
