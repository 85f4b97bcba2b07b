"""The model client: one OpenAI-compatible chat server (vLLM, llama.cpp, Ollama, OpenAI) over HTTP.

:class:`VLLMClient` wraps ``openai.AsyncOpenAI`` for a long-lived agent. Requests skip the
typed pipeline of ``chat.completions.create`` (:func:`_chat_request`), and messages go out
exactly as given, so vLLM's prefix cache reuses the previous turn's bytes. One retry loop
serves every call, a stream that failed before its first delta included. Errors are
:class:`~terrarium.errors.LLMError` subclasses with one-line messages; a reply without usage
gets an estimated one; ``on_trace`` sees each request, raw chunk, response and error.

A client belongs to one event loop (its connection pool does). Usage::

    async with VLLMClient("http://localhost:8000") as client:
        reply = await client.chat([{"role": "user", "content": "Hello"}])
        async for event in client.stream(history):
            print(event.delta, end="")
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import math
import os
import random
import re
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Literal, TypeVar, cast

import msgspec
import openai
from openai.types.chat import ChatCompletionChunk

from terrarium.errors import (
    BadResponse,
    ContextTooLong,
    LLMError,
    ModelNotFound,
    RateLimited,
    ServerUnreachable,
)
from terrarium.model import TraceEntry, UsageRecord, utc_now

__all__ = ["ChatResult", "StreamEvent", "VLLMClient", "chars_to_tokens"]

_log = logging.getLogger(__name__)

DEFAULT_BASE_URL = "http://localhost:8000"
_DUMMY_API_KEY = "EMPTY"  # local vLLM wants no key, but the openai client insists on one
_HINT = "start it, or set --base-url / TERRARIUM_BASE_URL"

_RESERVED_PARAMS = frozenset({"messages", "model", "stream"})
# openai 1.99 to 2.x send a bytes ``body`` as it is; later releases take it as ``content``
# (and deprecate the other).
_POST_TAKES_CONTENT = "content" in inspect.signature(openai.AsyncOpenAI.post).parameters
_REQUEST_OPTIONS = {"extra_headers": "headers", "extra_query": "params", "timeout": "timeout"}
"""``create()`` arguments that are request options (``_chat_request``), by option name."""

_CONTEXT_RE = re.compile(
    r"context[ _](length|size|window)|maximum context|too many tokens|prompt is too long",
    re.IGNORECASE,
)
_MAX_DETAIL = 300

CHARS_PER_TOKEN = 4
"""The ``chars`` estimate: a token is about four characters (English text with GPT-style and
Llama tokenizers); :func:`chars_to_tokens`."""
_TOKENIZE_TIMEOUT = 10.0  # seconds; a tokenizer slower than this is not worth waiting for
_NOT_THIS_STYLE = frozenset({400, 404, 405, 422, 501})  # /tokenize absent or of another kind
TokenizerKind = Literal["vllm", "llamacpp", "none"]

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ChatResult:
    """One complete answer from the model."""

    message: dict[str, Any]
    """The assistant message in OpenAI form, ready to append to the history as it is."""
    text: str
    """The reply text (``""`` when the model only called tools)."""
    usage: UsageRecord | None
    """Token usage: the server's, else an estimate (``usage.estimated`` says how)."""
    finish_reason: str | None
    """``stop``, ``length``, ``tool_calls``, ... as the server said."""
    model: str
    """The model that answered, as the server named it."""

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        """The tool calls in the message (empty when there are none)."""
        return list(self.message.get("tool_calls") or [])

    @property
    def reasoning(self) -> str:
        """The reasoning text the server separated out (``""`` when none)."""
        return str(self.message.get("reasoning_content") or "")


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of :meth:`VLLMClient.stream`: text as it arrives, then the final result."""

    delta: str = ""
    """New reply text."""
    reasoning_delta: str = ""
    """New reasoning text."""
    result: ChatResult | None = None
    """Set on the last event only: the complete answer."""


class VLLMClient:
    """An async client for one OpenAI-compatible chat completions server."""

    def __init__(
        self,
        base_url: str = DEFAULT_BASE_URL,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 60.0,
        max_retries: int = 3,
        default_params: Mapping[str, Any] | None = None,
        *,
        on_trace: Callable[[TraceEntry], None] | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 8.0,
    ) -> None:
        """Create a client; no connection is made until the first call.

        Args:
            base_url: The server, with or without the trailing ``/v1``.
            model: The model to ask; None picks the first one the server lists, once.
            api_key: The bearer key; else ``OPENAI_API_KEY``; else a dummy (vLLM needs none).
            timeout: Seconds to wait for a connection, or for each read of a reply.
            max_retries: Retries of a transient failure.
            default_params: Request parameters sent with every call; per-call ones override them.
            on_trace: Called inline with a :class:`TraceEntry`; it must not raise.
            backoff_base: Seconds before the first retry; doubles each retry, with jitter.
            backoff_max: Longest wait between two tries.
        """
        self.base_url = normalize_base_url(base_url)
        self.timeout = timeout
        self.max_retries = max(0, max_retries)
        self.default_params: dict[str, Any] = dict(default_params or {})
        self.on_trace = on_trace
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._model = model
        self._model_was_picked = False
        self.server_root = self.base_url.removesuffix("/v1")
        """The server without ``/v1``: where vLLM and llama.cpp serve ``/tokenize``."""
        self._ask_stream_usage = True  # False once the server refused stream_options
        self._tokenizer: TokenizerKind | None = None  # None: not probed yet
        self._probe_lock = asyncio.Lock()
        self._model_lock = asyncio.Lock()
        key = api_key or os.environ.get("OPENAI_API_KEY") or _DUMMY_API_KEY
        self._client = openai.AsyncOpenAI(
            base_url=self.base_url, api_key=key, timeout=timeout, max_retries=0
        )

    def __repr__(self) -> str:
        return f"VLLMClient(base_url={self.base_url!r}, model={self._model!r})"

    @property
    def model(self) -> str | None:
        """The model requests go to: the one given, or the one picked; None before picking."""
        return self._model

    async def aclose(self) -> None:
        """Close the HTTP connection pool."""
        await self._client.close()

    async def __aenter__(self) -> VLLMClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def list_models(self) -> list[str]:
        """Return the ids of the models the server serves (``GET /v1/models``)."""
        page = await self._with_retries(lambda _attempt: self._client.models.list(), None)
        data = getattr(page, "data", None)
        if not isinstance(data, list):
            raise BadResponse(f"the model list from {self.base_url} has no 'data' array")
        return [str(m.id) for m in data if getattr(m, "id", None)]

    async def resolve_model(self) -> str:
        """Return the model to use: the one given, else the server's first, looked up once.

        Raises:
            ModelNotFound: the server lists no model.
        """
        if self._model is not None:
            return self._model
        # Turns that start together (a manager serving 50 contexts) wait for one lookup
        # instead of each sending its own GET /v1/models.
        async with self._model_lock:
            if self._model is None:
                models = await self.list_models()
                if not models:
                    raise ModelNotFound(f"the model server at {self.base_url} serves no models")
                self._model = models[0]
                self._model_was_picked = True
            return self._model

    async def chat(
        self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None, **params: Any
    ) -> ChatResult:
        """Send a conversation and return the whole answer (no streaming).

        Args:
            messages: OpenAI chat messages, sent exactly as given.
            model: The model for this call; the client's model when None.
            **params: Request parameters (``temperature``, ``tools``, ``top_k``, ...), over the
                client's ``default_params``.

        Raises:
            LLMError: a subclass naming what went wrong.
        """
        name = model or await self.resolve_model()
        kwargs = self._build_kwargs(params)
        body, options = _chat_request(name, messages, kwargs)

        async def one_try(attempt: int) -> tuple[dict[str, Any], ChatResult]:
            self._trace("request", self._request_trace(name, messages, kwargs, False, attempt))
            completion = await self._post_chat(body, options)
            return completion, self._result_from_completion(completion, name)

        completion, result = await self._with_retries(one_try, name, model)
        self._trace("response", completion)
        if result.usage is None:
            result = replace(result, usage=await self._estimate_usage(name, messages, result))
        return result

    async def stream(
        self, messages: Sequence[Mapping[str, Any]], *, model: str | None = None, **params: Any
    ) -> AsyncGenerator[StreamEvent, None]:
        """Send a conversation and yield the answer as it is generated.

        Yields text and reasoning deltas, then one last event whose ``result`` is the complete
        :class:`ChatResult`, usage included (asked for with ``stream_options``, else estimated).
        A failure before the first delta is retried like :meth:`chat`; one after it is raised. If
        you stop iterating early, close the iterator (``contextlib.aclosing``) to free the
        connection. Arguments and errors as for :meth:`chat`.
        """
        name = model or await self.resolve_model()
        kwargs = self._build_kwargs(params)
        opener = partial(self._open_stream, name, messages, kwargs)
        state, first = await self._with_retries(opener, name, model)
        try:
            event = first  # from here on a failure is raised, never retried
            while event is not None:
                yield event
                event = await state.next_event()
            result = state.result(self.base_url)
        except BadResponse as exc:
            self._trace_error(exc, state.attempt)
            raise
        except (openai.OpenAIError, ValueError) as exc:
            error = self._map_midstream_error(exc, name, state.chunks)
            self._trace_error(error, state.attempt)
            raise error from exc
        finally:
            await state.stream.close()
        if result.usage is None:
            result = replace(result, usage=await self._estimate_usage(name, messages, result))
        self._trace("response", state.trace_data(result))
        yield StreamEvent(result=result)

    async def _with_retries(
        self,
        one_try: Callable[[int], Awaitable[_T]],
        model: str | None,
        explicit: str | None = None,
    ) -> _T:
        """Await ``one_try(attempt)`` until it succeeds or fails for good.

        The ``openai`` client's own loop (off: ``max_retries=0``) ends when the headers arrive,
        so it cannot replay a stream that breaks before its first delta; ours can. ``explicit``
        is the model the caller named (None: a picked model may be forgotten).
        """
        attempt = 0
        while True:
            try:
                return await one_try(attempt)
            except BadResponse as exc:
                self._trace_error(exc, attempt)
                raise
            except (openai.OpenAIError, ValueError) as exc:
                error = self._map_error(exc, model, attempts=attempt + 1)
                retrying = attempt < self.max_retries and _is_transient(exc)
                self._trace_error(error, attempt, retrying)
                if not retrying:
                    self._forget_picked_model(error, explicit)
                    raise error from exc
                await asyncio.sleep(self._backoff(attempt, exc))
            attempt += 1

    async def _open_stream(
        self,
        name: str,
        messages: Sequence[Mapping[str, Any]],
        kwargs: Mapping[str, Any],
        attempt: int,
    ) -> tuple[_StreamState, StreamEvent | None]:
        """One try at a stream, read up to its first delta (None: it ended without one)."""
        while True:
            request = self._stream_kwargs(kwargs)
            self._trace("request", self._request_trace(name, messages, request, True, attempt))
            try:
                body, options = _chat_request(name, messages, request, stream=True)
                stream = await self._post_chat(body, options, stream=True)
                break
            except openai.APIStatusError as exc:
                why = f"{_server_message(exc)} {exc.body}" if "stream_options" in request else ""
                if exc.status_code not in (400, 422) or "stream_options" not in why:
                    raise
                # The server does not know stream_options (older vLLM, llama.cpp, some
                # proxies): ask again without it now, and never send it again.
                self._ask_stream_usage = False
                error = self._map_error(exc, name, attempts=1)
                self._trace_error(error, attempt, True)
        state = _StreamState(name, attempt, stream, self._trace)
        try:
            return state, await state.next_event()
        except BaseException:
            await stream.close()
            raise

    def _stream_kwargs(self, kwargs: Mapping[str, Any]) -> dict[str, Any]:
        """A stream's arguments, asking ``include_usage`` unless ``stream_options`` was refused."""
        request = dict(kwargs)
        if self._ask_stream_usage:
            options = dict(request.get("stream_options") or {})
            request["stream_options"] = {**options, "include_usage": True}
        else:
            request.pop("stream_options", None)
        return request

    async def _estimate_usage(
        self, model: str, messages: Sequence[Mapping[str, Any]], result: ChatResult
    ) -> UsageRecord:
        """Usage for a reply the server sent none for: counted by its tokenizer, else by chars.

        vLLM's ``/tokenize`` applies the chat template; llama.cpp's counts texts, so its prompt
        count leaves the template out. A tokenizer failure is logged, never fails the turn.
        """
        prompt_text = _prompt_text(messages)
        completion_text = _message_text(result.message, reasoning=True)
        try:
            kind = await self._tokenizer_kind(model)
            if kind != "none":
                if kind == "vllm":
                    prompt = _count_of(await self._tokenize({"model": model, "messages": messages}))
                else:
                    prompt = await self._count_text(kind, model, prompt_text)
                completion = await self._count_text(kind, model, completion_text)
                return UsageRecord(result.model, prompt, completion, estimated="tokenizer")
        except (openai.OpenAIError, ValueError) as exc:
            _log.warning(
                "the tokenizer at %s/tokenize failed (%s); usage estimated from characters",
                self.server_root,
                _one_line(str(exc)),
            )
        return UsageRecord(
            result.model,
            chars_to_tokens(prompt_text),
            chars_to_tokens(completion_text),
            estimated="chars",
        )

    async def _tokenizer_kind(self, model: str) -> TokenizerKind:
        """Which ``/tokenize`` the server has, probed once (a passing failure: probed again)."""
        async with self._probe_lock:
            if self._tokenizer is None:
                self._tokenizer = await self._probe_tokenizer(model)
            return self._tokenizer

    async def _probe_tokenizer(self, model: str) -> TokenizerKind:
        probes: list[tuple[TokenizerKind, dict[str, Any], str, type]] = [
            ("vllm", {"model": model, "prompt": "Hi"}, "count", int),
            ("llamacpp", {"content": "Hi"}, "tokens", list),
        ]
        for kind, body, key, expected in probes:
            try:
                if isinstance((await self._tokenize(body)).get(key), expected):
                    return kind
            except openai.APIStatusError as exc:
                if exc.status_code not in _NOT_THIS_STYLE:
                    raise
            except ValueError:
                pass  # not JSON, or not an object: not this kind
        _log.info(
            "%s has no /tokenize: usage it omits is estimated from characters", self.server_root
        )
        return "none"

    async def _count_text(self, kind: TokenizerKind, model: str, text: str) -> int:
        """Tokens in ``text`` by the server's tokenizer (no special tokens added)."""
        if not text:
            return 0
        if kind == "vllm":
            body = {"model": model, "prompt": text, "add_special_tokens": False}
            return _count_of(await self._tokenize(body))
        tokens = (await self._tokenize({"content": text})).get("tokens")
        if not isinstance(tokens, list):
            raise ValueError("the /tokenize answer has no 'tokens' list")
        return len(tokens)

    async def _tokenize(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """POST ``body`` to the server's ``/tokenize``; its JSON object answer, else ValueError."""
        text = await self._client.post(
            f"{self.server_root}/tokenize",
            cast_to=str,
            body=dict(body),
            options={"timeout": min(self.timeout, _TOKENIZE_TIMEOUT)},
        )
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("the /tokenize answer is not a JSON object")
        return data

    async def _post_chat(
        self, body: bytes, options: Mapping[str, Any], *, stream: bool = False
    ) -> Any:
        """POST a prebuilt chat request with the client's ``post`` (same pool, headers, errors)."""
        post: Any = self._client.post  # typed for the installed release's keywords only
        raw: dict[str, Any] = {"content": body} if _POST_TAKES_CONTENT else {"body": body}
        if stream:
            raw.update(stream=True, stream_cls=openai.AsyncStream[ChatCompletionChunk])
        return await post("/chat/completions", cast_to=object, options=options, **raw)

    def _build_kwargs(self, params: Mapping[str, Any]) -> dict[str, Any]:
        merged = {**self.default_params, **params}
        bad = _RESERVED_PARAMS.intersection(merged)
        if bad:
            raise TypeError(f"parameter {sorted(bad)[0]!r} is set by the client, not by params")
        return merged

    def _request_trace(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        kwargs: Mapping[str, Any],
        stream: bool,
        attempt: int,
    ) -> dict[str, Any]:
        return {
            "url": f"{self.base_url}/chat/completions",
            "model": model,
            "messages": list(messages),
            "params": dict(kwargs),
            "stream": stream,
            "attempt": attempt,
        }

    def _trace(self, event: str, data: Mapping[str, Any]) -> None:
        if self.on_trace is not None:
            self.on_trace(TraceEntry(ts=utc_now(), event=event, data=data))

    def _trace_error(self, error: Exception, attempt: int, retrying: bool = False) -> None:
        data = {"type": type(error).__name__, "message": str(error), "attempt": attempt}
        self._trace("error", {**data, "retrying": retrying})

    def _backoff(self, attempt: int, exc: Exception) -> float:
        if isinstance(exc, openai.APIStatusError):
            try:  # an absent or bad Retry-After: ValueError
                retry_after = float(exc.response.headers.get("retry-after", ""))
            except ValueError:
                retry_after = -1.0
            if retry_after >= 0:
                return min(retry_after, self.backoff_max)
        ceiling = min(self.backoff_max, self.backoff_base * 2.0**attempt)
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    def _forget_picked_model(self, error: LLMError, explicit: str | None) -> None:
        # The server may have been restarted with another model: look it up again next time.
        if isinstance(error, ModelNotFound) and explicit is None and self._model_was_picked:
            self._model = None
            self._model_was_picked = False

    def _map_error(self, exc: Exception, model: str | None, *, attempts: int) -> LLMError:
        """Translate an openai or decoding exception into a one-line terrarium error."""
        url = self.base_url
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        if isinstance(exc, openai.APITimeoutError):
            return ServerUnreachable(
                f"timed out after {self.timeout:g}s waiting for the model server at {url}{tries}; "
                f"is it up? {_HINT}"
            )
        if isinstance(exc, openai.APIConnectionError):
            cause = _one_line(str(exc.__cause__ or exc))
            return ServerUnreachable(
                f"cannot reach the model server at {url}{tries} ({cause}); {_HINT}"
            )
        if isinstance(exc, openai.APIResponseValidationError | ValueError):
            return BadResponse(f"malformed response from {url}: {_one_line(str(exc))}")
        if isinstance(exc, openai.APIError):
            detail = _server_message(exc)
            code = str(exc.code or "")
            status: int | None = getattr(exc, "status_code", None)  # None: a stream's error event
            if code == "context_length_exceeded" or (
                (status is None or 400 <= status < 500) and _CONTEXT_RE.search(detail)
            ):
                return ContextTooLong(f"the request does not fit model {model}'s context: {detail}")
            if status is None:
                return BadResponse(f"the model server at {url} reported an error: {detail}")
            if model is not None and (
                code == "model_not_found" or (status == 404 and "model" in detail.lower())
            ):
                return ModelNotFound(f"model {model!r} not found at {url}: {detail}")
            if status == 404:
                return BadResponse(
                    f"{url} answered 404 Not Found ({detail}); is it an OpenAI-compatible server?"
                )
            if status == 429:
                return RateLimited(f"rate limited by {url}{tries}: {detail}")
            if status in (401, 403):
                return BadResponse(
                    f"the model server at {url} refused the API key ({status}: {detail}); "
                    "set OPENAI_API_KEY"
                )
            return BadResponse(f"the model server at {url} answered {status}{tries}: {detail}")
        return BadResponse(f"model call to {url} failed: {_one_line(str(exc))}")

    def _map_midstream_error(self, exc: Exception, model: str, chunks: int) -> LLMError:
        """Translate a failure that came after deltas were already yielded."""
        if isinstance(exc, openai.APIConnectionError) and not isinstance(
            exc, openai.APITimeoutError
        ):
            cause = _one_line(str(exc.__cause__ or exc))
            return BadResponse(
                f"the model server at {self.base_url} broke off the stream after {chunks} "
                f"chunks ({cause}); the partial reply was not retried"
            )
        error = self._map_error(exc, model, attempts=1)
        return type(error)(f"{error} (after {chunks} streamed chunks; not retried)")

    def _result_from_completion(self, completion: Any, requested: str) -> ChatResult:
        """The answer in a chat completion, the JSON object the server sent."""
        url = self.base_url
        if not isinstance(completion, Mapping):
            raise BadResponse(f"the answer from {url} is not a JSON object")
        choices = completion.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], Mapping):
            raise BadResponse(f"the answer from {url} has no choices")
        choice = choices[0]
        msg = choice.get("message")
        if not isinstance(msg, Mapping):
            raise BadResponse(f"the answer from {url} has no message")
        text = msg.get("content")
        if text is not None and not isinstance(text, str):
            raise BadResponse(f"the answer from {url} has non-text content")
        model = str(completion.get("model") or requested)
        return _make_result(
            text=text or "",
            reasoning=_reasoning_of(msg),
            tool_calls=msg.get("tool_calls") or [],
            finish_reason=choice.get("finish_reason"),
            usage=_usage_of(completion.get("usage"), model),
            model=model,
        )


