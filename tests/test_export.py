"""Export formats: native JSONL (round trip), Markdown, HTML, OpenAI messages and fine-tuning."""

from __future__ import annotations

import datetime as dt
import importlib
import importlib.util
import io
import json
import tarfile
import zipfile
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from terrarium import (
    ContextId,
    FsStore,
    MemoryStore,
    SegmentStartState,
    SystemItem,
    UsageRecord,
    append_entry,
    append_system_item,
    create_compacted_segment,
    create_segment,
    create_segment_with_ids,
    fork_at,
    restore,
    save_config_changed,
    save_delta,
    save_extension,
    save_run_completed,
    save_turn_end,
    save_usage,
    save_user_input,
)
from terrarium.errors import ContextExists, ContextNotFound, InvalidEntry, SessionConflict
from terrarium.export import FORMATS, export_context, export_many, member_name
from terrarium.formats import jsonl, markdown, openai
from terrarium.model import RestoredState, new_segment_id, new_session_id
from terrarium.stores.base import NewEntry, PodActiveSegmentRef, Store

NASTY = "<script>alert(1)</script> & \"double\" 'single' — naïve 日本語 🐍"
PROMPT = "You are terse. Use ``` fences & <tags> freely."
CONTEXT = "irc:#python"


@pytest.fixture(params=["memory", "fs"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else FsStore(tmp_path / "src")
    yield made
    made.close()


@pytest.fixture(params=["memory", "fs"])
def other(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else FsStore(tmp_path / "dst")
    yield made
    made.close()


CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"q": "<b>py</b>", "n": 2}'},
}


def converse(store: Store, context: str = CONTEXT) -> dict[str, Any]:
    """A conversation with every kind of item; returns what was written, by label."""
    start = SegmentStartState(system_prompt=PROMPT, config={"model": "qwen", "temperature": 0.2})
    session_id, segment_id = create_segment(store, start, context=context)
    ref = PodActiveSegmentRef(session_id, segment_id)
    user = save_user_input(store, ref, NASTY)
    calls = save_delta(
        store,
        ref,
        [
            {"role": "assistant", "content": None, "tool_calls": [CALL], "x_future": 1},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"result": "3 & <4>"}'},
            {
                "role": "assistant",
                "content": "Answer: **bold** ```not a fence``` 🐍",
                "reasoning_content": "thinking <hard>",
            },
        ],
    )
    save_usage(store, ref, UsageRecord("qwen", 10, 5))
    save_run_completed(store, ref, finish_reason="stop")
    save_turn_end(store, ref)
    event = append_system_item(store, ref, SystemItem("resumed", {"after": "3h"}))
    save_extension(store, ref, "game.score", {"points": 3})
    append_entry(store, ref, "future_kind", {"anything": [1, 2]})
    return {"ref": ref, "user": user, "calls": calls, "event": event}


# --------------------------------------------------------------------------- transcript


def test_transcript_items_match_the_restored_history(store: Store) -> None:
    """Each history item comes with the ts of the entry that logged it."""
    written = converse(store)
    transcript = jsonl.load_transcript(store, CONTEXT)
    assert [t.item for t in transcript.items] == restore(store, CONTEXT).history
    stamps = [t.ts for t in transcript.items]
    assert stamps[0] == written["user"].ts
    assert stamps[1:4] == [e.ts for e in written["calls"]]
    assert stamps[4] == written["event"].ts
    assert [t.event for t in transcript.items] == [None, None, None, None, "resumed"]


def test_header_history_items_get_the_header_ts(store: Store) -> None:
    """After a compaction, the summary items carry the new header's ts."""
    written = converse(store)
    summary = [{"role": "user", "content": "summary"}]
    segment = create_compacted_segment(store, written["ref"], summary, context=CONTEXT)
    save_user_input(store, PodActiveSegmentRef(written["ref"].session_id, segment), "next")
    transcript = jsonl.load_transcript(store, CONTEXT)
    header = transcript.lines[0]
    assert header["segment_id"] == str(segment)
    assert [(t.item["content"], t.segment_id, t.index, t.seq) for t in transcript.items] == [
        ("summary", str(segment), 0, 0),  # the header's history
        ("next", str(segment), None, 1),  # an entry
    ]
    assert transcript.items[0].ts == header["ts"]


