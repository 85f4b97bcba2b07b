"""A context as one self-contained HTML page.

The CSS is inline and nothing is loaded (no scripts, fonts, images or style sheets), so the
page opens offline and can be mailed or archived as one file. Metadata first, then chat
bubbles; reasoning and tool results fold away in ``<details>``, which needs no JavaScript.

Message text and reasoning are Markdown, rendered as the dashboard renders them
(:mod:`terrarium.formats.safe_markdown`). Everything else from the log goes through
:func:`html.escape` with quotes, so a message can never inject markup; a
Content-Security-Policy allowing inline styles only backs that up (and keeps images named in
Markdown from loading). Image parts are links, never loaded.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from html import escape
from typing import Any

from terrarium import sessions
from terrarium.formats.jsonl import Transcript, load_transcript
from terrarium.formats.markdown import (
    PARTIAL,
    content_blocks,
    facts,
    failed_note,
    heading,
    pretty_json,
    when,
)
from terrarium.formats.safe_markdown import markdown_html, pygments_css
from terrarium.model import ContextId, chat_view, item_label
from terrarium.stores.base import Store

_CSS = """
:root { color-scheme: light dark; --bg: #f6f7f9; --fg: #1d2330; --muted: #6b7280;
  --user: #dbeafe; --assistant: #ffffff; --tool: #f1f5f9; --border: #d8dde6; --code: #f3f4f6; }
@media (prefers-color-scheme: dark) {
  :root { --bg: #12151c; --fg: #e5e7eb; --muted: #9ca3af; --user: #1e3a5f;
    --assistant: #1c2130; --tool: #171b24; --border: #2d3444; --code: #0d1017; } }
* { box-sizing: border-box; }
body { margin: 0; background: var(--bg); color: var(--fg);
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
main { max-width: 52rem; margin: 0 auto; padding: 1.5rem 1rem 4rem; }
h1 { font-size: 1.4rem; margin: 0 0 .75rem; overflow-wrap: anywhere; }
h2 { font-size: 1rem; margin: 1.5rem 0 .5rem; color: var(--muted); }
table.meta { border-collapse: collapse; font-size: .9rem; }
table.meta th { text-align: left; color: var(--muted); font-weight: normal;
  padding: .1rem 1rem .1rem 0; vertical-align: top; white-space: nowrap; }
table.meta td { padding: .1rem 0; overflow-wrap: anywhere; }
.msg { margin: .75rem 0; padding: .6rem .85rem; border: 1px solid var(--border);
  border-radius: .75rem; max-width: 85%; background: var(--assistant); }
.msg.user { margin-left: auto; background: var(--user); }
.msg.tool, .msg.system { background: var(--tool); max-width: 100%; }
.who { font-size: .8rem; color: var(--muted); margin-bottom: .25rem; }
.who b { color: var(--fg); }
.text { white-space: pre-wrap; overflow-wrap: anywhere; }
pre { background: var(--code); border: 1px solid var(--border); border-radius: .4rem;
  padding: .5rem .65rem; margin: .4rem 0; overflow-x: auto; white-space: pre-wrap;
  overflow-wrap: anywhere;
  font: 13px/1.45 ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
.call-name { font-family: ui-monospace, monospace; font-size: .85rem; }
details summary { cursor: pointer; color: var(--muted); font-size: .85rem; }
.event { text-align: center; font-style: italic; color: var(--muted); font-size: .85rem;
  margin: .75rem 0; }
.prompt { white-space: pre-wrap; }
.md { overflow-wrap: anywhere; }
.failed { color: #dc2626; }
.md > :first-child { margin-top: 0; }
.md > :last-child { margin-bottom: 0; }
.md p, .md ul, .md ol, .md blockquote, .md table { margin: .4rem 0; }
.md blockquote { border-left: 3px solid var(--border); padding-left: .75rem; color: var(--muted); }
.md table { border-collapse: collapse; }
.md th, .md td { border: 1px solid var(--border); padding: .2rem .5rem; }
.md :not(pre) > code { background: var(--code); border-radius: .25rem; padding: 0 .25rem;
  font: 13px ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; }
"""


def _e(value: Any) -> str:
    """Escape any value for HTML text or a double-quoted attribute."""
    return escape(str(value), quote=True)


def _pre(text: str, lang: str = "") -> str:
    cls = f' class="lang-{_e(lang)}"' if lang else ""
    return f"<pre><code{cls}>{_e(text)}</code></pre>"


def _text(text: str) -> str | None:
    return f'<div class="md" dir="auto">{markdown_html(text)}</div>' if text else None


def _image(url: str) -> str:
    if url.startswith("data:"):
        return f'<div class="text"><i>[image: inline data, {len(url)} characters]</i></div>'
    if url.startswith(("http://", "https://")):
        return f'<div class="text"><a href="{_e(url)}" rel="noreferrer">[image]</a></div>'
    return f'<div class="text"><i>[image: {_e(url)}]</i></div>'


def _tool_calls(item: Mapping[str, Any]) -> list[str]:
    out = []
    for call in item.get("tool_calls") or ():
        fn = call.get("function") or {}
        body, lang = pretty_json(str(fn.get("arguments", "")))
        ident = f" <small>id {_e(call['id'])}</small>" if call.get("id") else ""
        out.append(
            f'<div class="call">Tool call <span class="call-name">{_e(fn.get("name", "?"))}</span>'
            f"{ident}{_pre(body, lang)}</div>"
        )
    return out


def _block(timed: sessions.Message, failure: Mapping[str, Any] | None) -> str:
    """One history item as an HTML block (a kind with no Chat view as its JSON); ``failure``
    marks it failed."""
    item = timed.item
    stamp = f'<time datetime="{_e(timed.ts)}">{_e(when(timed.ts))}</time>'
    if timed.event is not None:
        text = item.get("content") or timed.event or "event"
        return f'<div class="event">{_e(text)} · {stamp}</div>'
    view = chat_view(item)
    label = item_label(item)
    if view is None:
        dump = json.dumps(dict(item), indent=2, ensure_ascii=False, default=repr)
        who = f'<div class="who"><b>{_e(label)}</b> · {stamp}</div>'
        return f'<div class="msg other">{who}{_pre(dump, "json")}</div>'
    role = str(view.get("role", "?"))
    who = heading(view, label, lambda title: f"<b>{_e(title)}</b>", _e, _e)
    if failure is not None:
        who += f' <span class="failed">{_e(failed_note(failure))}</span>'
    body = [f'<div class="who">{who} · {stamp}</div>']
    if view.get("reasoning_content"):
        body.append(
            '<details><summary>Reasoning</summary><div class="md" dir="auto">'
            f"{markdown_html(str(view['reasoning_content']))}</div></details>"
        )
    content = content_blocks(view, code=role == "tool", text=_text, image=_image, block=_pre)
    if role == "tool" and content:
        body.append(f"<details open><summary>Output</summary>{''.join(content)}</details>")
    else:
        body.extend(content)
    body.extend(_tool_calls(view))
    cls = role if role in ("user", "assistant", "tool", "system") else "other"
    return f'<div class="msg {cls}">{"".join(body)}</div>'


def render(transcript: Transcript) -> str:
    """The transcript as a complete HTML document."""
    state = transcript.state
    title = _e(str(transcript.context))
    meta = facts(transcript, str, str)
    rows = "".join(f"<tr><th>{k}</th><td>{_e(v)}</td></tr>" for k, v in meta)
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        # Defence in depth: even if markup slipped through, the page may load and run nothing.
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="generator" content="terrarium">',
        f"<title>{title}</title>",
        f"<style>{_CSS}{pygments_css()}</style>",
        "</head>",
        "<body><main>",
        f'<header><h1>{title}</h1><table class="meta">{rows}</table></header>',
    ]
    if state.system_prompt:
        parts.append(
            "<section><h2>System prompt</h2>"
            f'<div class="msg system"><div class="text prompt">{_e(state.system_prompt)}</div>'
            "</div></section>"
        )
    parts.append("<section><h2>Conversation</h2>")
    if not transcript.items:
        parts.append('<div class="event">No messages.</div>')
    for n, timed in enumerate(transcript.items):
        failure = state.failure(n)
        parts.append(_block(timed, failure))
        if failure is not None and failure.get("partial"):  # the reply the failed run cut short
            who = f'<div class="who"><b>Assistant</b> ({PARTIAL})</div>'
            parts.append(f'<div class="msg assistant">{who}{_text(failure["partial"])}</div>')
    parts += ["</section>", "</main></body>", "</html>"]
    return "\n".join(parts) + "\n"


def export_context(store: Store, context: ContextId | str) -> str:
    """The context as one self-contained HTML page (ContextNotFound if there is none)."""
    return render(load_transcript(store, context))