def _chat_request(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    kwargs: Mapping[str, Any],
    *,
    stream: bool = False,
) -> tuple[bytes, dict[str, Any]]:
    """The body of a chat request, encoded once for every try, and its request options.

    ``chat.completions.create``'s TypedDict transforms and pydantic models cost ~1.5 ms of CPU
    a request and ~140 µs a message (benchmarks/bench_manager.py); the body is JSON already.
    """
    body: dict[str, Any] = {"model": model, "stream": True} if stream else {"model": model}
    options: dict[str, Any] = {}
    for key, value in kwargs.items():
        if isinstance(value, openai.NotGiven | openai.Omit) or key == "extra_body":
            continue
        if key in _REQUEST_OPTIONS:
            options[_REQUEST_OPTIONS[key]] = value
        else:
            body[key] = value
    body.update(kwargs.get("extra_body") or {})
    body["messages"] = messages
    # msgspec: 6 ms for 10k messages of history (3.7 MB) where json.dumps takes 30-35 ms.
    return _ENCODER.encode(body), options


def _jsonable(value: Any) -> Any:
    """What msgspec cannot encode itself: pydantic models (the ``openai`` types)."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return dump(mode="json", exclude_unset=True)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_ENCODER = msgspec.json.Encoder(enc_hook=_jsonable)


def chars_to_tokens(text: str) -> int:
    """The ``chars`` usage estimate: ``ceil(len(text) / 4)`` (:data:`CHARS_PER_TOKEN`)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