def test_missing_context_raises(store: Store) -> None:
    for fmt in FORMATS:
        if fmt == "terrarium-json":
            continue
        with pytest.raises(ContextNotFound):
            export_context(store, "cli:nope", fmt)


# --------------------------------------------------------------------------- markdown


def test_markdown_transcript(store: Store) -> None:
    """Title, dates, system prompt, role headings with times, fenced tools, italic events."""
    written = converse(store)
    text = export_context(store, CONTEXT, "markdown")
    assert isinstance(text, str)
    assert text.startswith("# irc:#python\n")
    assert "- **Context:** `irc:#python`" in text
    assert "- **Created:** " in text and "- **Last active:** " in text
    assert "- **Model:** qwen" in text
    assert "## System prompt\n\n````\n" + PROMPT + "\n````" in text
    when = markdown.when(written["user"].ts)
    assert f"### User · {when}\n\n{NASTY}" in text
    assert "**Tool call** `lookup` (id `call_1`)\n\n```json\n{\n" in text
    assert '"q": "<b>py</b>"' in text
    assert "### Tool result for `call_1`" in text
    assert '```json\n{\n  "result": "3 & <4>"\n}\n```' in text
    assert "Answer: **bold** ```not a fence``` 🐍" in text
    assert "> thinking <hard>" in text
    assert f"*\\[event: resumed\\] after=3h* — {markdown.when(written['event'].ts)}" in text
    assert "future_kind" not in text and "x_future" not in text


def test_transcripts_mark_estimated_usage(store: Store) -> None:
    """Markdown and HTML show token totals as ``terrarium stats`` does: exact ones plain,
    partly estimated ones marked ``~`` with the estimated calls counted."""
    written = converse(store)
    assert "- **Tokens:** 10 prompt, 5 completion in 1 call\n" in export_context(
        store, CONTEXT, "markdown"
    )
    save_usage(store, written["ref"], UsageRecord("qwen", 7, 3, estimated="chars"))
    text = export_context(store, CONTEXT, "markdown")
    assert "- **Tokens:** ~17 prompt, ~8 completion in 2 calls (1 estimated)" in text
    page = export_context(store, CONTEXT, "html")
    assert "<th>Tokens</th><td>~17 prompt, ~8 completion in 2 calls (1 estimated)</td>" in page


def test_markdown_fences_cannot_be_closed_by_content() -> None:
    assert markdown.fenced("a ```` b") == "`````\na ```` b\n`````"
    assert markdown.code_span("a`b") == "``a`b``"
    assert markdown.escape("*x* [y](z) <b>") == "\\*x\\* \\[y\\](z) \\<b\\>"


