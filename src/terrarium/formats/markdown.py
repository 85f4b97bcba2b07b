"""A context as a readable Markdown transcript.

The title is the context id; then dates, model, token totals, the system prompt, and every
history item under a heading with its role and time. Message text is kept as written (models
write Markdown). Tool calls, tool results, the system prompt and non-text parts go in fenced
blocks whose fence is longer than any backtick run inside, so nothing breaks out. Runtime
events are one italic line each.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from terrarium import sessions
from terrarium.formats.jsonl import Transcript, load_transcript
from terrarium.model import ContextId, chat_view, item_label, parse_timestamp
from terrarium.stores.base import Store

_ROLE_TITLES = {"user": "User", "assistant": "Assistant", "tool": "Tool result", "system": "System"}
_MD_SPECIAL = re.compile(r"([\\`*_\[\]<>~])")


def when(ts: str) -> str:
    """A log timestamp for people: ``2025-11-06 12:00:01 UTC`` (the raw text if unparsable)."""
    try:
        return parse_timestamp(ts).strftime("%Y-%m-%d %H:%M:%S UTC")
    except ValueError:
        return ts


def escape(text: str) -> str:
    """Escape Markdown syntax so that ``text`` renders literally (on one line)."""
    return _MD_SPECIAL.sub(r"\\\1", " ".join(text.split()))


def code_span(text: str) -> str:
    """``text`` as an inline code span that no backtick inside it can close."""
    text = " ".join(text.split())
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{ticks}{pad}{text}{pad}{ticks}"


def fenced(text: str, lang: str = "") -> str:
    """``text`` in a fenced code block whose fence no run of backticks in it can close."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{text}\n{fence}"


def pretty_json(text: str) -> tuple[str, str]:
    """Indent ``text`` if it is JSON; return it and the fence language (``json`` or ``""``)."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False), "json"
    except (TypeError, ValueError, RecursionError):  # not JSON, or nested past the stack
        return text, ""


def content_blocks(
    item: Mapping[str, Any],
    *,
    code: bool,
    text: Callable[[str], str | None],
    image: Callable[[str], str],
    block: Callable[[str, str], str],
) -> list[str]:
    """An item's content, part by part, as a renderer's blocks: ``text`` of a text part (None:
    nothing), ``image`` of an image's URL, ``block`` of code and its language for a text part
    when ``code`` (tool results) and for any other part (as JSON)."""
    content = item.get("content")
    if isinstance(content, str):
        content = [{"type": "text", "text": content}]
    blocks: list[str] = []
    for part in content or ():
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind == "text" and code:
            blocks.append(block(*pretty_json(str(part.get("text", "")))))
        elif kind == "text":
            shown = text(str(part.get("text", "")))
            if shown:
                blocks.append(shown)
        elif kind == "image_url":
            blocks.append(image(str((part.get("image_url") or {}).get("url", ""))))
        else:
            blocks.append(block(json.dumps(part, indent=2, ensure_ascii=False), "json"))
    return blocks


def heading(
    view: Mapping[str, Any],
    label: str,
    strong: Callable[[str], str],
    code: Callable[[str], str],
    text: Callable[[str], str],
) -> str:
    """Who said an item: its role, its kind when not the role, its name, the call it answers."""
    role = str(view.get("role", "?"))
    out = strong(_ROLE_TITLES.get(role, role.title()))
    if label != role:
        out += f" ({code(label)})"
    if view.get("name"):
        out += f" ({text(str(view['name']))})"
    if role == "tool" and view.get("tool_call_id"):
        out += f" for {code(str(view['tool_call_id']))}"
    return out


def _text(text: str) -> str | None:
    return text if text.strip() else None


def _image(url: str) -> str:
    if url.startswith("data:"):
        return f"*\\[image: inline data, {len(url)} characters\\]*"
    return f"*\\[image: <{url.replace('>', '%3E')}>\\]*"


def _tool_calls(item: Mapping[str, Any]) -> list[str]:
    blocks = []
    for call in item.get("tool_calls") or ():
        fn = call.get("function") or {}
        body, lang = pretty_json(str(fn.get("arguments", "")))
        label = f"**Tool call** {code_span(str(fn.get('name', '?')))}"
        if call.get("id"):
            label += f" (id {code_span(str(call['id']))})"
        blocks.append(f"{label}\n\n{fenced(body, lang)}")
    return blocks


def failed_note(failure: Mapping[str, Any]) -> str:
    """The mark of a failed run's message (``RestoredState.failure``), as ``show`` writes it."""
    why = failure["error"] or failure["error_type"] or "?"
    return f"failed, not sent to the model again: {why}"