def _message_text(message: Mapping[str, Any], *, reasoning: bool) -> str:
    """What a message spends tokens on: text, tool calls, and reasoning when asked."""
    content = message.get("content")
    pieces: list[str] = []
    if isinstance(content, str):
        pieces.append(content)
    elif isinstance(content, list):
        pieces += [str(p["text"]) for p in content if isinstance(p, Mapping) and "text" in p]
    if reasoning and isinstance(message.get("reasoning_content"), str):
        pieces.append(message["reasoning_content"])
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            pieces += [str(function.get("name") or ""), str(function.get("arguments") or "")]
    return "\n".join(piece for piece in pieces if piece)


def _prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The texts of a request's messages, one after another (no chat template)."""
    return "\n".join(text for m in messages if (text := _message_text(m, reasoning=False)))


def _count_of(answer: Mapping[str, Any]) -> int:
    count = answer.get("count")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        raise ValueError("the /tokenize answer has no 'count'")
    return count


def normalize_base_url(base_url: str) -> str:
    """Return ``base_url`` ending in ``/v1`` without a trailing slash, with a scheme."""
    url = base_url.strip().rstrip("/")
    if "://" not in url:
        url = f"http://{url}"
    if not url.endswith("/v1"):
        url = f"{url}/v1"
    return url


