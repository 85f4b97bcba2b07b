"""Chat Completions stream chunks made the Responses API's stream events.

The documented sequence: ``response.created``, ``response.in_progress``; per output item
``response.output_item.added``, its deltas (``response.output_text.delta`` inside a
``response.content_part.added``/``done`` pair, ``response.function_call_arguments.delta``),
its ``done`` events and ``response.output_item.done``; then ``response.completed`` (or
``response.incomplete``, or ``response.failed`` when the upstream failed). Every event has a
``sequence_number`` from 0, and one response id throughout. Reasoning text, which Chat
servers stream first, becomes one ``reasoning`` item announced whole before the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from terrarium.gateway.ids import new_item_id
from terrarium.gateway.responses import (
    call_item,
    message_item,
    reasoning_item,
    response_object,
    usage_of,
)
from terrarium.model import LoggedItem

Event = dict[str, Any]


class StreamBuilder:
    """Turns chunks into events, and keeps the output items they make."""

    def __init__(self, record: dict[str, Any]) -> None:
        self.record = record
        self.output: list[LoggedItem] = []
        self.seq = 0
        self.reasoning: list[str] = []
        self.text: list[str] | None = None
        """The open message's text pieces (None while no message is open)."""
        self.streamed: list[str] = []
        """Every text piece streamed, in every message: a failed turn keeps them."""
        self.text_id = ""
        self.calls: dict[int, LoggedItem] = {}
        self.open_calls: list[int] = []
        self.finish_reason: Any = None
        self.usage: dict[str, Any] | None = None
        self.closed = False
        """Whether :meth:`close` ended the stream (the output is then whole)."""

    def event(self, kind: str, **fields: Any) -> Event:
        """The next event of ``kind``."""
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def start(self) -> list[Event]:
        """``response.created`` and ``response.in_progress``."""
        snapshot = response_object(self.record, [])
        return [
            self.event("response.created", response=snapshot),
            self.event("response.in_progress", response=snapshot),
        ]

    def feed(self, chunk: Mapping[str, Any]) -> list[Event]:
        """The events one upstream chunk makes."""
        events: list[Event] = []
        if chunk.get("usage"):
            self.usage = usage_of(chunk["usage"])
        for choice in chunk.get("choices") or ():
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if isinstance(reasoning, str) and reasoning:
                self.reasoning.append(reasoning)
            text = delta.get("content")
            if isinstance(text, str) and text:
                events += self._text(text)
            for call in delta.get("tool_calls") or ():
                events += self._call(call)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        return events

    def _flush_reasoning(self) -> list[Event]:
        if not self.reasoning:
            return []
        item = reasoning_item("".join(self.reasoning))
        self.reasoning = []
        return self._whole(item)

    def _whole(self, item: LoggedItem) -> list[Event]:
        index = len(self.output)
        self.output.append(item)
        return [
            self.event("response.output_item.added", output_index=index, item=item),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _text(self, text: str) -> list[Event]:
        events = self._flush_reasoning()
        index = self._text_index()
        if self.text is None:
            self.text, self.text_id = [], new_item_id("message")
            index = len(self.output)
            self.output.append(message_item("", "in_progress", self.text_id))
            events.append(
                self.event(
                    "response.output_item.added", output_index=index, item=self.output[index]
                )
            )
            part = {"type": "output_text", "text": "", "annotations": []}
            events.append(self._text_event("response.content_part.added", index, part=part))
        self.text.append(text)
        self.streamed.append(text)
        events.append(
            self._text_event("response.output_text.delta", index, delta=text, logprobs=[])
        )
        return events

    def _text_index(self) -> int:
        return next((i for i, it in enumerate(self.output) if it.get("id") == self.text_id), -1)

    def _text_event(self, kind: str, index: int, **fields: Any) -> Event:
        """An event of the message's one text part (its item, output index, content index)."""
        return self.event(kind, item_id=self.text_id, output_index=index, content_index=0, **fields)

    def _close_text(self) -> list[Event]:
        if self.text is None:
            return []
        index, text = self._text_index(), "".join(self.text)
        self.text = None
        item = message_item(text, "completed", self.text_id)
        self.output[index] = item
        part = item["content"][0]
        return [
            self._text_event("response.output_text.done", index, text=text, logprobs=[]),
            self._text_event("response.content_part.done", index, part=part),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def _call(self, call: Mapping[str, Any]) -> list[Event]:
        events = self._flush_reasoning() + self._close_text()
        position = int(call.get("index") or 0)
        function = call.get("function") or {}
        if position not in self.calls:
            item = {**call_item(call), "arguments": "", "status": "in_progress"}
            self.calls[position] = item
            self.open_calls.append(position)
            self.output.append(item)
            events.append(
                self.event(
                    "response.output_item.added",
                    output_index=len(self.output) - 1,
                    item=dict(item),
                )
            )
        item = self.calls[position]
        piece = function.get("arguments")
        if isinstance(piece, str) and piece:
            item["arguments"] += piece
            events.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=self.output.index(item),
                    delta=piece,
                )
            )
        return events

    def close(self) -> list[Event]:
        """Close every open item (the stream ended); the output is then whole."""
        events = self._flush_reasoning() + self._close_text()
        for position in self.open_calls:
            item = self.calls[position]
            item["status"] = "completed"
            index = self.output.index(item)
            events.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=item["arguments"],
                )
            )
            events.append(self.event("response.output_item.done", output_index=index, item=item))
        self.open_calls = []
        self.closed = True
        if not self.output:
            events += self._whole(message_item(""))
        return events

    def partial_text(self) -> str:
        """The answer's text so far, in all its messages (for a failed turn's log)."""
        return "".join(self.streamed)

    def end(self) -> Event:
        """The last event: ``response.completed``, ``.incomplete`` or ``.failed``, as the
        record's status says. A stream that failed before its end shows what its failed turn
        keeps, as a retrieval of the response shows it: the text so far as one message,
        ``incomplete``, under the id it was streamed as; reasoning and calls cut short are
        dropped, as the chat loop drops them."""
        output = self.output
        if not self.closed:
            text = self.partial_text()
            output = [message_item(text, "incomplete", self.text_id)] if text else []
        kind = {"completed": "response.completed", "incomplete": "response.incomplete"}.get(
            self.record["status"], "response.failed"
        )
        return self.event(kind, response=response_object(self.record, output))