# --------------------------------------------------------------------------- html


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: list[tuple[str, str | None]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.extend(attrs)

    def handle_data(self, data: str) -> None:
        self.text.append(data)


ALLOWED_TAGS = {
    "html", "head", "meta", "title", "style", "body", "main", "header", "h1", "h2", "table",
    "tr", "th", "td", "section", "div", "b", "time", "details", "summary", "pre", "code",
    "span", "small", "i", "a",
    # message text is Markdown: what markdown-it makes of it (raw HTML stays escaped)
    "p", "strong", "em", "ul", "ol", "li", "blockquote", "hr", "br", "h3", "thead", "tbody",
}  # fmt: skip


def test_html_page_is_self_contained_and_escaped(store: Store) -> None:
    """Content is escaped everywhere; the page loads nothing and runs nothing."""
    nasty_context = "web:<img src=x onerror=alert(1)>&\"'"
    converse(store)
    converse(store, nasty_context)
    for context in (CONTEXT, nasty_context):
        page = export_context(store, context, "html")
        assert isinstance(page, str)
        assert page.startswith("<!DOCTYPE html>")
        parser = _Tags()
        parser.feed(page)
        assert parser.tags <= ALLOWED_TAGS, parser.tags - ALLOWED_TAGS
        names = {name for name, _ in parser.attrs}
        assert not {"src", "onerror", "onload", "onclick"} & names
        assert "<link" not in page and "<script" not in page and "<img" not in page
        # in text a quote needs no escape (markdown-it leaves ' as it is); markup does
        assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &quot;double&quot; 'single'" in page
        assert "naïve 日本語 🐍" in page
        text = "".join(parser.text)
        assert NASTY in text  # the escaped markup reads back as the original text
        assert PROMPT in text
        assert "thinking <hard>" in text and '"q": "<b>py</b>"' in text
        assert "[event: resumed] after=3h" in text
        assert str(ContextId.parse(context)) in text  # metadata: title and table
        assert "<style>" in page and "Content-Security-Policy" in page
    page = export_context(store, nasty_context, "html")
    assert "<title>web:&lt;img src=x onerror=alert(1)&gt;&amp;&quot;&#x27;</title>" in page


MARKDOWN = """# Plan

1. **bold**, *emphasis* and `code`

```python
print("hi")
```

| a | b |
| - | - |
| 1 | 2 |

<b>raw</b> [bad](javascript:alert(1)) [ok](https://example.org/)"""


def test_html_renders_markdown_as_the_dashboard_does(store: Store) -> None:
    """Message text is Markdown rendered by the dashboard's renderer (raw HTML escaped, only
    http(s) and mailto links, code highlighted with the page's Pygments styles inline)."""
    from terrarium.web import render

    session_id, segment_id = create_segment(store, context="cli:md")
    ref = PodActiveSegmentRef(session_id, segment_id)
    save_user_input(store, ref, "show me *the plan*")
    save_delta(
        store, ref, [{"role": "assistant", "content": MARKDOWN, "reasoning_content": "_why_"}]
    )
    page = export_context(store, "cli:md", "html")
    assert isinstance(page, str)
    for text in ("show me *the plan*", MARKDOWN, "_why_"):
        assert str(render.markdown(text)) in page
    assert "<strong>bold</strong>" in page and "<em>the plan</em>" in page
    assert "<table>" in page and '<span class="nb">print</span>' in page
    assert "&lt;b&gt;raw&lt;/b&gt;" in page and 'href="javascript' not in page
    assert '<a href="https://example.org/">ok</a>' in page
    assert render.pygments_css() in page
    # each token's style goes to its class only: ".md pre .k, pre .k", never all of ".md pre"
    css = render.pygments_css()
    assert ".md pre .k, pre .k {" in css and ".md pre, pre ." not in css


def test_html_chat_layout(store: Store) -> None:
    converse(store)
    page = export_context(store, CONTEXT, "html")
    assert isinstance(page, str)
    assert page.count('<div class="msg user">') == 1
    assert page.count('<div class="msg assistant">') == 2
    assert page.count('<div class="msg tool">') == 1
    assert page.count('<div class="event">') == 1
    assert '<span class="call-name">lookup</span>' in page


def test_transcripts_mark_a_failed_turn_and_keep_its_partial_reply(store: Store) -> None:
    """Markdown and HTML mark a failed turn's message as ``show`` and the dashboard do, and
    keep the reply that Ctrl-C (or a dropped stream) cut short. Before, a failed message read
    as one the model had answered, and the partial reply was left out."""
    ref = converse(store)["ref"]
    save_user_input(store, ref, "tell me more")
    error = {"error": "cancelled", "error_type": "CancelledError", "partial": "Half an *ans"}
    append_entry(store, ref, "run_errored", error)
    save_user_input(store, ref, "and now?")
    save_delta(store, ref, [{"role": "assistant", "content": "Now."}])
    text = export_context(store, CONTEXT, "markdown")
    assert isinstance(text, str)
    assert "· *failed, not sent to the model again: cancelled*\n\ntell me more\n\n" in text
    assert "### Assistant (interrupted: the partial reply)\n\nHalf an *ans\n\n### User" in text
    assert text.count("failed, not sent") == 1  # "and now?" is an ordinary message
    page = export_context(store, CONTEXT, "html")
    assert isinstance(page, str)
    assert '<span class="failed">failed, not sent to the model again: cancelled</span>' in page
    assert "<b>Assistant</b> (interrupted: the partial reply)" in page
    assert "Half an *ans" in page and page.count('class="failed"') == 1


# --------------------------------------------------------------------------- openai


def test_openai_messages_are_what_the_model_is_sent(store: Store) -> None:
    converse(store)
    text = export_context(store, CONTEXT, "openai")
    assert isinstance(text, str)
    assert json.loads(text) == [
        {"role": "system", "content": PROMPT},
        {"role": "user", "content": NASTY},
        {"role": "assistant", "content": None, "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"result": "3 & <4>"}'},
        {"role": "assistant", "content": "Answer: **bold** ```not a fence``` 🐍"},
        {"role": "system", "content": "[event: resumed] after=3h"},
    ]


def test_openai_messages_match_the_runtime(store: Store) -> None:
    """The export and the manager's request builder agree, message for message."""
    from terrarium.agent.session_manager import PersistentSession

    converse(store)
    state = restore(store, CONTEXT)
    assert openai.chat_messages(state) == PersistentSession.load(store, CONTEXT).chat_messages()


def _dated(store: Store, context: str, day: str, *, reply: bool = True) -> None:
    """A conversation whose entries are all logged on ``day``."""
    session_id, segment_id = new_session_id(), new_segment_id()
    create_segment_with_ids(
        store, session_id, segment_id, SegmentStartState(), context=context, ts=f"{day}T08:00:00Z"
    )
    said = {"item": {"role": "user", "content": day}}
    entries = [NewEntry("user_input", f"{day}T09:00:00Z", said)]
    if reply:
        item = {"role": "assistant", "content": f"reply {day}"}
        entries.append(NewEntry("item", f"{day}T09:00:01.5Z", {"item": item}))
    store.append(session_id, segment_id, entries)


def test_finetune_jsonl_and_filters(store: Store, tmp_path: Path) -> None:
    converse(store)
    _dated(store, "cli:a", "2025-01-10")
    _dated(store, "cli:b", "2025-02-10")
    _dated(store, "cli:silent", "2025-02-11", reply=False)
    _dated(store, "game:c", "2025-03-10")

    def contexts(text: str) -> list[str]:
        out = []
        for line in text.splitlines(keepends=True):
            assert line.endswith("\n")
            record = json.loads(line)
            assert set(record) == {"messages"}
            first = record["messages"][0]
            out.append(first["content"] if first["role"] == "user" else "irc")
        return out

    def export_finetune(chosen: list[str] | None = None, **filters: Any) -> str:
        dest = tmp_path / "finetune.jsonl"
        export_many(store, chosen, "finetune", dest, **filters)
        return dest.read_text(encoding="utf-8")

    everything = export_finetune()
    assert contexts(everything) == ["2025-01-10", "2025-02-10", "2025-03-10", "irc"]
    irc = json.loads(everything.splitlines()[-1])
    assert irc["messages"] == json.loads(export_context(store, CONTEXT, "openai"))
    assert contexts(export_finetune(type="cli")) == ["2025-01-10", "2025-02-10"]
    assert contexts(export_finetune(["game:c", CONTEXT])) == ["2025-03-10", "irc"]
    assert contexts(export_finetune(["cli:silent"])) == []
    window = export_finetune(since="2025-02-01", until="2025-03-10")
    assert contexts(window) == ["2025-02-10", "2025-03-10"]
    last = dt.datetime(2025, 3, 10, 9, 0, 1, 500000, tzinfo=dt.UTC)  # the last reply: inclusive
    assert contexts(export_finetune(since=last)) == ["2025-03-10", "irc"]
    later = "2025-03-10T09:00:02"  # naive text: UTC
    assert contexts(export_finetune(since=later, until=dt.date(2025, 3, 10))) == []
    assert contexts(export_finetune(until=dt.date(2025, 1, 10))) == ["2025-01-10"]
    assert export_context(store, "cli:silent", "finetune") == ""
    one = export_context(store, "cli:a", "finetune")
    assert isinstance(one, str) and contexts(one) == ["2025-01-10"]


def test_finetune_carries_tool_definitions(store: Store) -> None:
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {}}}]
    written = converse(store)
    save_config_changed(store, written["ref"], {"model": "qwen", "tools": tools})
    record = json.loads(openai.export_finetune_context(store, CONTEXT))
    assert record["tools"] == tools
    assert record["messages"][2]["tool_calls"] == [CALL]