class _StreamState:
    """One try at a stream: its reader and the answer accumulated so far."""

    def __init__(
        self,
        requested: str,
        attempt: int,
        stream: openai.AsyncStream[Any],
        trace: Callable[[str, Mapping[str, Any]], None],
    ) -> None:
        self.attempt = attempt
        self.stream = stream
        self.reader: AsyncIterator[Any] = aiter(stream)
        """The chunks: one iterator, so a read can stop at the first delta and go on later."""
        self.trace = trace
        self.model = requested
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: dict[int, dict[str, Any]] = {}
        self.finish_reason: str | None = None
        self.usage: Any = None
        self.chunks = 0

    async def next_event(self) -> StreamEvent | None:
        """Read chunks (each traced, then folded in) up to one that adds text; None at the end."""
        async for chunk in self.reader:
            self.trace("chunk", _dump(chunk))
            text, reasoning = self.add(chunk)
            if text or reasoning:
                return StreamEvent(delta=text, reasoning_delta=reasoning)
        return None

    def add(self, chunk: Any) -> tuple[str, str]:
        """Fold one chunk in; return the text and reasoning it added."""
        self.chunks += 1
        if getattr(chunk, "model", None):
            self.model = str(chunk.model)
        if getattr(chunk, "usage", None) is not None:
            self.usage = chunk.usage
        text = reasoning = ""
        for choice in getattr(chunk, "choices", None) or []:
            if (getattr(choice, "index", 0) or 0) != 0:
                continue  # only the first choice is assembled
            if choice.finish_reason:
                self.finish_reason = str(choice.finish_reason)
            delta = getattr(choice, "delta", None)
            if delta is None:
                continue
            if isinstance(delta.content, str):
                text += delta.content
            reasoning += _reasoning_of(delta)
            for call in delta.tool_calls or []:
                self._add_call(call)
        self.text.append(text)
        self.reasoning.append(reasoning)
        return text, reasoning

    def _add_call(self, call: Any) -> None:
        index = call.index if isinstance(call.index, int) else len(self.calls)
        slot = self.calls.setdefault(
            index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if call.id and not slot["id"]:
            slot["id"] = call.id
        if call.type:
            slot["type"] = call.type
        if call.function is not None:
            if call.function.name:
                slot["function"]["name"] += call.function.name
            if call.function.arguments:
                slot["function"]["arguments"] += call.function.arguments

    def result(self, url: str) -> ChatResult:
        """The assembled answer; BadResponse if the stream ended before the model finished."""
        if self.finish_reason is None:
            raise BadResponse(
                f"the stream from {url} ended after {self.chunks} chunks without a finish reason"
            )
        return _make_result(
            text="".join(self.text),
            reasoning="".join(self.reasoning),
            tool_calls=[self.calls[i] for i in sorted(self.calls)],
            finish_reason=self.finish_reason,
            usage=_usage_of(self.usage, self.model),
            model=self.model,
        )

    def trace_data(self, result: ChatResult) -> dict[str, Any]:
        """The ``response`` trace of a finished stream."""
        return {
            "model": result.model,
            "message": result.message,
            "finish_reason": result.finish_reason,
            "usage": result.usage.to_dict() if result.usage else None,
            "chunks": self.chunks,
        }


def _make_result(
    *,
    text: str,
    reasoning: str,
    tool_calls: Sequence[Any],
    finish_reason: str | None,
    usage: UsageRecord | None,
    model: str,
) -> ChatResult:
    """The answer, its tool calls (a reply's or a stream's assembled ones) in OpenAI form."""
    # Content is null when the model only called tools, as OpenAI itself answers.
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if text or not tool_calls else None,
    }
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["tool_calls"] = [_tool_call(call) for call in tool_calls]
    return ChatResult(
        message=message, text=text, usage=usage, finish_reason=finish_reason, model=model
    )