PARTIAL = "interrupted: the partial reply"
"""The label of the reply a failed run cut short."""


def _section(timed: sessions.Message, failure: Mapping[str, Any] | None) -> str:
    """One history item as a Markdown section; a Responses item as its Chat view, its kind
    named; ``failure`` marks it failed."""
    item = timed.item
    if timed.event is not None:
        text = escape(str(item.get("content") or "")) or escape(timed.event or "event")
        return f"*{text}* — {when(timed.ts)}"
    view = chat_view(item)
    label = item_label(item)
    if view is None:
        body = json.dumps(dict(item), indent=2, ensure_ascii=False, default=repr)
        return f"### {code_span(label)} · {when(timed.ts)}\n\n{fenced(body, 'json')}"
    who = heading(view, label, escape, code_span, escape)
    mark = f" · *{escape(failed_note(failure))}*" if failure is not None else ""
    blocks = [f"### {who} · {when(timed.ts)}{mark}"]
    reasoning = view.get("reasoning_content")
    if reasoning:
        quoted = "\n".join(f"> {line}" if line else ">" for line in str(reasoning).splitlines())
        blocks.append(f"> *Reasoning:*\n>\n{quoted}")
    code = view.get("role") == "tool"
    blocks += content_blocks(view, code=code, text=_text, image=_image, block=fenced)
    blocks.extend(_tool_calls(view))
    return "\n\n".join(blocks)


def facts(
    transcript: Transcript, code: Callable[[str], str], text: Callable[[str], str]
) -> list[tuple[str, str]]:
    """The transcript's facts, each a label and its value: ids written by ``code``, the model's
    name by ``text``, times by :func:`when`."""
    state = transcript.state
    rows = [
        ("Context", code(str(transcript.context))),
        ("Created", when(transcript.head.created_at)),
        ("Last active", when(state.last_active)),
        ("Session", f"{code(str(state.session_id))} (segment {code(str(state.segment_id))})"),
    ]
    if state.config.get("model"):
        rows.append(("Model", text(str(state.config["model"]))))
    rows.append(("Messages", str(len(transcript.items))))
    if state.usage.calls:
        rows.append(("Tokens", state.usage.describe()))
    return rows


def render(transcript: Transcript) -> str:
    """The transcript as Markdown text."""
    state = transcript.state
    lines = [f"# {escape(str(transcript.context))}", ""]
    lines += [f"- **{label}:** {value}" for label, value in facts(transcript, code_span, escape)]
    out = ["\n".join(lines)]
    if state.system_prompt:
        out.append(f"## System prompt\n\n{fenced(state.system_prompt)}")
    out.append("## Conversation")
    if not transcript.items:
        out.append("*No messages.*")
    for n, timed in enumerate(transcript.items):
        failure = state.failure(n)
        out.append(_section(timed, failure))
        if failure is not None and failure.get("partial"):  # the reply the failed run cut short
            out.append(f"### Assistant ({PARTIAL})\n\n{failure['partial']}")
    return "\n\n".join(out) + "\n"


def export_context(store: Store, context: ContextId | str) -> str:
    """The context as a Markdown transcript (ContextNotFound if there is none)."""
    return render(load_transcript(store, context))