# --------------------------------------------------------------------------- jsonl


def _same_state(a: RestoredState, b: RestoredState) -> None:
    for name in (
        "session_id", "segment_id", "context", "origin", "system_prompt", "config", "history",
        "usage", "extensions", "last_run", "next_seq", "created_at", "last_active", "turns",
        "unknown",
    ):  # fmt: skip
        assert getattr(a, name) == getattr(b, name), name


def _branch(store: Store) -> None:
    """Fork the context's head after the tool call and move the head there."""
    written = converse(store)
    ref = written["ref"]
    segment = fork_at(store, ref, 2)
    store.set_head(ContextId.parse(CONTEXT), segment, expected=ref.segment_id)
    save_user_input(store, PodActiveSegmentRef(ref.session_id, segment), "on the branch ✓")


@pytest.mark.parametrize("shape", ["root", "fork", "compaction"])
def test_jsonl_round_trip(store: Store, other: Store, shape: str) -> None:
    """Export, import into another store: same state, same raw lines, appends continue."""
    if shape == "fork":
        _branch(store)
    else:
        written = converse(store)
        if shape == "compaction":
            summary = [{"role": "system", "content": "summary"}]
            segment = create_compacted_segment(store, written["ref"], summary, context=CONTEXT)
            ref = PodActiveSegmentRef(written["ref"].session_id, segment)
            append_entry(store, ref, "future_kind", {"z": None})
    text = export_context(store, CONTEXT, "jsonl")
    assert isinstance(text, str)
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines == jsonl.lineage_lines(store, CONTEXT)
    assert lines[0]["kind"] == "header"
    if shape == "fork":
        assert [line["seq"] for line in lines] == [0, 1, 2, 0, 1]

    head = jsonl.import_context(other, text)
    assert head.context == CONTEXT
    assert head == other.get_head(ContextId.parse(CONTEXT))
    _same_state(restore(store, CONTEXT), restore(other, CONTEXT))
    assert export_context(other, CONTEXT, "jsonl") == text

    state = restore(other, CONTEXT)
    entry = save_user_input(other, state, "more")
    assert entry.seq == state.next_seq