def _tool_call(call: Any) -> dict[str, Any]:
    """A tool call in OpenAI form, with an id (made up when the server sent none)."""
    call = call if isinstance(call, Mapping) else {}
    function = call.get("function")
    function = function if isinstance(function, Mapping) else {}
    return {
        "id": call.get("id") or f"call_{uuid.uuid4().hex[:24]}",
        "type": call.get("type") or "function",
        "function": {
            "name": str(function.get("name") or ""),
            "arguments": str(function.get("arguments") or ""),
        },
    }


def _field(obj: Any, key: str) -> Any:
    """``obj[key]`` of a JSON object, ``obj.key`` of an ``openai`` model; None when absent."""
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _reasoning_of(obj: Any) -> str:
    """Reasoning text from a message or delta: vLLM's ``reasoning_content`` or ``reasoning``."""
    for key in ("reasoning_content", "reasoning"):
        # Undeclared keys live in the pydantic model's extras, which getattr also reads.
        value = _field(obj, key)
        if isinstance(value, str) and value:
            return value
    return ""


def _usage_of(usage: Any, model: str) -> UsageRecord | None:
    if usage is None:
        return None
    cached = _field(_field(usage, "prompt_tokens_details"), "cached_tokens")
    return UsageRecord(
        model=model,
        prompt_tokens=int(_field(usage, "prompt_tokens") or 0),
        completion_tokens=int(_field(usage, "completion_tokens") or 0),
        cached_tokens=int(cached or 0),
    )


def _is_transient(exc: Exception) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # includes timeouts
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 429) or exc.status_code >= 500
    return False


def _server_message(exc: openai.APIError) -> str:
    body = exc.body
    if isinstance(body, Mapping):
        message = body.get("message")
        if isinstance(message, str) and message:
            return _one_line(message)
    if isinstance(body, str) and body:
        return _one_line(body)
    return _one_line(exc.message)


def _one_line(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= _MAX_DETAIL else line[: _MAX_DETAIL - 3] + "..."


def _dump(model: Any) -> dict[str, Any]:
    """A pydantic object as the JSON the server sent (unset fields left out)."""
    try:
        return cast(dict[str, Any], model.model_dump(mode="json", exclude_unset=True))
    except (AttributeError, TypeError, ValueError):
        return {"raw": repr(model)}