def test_jsonl_import_refuses_duplicates_and_can_rename(store: Store, other: Store) -> None:
    converse(store)
    text = export_context(store, CONTEXT, "jsonl")
    assert isinstance(text, str)
    jsonl.import_context(other, text)
    with pytest.raises(ContextExists):
        jsonl.import_context(other, text)
    with pytest.raises(SessionConflict, match="under another context"):
        jsonl.import_context(other, text, context="irc:#other")
    assert other.get_head(ContextId.parse("irc:#other")) is None
    fresh = MemoryStore()
    jsonl.import_context(fresh, text.encode(), context="irc:#renamed")
    assert restore(fresh, "irc:#renamed").history == restore(store, CONTEXT).history
    assert jsonl.lineage_lines(fresh, "irc:#renamed")[0]["context"] == "irc:#renamed"


def test_jsonl_import_rejects_broken_lineages(other: Store) -> None:
    session_id, segment_id = new_session_id(), new_segment_id()
    header = {
        "v": 1, "seq": 0, "ts": "2025-01-01T00:00:00Z", "kind": "header",
        "session_id": str(session_id), "segment_id": str(segment_id), "context": "cli:x",
        "history": [],
    }  # fmt: skip
    entry = {"v": 1, "seq": 1, "ts": "2025-01-01T00:00:01Z", "kind": "turn_end"}
    with pytest.raises(InvalidEntry, match="header"):
        jsonl.import_context(other, [entry])
    with pytest.raises(InvalidEntry, match="expected seq 1"):
        jsonl.import_context(other, [header, {**entry, "seq": 2}])
    with pytest.raises(InvalidEntry, match="no lines"):
        jsonl.import_context(other, "")
    with pytest.raises(InvalidEntry, match="names no context"):
        jsonl.import_context(other, [{**header, "context": None}])
    assert other.list_contexts() == []
    head = jsonl.import_context(other, [header, entry])
    assert head.segment_id == segment_id


# --------------------------------------------------------------------------- export_many


def test_formats_registry() -> None:
    assert {"markdown", "html", "jsonl", "openai", "finetune", "terrarium-json"} <= set(FORMATS)
    assert member_name("irc:#python", "markdown") == "irc/#python.md"
    assert member_name("web:what?*", "html") == "web/what%3F%2A.html"
    with pytest.raises(ValueError, match="unknown export format 'docx'"):
        export_context(MemoryStore(), CONTEXT, "docx")


def _populate(store: Store) -> list[str]:
    converse(store)
    converse(store, "web:what?*")
    _dated(store, "cli:main", "2025-01-10")
    return ["cli/main.md", "irc/#python.md", "web/what%3F%2A.md"]


def test_export_many_to_a_folder(store: Store, tmp_path: Path) -> None:
    members = _populate(store)
    result = export_many(store, None, "markdown", tmp_path / "out")
    assert sorted(result.members) == members
    assert result.path == tmp_path / "out"
    files = sorted(p.relative_to(result.path).as_posix() for p in result.path.rglob("*.*"))
    assert files == members
    text = (result.path / "irc" / "#python.md").read_text(encoding="utf-8")
    assert text == export_context(store, CONTEXT, "markdown")
    only = export_many(store, None, "html", tmp_path / "web", type="web")
    assert only.members == ["web/what%3F%2A.html"]
    dated = export_many(store, ["cli:main", CONTEXT], "jsonl", tmp_path / "d", until="2025-06-01")
    assert dated.members == ["terrarium-bundle.json", "cli/main.jsonl"]  # jsonl: a bundle


@pytest.mark.parametrize("suffix", [".zip", ".tar.gz"])
def test_export_many_to_an_archive(store: Store, tmp_path: Path, suffix: str) -> None:
    members = [m.replace(".md", ".html") for m in _populate(store)]
    dest = tmp_path / "out" / f"export{suffix}"
    result = export_many(store, None, "html", dest)
    assert result.path == dest and sorted(result.members) == members
    if suffix == ".zip":
        with zipfile.ZipFile(dest) as archive:
            assert archive.testzip() is None
            assert sorted(archive.namelist()) == members
            page = archive.read("irc/#python.html").decode()
    else:
        with tarfile.open(dest, "r:gz") as archive:
            assert sorted(archive.getnames()) == members
            handle = archive.extractfile("irc/#python.html")
            assert handle is not None
            page = handle.read().decode()
    assert page == export_context(store, CONTEXT, "html")
    assert [p.name for p in dest.parent.iterdir()] == [dest.name]  # no temporary files left


def test_export_many_finetune_is_one_file(store: Store, tmp_path: Path) -> None:
    _populate(store)
    result = export_many(store, None, "finetune", tmp_path / "train.jsonl")
    assert result.path == tmp_path / "train.jsonl"
    lines = result.path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 3 and all("messages" in json.loads(line) for line in lines)
    archived = export_many(store, None, "finetune", tmp_path / "train.zip", type="cli")
    with zipfile.ZipFile(archived.path) as archive:
        assert archive.namelist() == ["finetune.jsonl"]
        assert len(archive.read("finetune.jsonl").splitlines()) == 1
    (tmp_path / "folder").mkdir()
    into = export_many(store, None, "finetune", tmp_path / "folder")
    assert into.members == ["finetune.jsonl"]
    assert (tmp_path / "folder" / "finetune.jsonl").read_text(encoding="utf-8").count("\n") == 3


@pytest.mark.skipif(
    importlib.util.find_spec("terrarium.formats.terrarium_json") is None,
    reason="terrarium.formats.terrarium_json is not there yet",
)
def test_terrarium_json_is_delegated(store: Store) -> None:
    terrarium_json = importlib.import_module("terrarium.formats.terrarium_json")
    converse(store)
    expected = terrarium_json.export_context(store, CONTEXT)
    assert export_context(store, CONTEXT, "terrarium-json") == expected
    assert isinstance(expected, str | bytes) and json.loads(expected)


def test_archive_readers_see_utf8_names(tmp_path: Path) -> None:
    """Member names outside ASCII survive both archive formats."""
    store = MemoryStore()
    _dated(store, "irc:#café", "2025-01-10")
    for suffix in (".zip", ".tar.gz"):
        dest = tmp_path / f"x{suffix}"
        export_many(store, None, "jsonl", dest)
        data = io.BytesIO(dest.read_bytes())
        if suffix == ".zip":
            with zipfile.ZipFile(data) as archive:
                names = archive.namelist()
        else:
            with tarfile.open(fileobj=data, mode="r:gz") as tar:
                names = tar.getnames()
        assert names == ["terrarium-bundle.json", "irc/#café.jsonl"]  # jsonl: a bundle
