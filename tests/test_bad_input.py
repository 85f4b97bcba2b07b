"""Bad input at the edges: deep nesting, lone surrogates, bytes that are not UTF-8, names that
display misleadingly. Each is a one-line terrarium error (naming the file for files), never a
traceback, and nothing is written. The store-level invariants are in
``tests/contract/test_bad_input.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner, Result

from fakeserver import FakeServer
from terrarium import (
    ContextId,
    CorruptLog,
    FsStore,
    InvalidContextId,
    InvalidEntry,
    MemoryStore,
    SegmentOrigin,
    SegmentStartState,
    append_entry,
    codec,
    create_segment,
    create_segment_with_ids,
    detached_sessions,
    fork_at,
    restore,
    save_delta,
)
from terrarium.agent.multi_context_manager import MultiContextManager
from terrarium.cli import cli
from terrarium.export import export_context
from terrarium.formats import jsonl
from terrarium.formats import terrarium_json as tj
from terrarium.integrations.openai_agents import TerrariumSession
from terrarium.llm.vllm_client import VLLMClient
from terrarium.model import (
    EntryKind,
    display_name,
    misleading_chars,
    new_segment_id,
    new_session_id,
)

TERRARIUM = [sys.executable, "-m", "terrarium.cli"]


def deep_json(levels: int) -> str:
    return "[" * levels + "]" * levels


def invoke(*args: str, input: str | bytes | None = None) -> Result:
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def assert_one_line_error(result: Result, *needles: str) -> None:
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ") and "Traceback" not in result.output
    for needle in needles:
        assert needle in lines[0], lines[0]


def tree(root: Path) -> dict[str, bytes | None]:
    """Every file (with its bytes) and folder under ``root`` but locks."""
    return {
        str(p.relative_to(root)): p.read_bytes() if p.is_file() else None
        for p in sorted(root.rglob("*"))
        if ".locks" not in p.relative_to(root).parts
    }


# --------------------------------------------------------------------------- the codec


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b'"x"', 0),
        (b"[]", 1),
        (b'{"a":[{"b":[]}]}', 4),
        (b'["[[[[", "\\"[[[", {"k]]": "{{{"}]', 2),
        (b'"\\\\" ', 0),
        (deep_json(10_000).encode(), 10_000),
    ],
)
def test_nesting_depth_ignores_brackets_in_strings(text: bytes, depth: int) -> None:
    assert codec.nesting_depth(text) == depth


def test_encode_refuses_deterministically_whatever_the_stack() -> None:
    """The limit holds at any stack depth: MAX_DEPTH encodes and decodes under 500 frames
    (where msgspec's own limit would be about 500), one level more never encodes."""
    at_limit = {"x": json.loads(deep_json(codec.MAX_DEPTH - 1))}
    past = {"x": json.loads(deep_json(codec.MAX_DEPTH))}

    def under(frames: int) -> Any:
        if frames:
            return under(frames - 1)
        line = codec.encode_line(at_limit)
        with pytest.raises(InvalidEntry, match="more than 256 levels deep"):
            codec.encode_line(past)
        return codec.decode(line)

    assert under(0) == under(500) == at_limit
    with pytest.raises(InvalidEntry, match="more than 256 levels deep"):
        codec.encode_lines([{"seq": 1}, past])


@dataclasses.dataclass
class Box:
    inner: Any


def test_depth_counts_every_container_kind() -> None:
    """Tuples, sets and dataclasses nest as JSON does; long lines are judged like short."""

    def wrap(levels: int, make: Any) -> Any:
        value: Any = "x"
        for _ in range(levels):
            value = make(value)
        return value

    limit = codec.MAX_DEPTH - 1  # below the line's own object
    for make in (lambda v: (v,), lambda v: {"k": v}, Box, lambda v: frozenset([v])):
        codec.encode({"x": wrap(limit, make)})
        with pytest.raises(InvalidEntry, match="more than 256 levels deep"):
            codec.encode({"x": wrap(limit + 1, make)})
        long_text = {"x": wrap(limit + 1, make), "text": "{[" * 5000}
        with pytest.raises(InvalidEntry, match="more than 256 levels deep"):
            codec.encode_lines([{"seq": 1}, long_text])
    assert not codec.deeper_than({"t": "[" * 1000, "kind": EntryKind.ITEM}, 1)


def test_decoding_a_file_nested_too_deeply_names_file_and_line() -> None:
    """A line nested past Python's recursion limit is CorruptLog naming the line, never a
    RecursionError; ``decode`` raises msgspec's DecodeError, which its callers handle."""
    good = b'{"seq":0,"kind":"header"}\n'
    bad = b'{"seq":1,"kind":"item","x":' + deep_json(2000).encode() + b"}\n"
    with pytest.raises(CorruptLog, match=r"^seg\.jsonl:2: nested 2001 levels deep, too deep"):
        codec.decode_lines(good + bad, where="seg.jsonl")
    with pytest.raises(msgspec.DecodeError, match="too deep to decode"):
        codec.decode(bad)


def test_native_log_file_nested_too_deeply_is_corrupt_log(tmp_path: Path) -> None:
    """A segment file edited to hold a line nested 1,000 deep: restore and show report it."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        create_segment(store, context="cli:x")
        folder = store.folder_of(ContextId.parse("cli:x"))
        assert folder is not None
        segment = next(folder.glob("*.jsonl"))
        line = {"v": 1, "seq": 1, "ts": "2025-01-01T00:00:00.000000Z", "kind": "item"}
        text = json.dumps(line)[:-1] + ', "item": ' + deep_json(1000) + "}\n"
        with segment.open("a") as f:
            f.write(text)
        with pytest.raises(CorruptLog, match=f"{segment}:2: nested 1001 levels deep"):
            restore(FsStore(root), "cli:x")
    assert_one_line_error(invoke("show", "cli:x", "--storage-dir", str(root)), f"{segment}:2")


@pytest.mark.parametrize("fmt", ["markdown", "html"])
def test_export_of_deeply_nested_tool_arguments_shows_them_verbatim(fmt: str) -> None:
    """Tool call arguments are text the model wrote: JSON nested past the stack is shown as
    it is, not pretty-printed, and never a RecursionError."""
    store = MemoryStore()
    create_segment(store, context="cli:a")
    head = store.get_head(ContextId.parse("cli:a"))
    assert head is not None
    arguments = deep_json(5000)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    save_delta(store, head, [{"role": "assistant", "content": None, "tool_calls": [call]}])
    exported = export_context(store, "cli:a", fmt)
    assert isinstance(exported, str) and arguments in exported


# --------------------------------------------------------------------------- legacy files


def write_legacy(root: Path, name: str, text: str) -> Path:
    path = root / "cli" / "2025-11-06" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def legacy_text(name: str, extra: str = "", content: str = '"hello"') -> str:
    return (
        f'{{"session_id": "{name}", "context_type": "cli", "messages": '
        f'[{{"role": "user", "content": {content}}}]{extra}}}'
    )


@pytest.mark.parametrize("levels", [1000, 100_000])
def test_legacy_file_nested_deeply_gives_one_line_errors(tmp_path: Path, levels: int) -> None:
    """list skips it; fsck, migrate --dry-run, show, export and import name the file."""
    root = tmp_path / "sessions"
    path = write_legacy(root, "deep", legacy_text("deep", f', "x": {deep_json(levels)}'))
    write_legacy(root, "fine", legacy_text("fine"))
    store = ["--storage-dir", str(root)]
    listing = invoke("list", *store)
    assert listing.exit_code == 0 and "cli:fine" in listing.stdout
    assert "cli:deep" not in listing.stdout
    fsck = invoke("fsck", *store)
    assert fsck.exit_code == 1 and f"{path}: arrays and objects nest more than" in fsck.output
    migrate = invoke("migrate", "--dry-run", *store)
    assert migrate.exit_code == 1 and "deep.json: arrays and objects nest" in migrate.output
    for command in (["show", "cli:deep"], ["export", "cli:deep"], ["import", str(path)]):
        assert_one_line_error(invoke(*command, *store), str(path), "nest more than 254 levels")
    logs = [name for name in tree(root) if not name.startswith(".index")]
    assert logs == ["cli", "cli/2025-11-06", "cli/2025-11-06/deep.json", "cli/2025-11-06/fine.json"]


def test_legacy_depth_limit_leaves_room_for_the_import(tmp_path: Path) -> None:
    """A legacy file is imported if it nests at most MAX_DEPTH - 2 (its keys land two
    levels deeper in the root header); one level more is refused by ``load``."""
    root = tmp_path / "sessions"
    limit = codec.MAX_DEPTH - 2
    top = write_legacy(root, "top", legacy_text("top", f', "x": {deep_json(limit - 1)}'))
    message = write_legacy(
        root,
        "msg",
        legacy_text("msg").replace('"hello"}', f'"hello", "x": {deep_json(limit - 3)}}}'),
    )
    over = write_legacy(root, "over", legacy_text("over", f', "x": {deep_json(limit)}'))
    assert codec.nesting_depth(top.read_bytes()) == codec.nesting_depth(message.read_bytes())
    store = MemoryStore()
    for path in (top, message):
        tj.import_session(store, tj.load(path))
    assert len(store.list_contexts()) == 2
    assert tj.export_dict(store, "cli:top")["x"] == json.loads(top.read_text())["x"]
    with pytest.raises(tj.LegacyFormatError, match=f"{over}: arrays and objects nest more"):
        tj.load(over)


@pytest.mark.parametrize(
    ("where", "text"),
    [
        ("content", legacy_text("s", content='"hi \\ud800"')),
        ("key", legacy_text("s", ', "\\udc80": 1')),
        ("prompt", legacy_text("s", ', "system_prompt": "\\udfff"')),
    ],
)
def test_legacy_file_with_lone_surrogate_is_refused(tmp_path: Path, where: str, text: str) -> None:
    """A ``\\ud800`` escape (valid JSON, not valid Unicode) is refused naming the file,
    and importing writes nothing."""
    root = tmp_path / "sessions"
    path = write_legacy(root, "s", text)
    with pytest.raises(tj.LegacyFormatError, match="not valid Unicode: lone surrogate"):
        tj.load(path)
    before = tree(root)
    result = invoke("import", str(path), "--storage-dir", str(root))
    assert_one_line_error(result, str(path), "lone surrogate U+D")
    assert tree(root) == before


# --------------------------------------------------------------------------- native JSONL


def exported(context: str = "cli:a") -> list[dict[str, Any]]:
    store = MemoryStore()
    create_segment(store, SegmentStartState(system_prompt="p"), context=context)
    return [json.loads(line) for line in jsonl.export_context(store, context).splitlines()]


def test_jsonl_import_nested_past_the_decoder_is_corrupt_log(tmp_path: Path) -> None:
    """Lines deeper than the decoder can go: CorruptLog naming file and line, nothing made."""
    root = tmp_path / "sessions"
    lines = exported()
    path = tmp_path / "deep.jsonl"
    body = json.dumps({**lines[0], "x": "y"})[:-1] + f', "z": {deep_json(1000)}}}'
    path.write_text(body + "\n")
    result = invoke("import", str(path), "--storage-dir", str(root))
    assert_one_line_error(result, f"{path}:1: nested 1001 levels deep")
    assert not root.exists() or tree(root) == {}


def _lineage_cases() -> dict[str, tuple[list[Any], str]]:
    header = exported()[0]
    entry = {"v": 1, "seq": 1, "ts": "2025-01-01T00:00:00.000000Z", "kind": "turn_end"}
    return {
        "empty": ([], ": nothing to import: the file has no lines"),
        "no header": ([entry], ":1: a lineage must start with a segment header"),
        "header seq": ([header, {**header, "seq": 5}], ":2: a header must have seq 0, not 5"),
        "seq gap": ([header, {**entry, "seq": 2}], ":2: expected seq 1, found 2"),
        "bad id": ([{**header, "session_id": "nope"}], ": invalid session id 'nope'"),
    }


@pytest.mark.parametrize("case", list(_lineage_cases()))
def test_jsonl_import_of_a_broken_lineage_names_the_file(tmp_path: Path, case: str) -> None:
    """A file whose lines are entries but not a lineage: one line naming the file (and the
    line), as for a line that is not JSON; nothing made. Before, ``line 2: ...`` named no
    file, so among many paths the user could not tell which was wrong."""
    lines, message = _lineage_cases()[case]
    path = tmp_path / "broken.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    root = tmp_path / "sessions"
    result = invoke("import", str(path), "--storage-dir", str(root))
    assert_one_line_error(result, f"Error: {path}{message}")
    assert not root.exists() or tree(root) == {}


def test_jsonl_import_with_a_lone_surrogate_escape_says_so(tmp_path: Path) -> None:
    """``"\\ud800"`` in a JSONL file: CorruptLog naming file, line and the escape; a valid
    pair (an emoji written as two escapes) and an escaped backslash are fine."""
    root = tmp_path / "sessions"
    header = json.dumps(exported()[0])
    entry = {"v": 1, "seq": 1, "ts": "2025-01-01T00:00:00.000000Z", "kind": "user_input"}
    prefix = json.dumps(entry)[:-1] + ', "item": {"role": "user", "content": "'
    path = tmp_path / "s.jsonl"
    path.write_text(header + "\n" + prefix + 'hi \\ud800"}}\n')
    result = invoke("import", str(path), "--storage-dir", str(root))
    assert_one_line_error(result, f"{path}:2: not valid JSON (a \\u escape of a lone surrogate")
    assert not root.exists() or tree(root) == {}
    path.write_text(header + "\n" + prefix + '\\\\ud800 \\ud83d\\ude00"}}\n')
    assert invoke("import", str(path), "--storage-dir", str(root)).exit_code == 0
    with FsStore(root) as store:
        assert restore(store, "cli:a").history[-1]["content"] == "\\ud800 \U0001f600"


@pytest.mark.parametrize(
    "bad",
    [
        {"item": {"role": "user", "content": "x", "x": json.loads(deep_json(300))}},
        {"item": {"role": "user", "content": "\ud800"}},
    ],
)
def test_jsonl_import_of_unloggable_line_makes_nothing(tmp_path: Path, bad: dict[str, Any]) -> None:
    """A line that decodes but cannot be logged is InvalidEntry naming the line; the store is
    left as it was (no context, no folder, nothing in the trash)."""
    lines = exported()
    entry = {"v": 1, "seq": 1, "ts": lines[0]["ts"], "kind": "user_input", **bad}
    with FsStore(tmp_path / "sessions") as store:
        before = tree(store.root)
        with pytest.raises(InvalidEntry, match=r"^<jsonl>:2: "):
            jsonl.import_context(store, [*lines, entry])
        assert tree(store.root) == before  # before listing, which may build the index
        assert store.list_contexts() == []


def test_jsonl_import_under_a_misleading_new_name_is_refused() -> None:
    """``--as`` a new name is a name the user gives: the display rule applies to it."""
    store = MemoryStore()
    with pytest.raises(InvalidContextId, match="U\\+202E"):
        jsonl.import_context(store, exported(), context="cli:x\u202ey")
    assert store.list_contexts() == []


def test_jsonl_import_keeps_the_files_own_misleading_name() -> None:
    """An export of a context an older version named so imports under that name."""
    old = MemoryStore()
    create_segment_with_ids(
        old,
        new_session_id(),
        new_segment_id(),
        context="cli:a\u202eb",
        origin=SegmentOrigin("import"),
    )
    store = MemoryStore()
    jsonl.import_context(store, jsonl.export_context(old, "cli:a\u202eb"))
    assert [h.context for h in store.list_contexts()] == ["cli:a\u202eb"]


# --------------------------------------------------------------------------- the manager


def test_manager_refuses_lone_surrogate_before_creating_the_context(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    """process_with_context with "\\ud800": InvalidEntry, no context made, nothing sent."""
    client = VLLMClient(base_url=fake_server.root_url, max_retries=0, backoff_base=0.001)
    manager = MultiContextManager(client, storage_dir=str(tmp_path / "sessions"))

    async def main() -> None:
        with pytest.raises(InvalidEntry, match="user_message is not valid Unicode"):
            await manager.process_with_context("cli:new", "hi \ud800")
        await manager.process_with_context("cli:old", "hello")
        with pytest.raises(InvalidEntry, match="lone surrogate U\\+DCFF"):
            await manager.process_with_context("cli:old", "\udcff")
        with pytest.raises(InvalidEntry, match="lone surrogate"):
            await manager.process_with_context("cli:old", "fine", system_prompt="\ud800")
        await manager.aclose()

    asyncio.run(main())
    contexts = manager.list_all_contexts()
    assert [(t, row["session_id"]) for t, rows in contexts.items() for row in rows] == [
        ("cli", "old")
    ]
    assert len(fake_server.requests) == 1
    with FsStore(tmp_path / "sessions") as store:
        assert len(restore(store, "cli:old").history) == 2


# --------------------------------------------------------------------------- chat's stdin


def chat_pipe(cwd: Path, url: str, data: bytes, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    return subprocess.run(
        [*TERRARIUM, "chat", *args, "--base-url", url],
        input=data,
        capture_output=True,
        cwd=cwd,
        env=env,
        timeout=60,
    )


@pytest.mark.parametrize("locale", ["C.UTF-8", "C"])
def test_chat_stdin_not_utf8_stops_with_byte_offset(
    fake_server: FakeServer, tmp_path: Path, locale: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``printf 'hi\\nhi \\xff\\nafter\\n' | terrarium chat cli:x``: line 1 is answered; line 2
    is refused with its line number and byte offset, not sent or logged; the chat stops there
    and exits 1 (as piped chats do on any failure)."""
    monkeypatch.setenv("LC_ALL", locale)
    result = chat_pipe(tmp_path, fake_server.base_url, b"hi\nhi \xff there\nafter\n", "cli:x")
    assert result.returncode == 1
    assert result.stdout == b"echo: hi\n"
    assert result.stderr.decode().splitlines() == [
        "Error: stdin line 2 is not valid UTF-8: byte 0xff at offset 3 of the line "
        "(6 of the input); the line was not sent"
    ]
    assert len(fake_server.requests) == 1
    with FsStore(tmp_path / "sessions") as store:
        assert [i["content"] for i in restore(store, "cli:x").history] == ["hi", "echo: hi"]


def test_chat_stdin_first_line_not_utf8_creates_nothing(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    result = chat_pipe(tmp_path, fake_server.base_url, b"\xc3( caf\xc3\xa9\n", "cli:y")
    assert result.returncode == 1
    assert b"stdin line 1 is not valid UTF-8: byte 0xc3 at offset 0" in result.stderr
    assert fake_server.requests == []
    assert (
        not (tmp_path / "sessions").exists() or FsStore(tmp_path / "sessions").list_contexts() == []
    )


def test_chat_stdin_utf8_still_works_in_process(fake_server: FakeServer, tmp_path: Path) -> None:
    """Valid UTF-8 (accents, emoji, CRLF endings) goes through unchanged."""
    root = str(tmp_path / "sessions")
    args = ("chat", "cli:z", "--base-url", fake_server.base_url, "--storage-dir", root)
    result = invoke(*args, input="café 👩‍💻\r\n\nbye\n".encode())
    assert result.exit_code == 0, result.output
    assert result.stdout == "echo: café 👩‍💻\necho: bye\n"


# --------------------------------------------------------------------------- names


@pytest.mark.parametrize(
    "name",
    [
        *(f"a{chr(c)}b" for c in range(0x202A, 0x202F)),
        *(f"a{chr(c)}b" for c in range(0x2066, 0x206A)),
        "a\u200eb",
        "a\u200fb",
        "a\u061cb",
        "a\u2028b",
        "a\u2029b",
        "ma\u200bin",  # zero-width space
        "\ufeffmain",  # byte order mark
        "ma\u00adin",  # soft hyphen
        "main\U000e0041",  # a tag character
        "ma\u200din",  # ZWJ between ASCII letters hides
        "ma\u200cin",
        "\u200d\U0001f469",  # ZWJ at an end
        "日本\u200d",
    ],
)
def test_misleading_names_are_refused_for_new_contexts(name: str) -> None:
    ctx = ContextId("cli", name)  # a valid id: existing contexts keep their names
    with pytest.raises(InvalidContextId, match=r"display misleadingly"):
        ctx.check_new()
    assert "\\u" in ctx.display or "\\U" in ctx.display
    assert ctx.display.isprintable()


@pytest.mark.parametrize(
    "name",
    [
        "main",
        "#python",
        "日本語",
        "\U0001f469\u200d\U0001f4bb",  # woman technologist: an emoji ZWJ sequence
        "\U0001f3f3\ufe0f\u200d\U0001f308",  # rainbow flag, with a variation selector
        "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645",  # Persian with ZWNJ
        "\u0915\u094d\u200d\u0937",  # Devanagari with ZWJ
        "a b",
        "n\u0303o",  # a combining mark
    ],
)
def test_names_that_display_as_they_are_stay_usable(name: str) -> None:
    ctx = ContextId("cli", name)
    assert ctx.check_new() is ctx
    assert misleading_chars(name) == [] and display_name(name) == name


def test_list_shows_an_old_misleading_name_escaped(tmp_path: Path) -> None:
    """``list`` escapes what would reorder the line; ``--json`` keeps the exact name."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        create_segment_with_ids(
            store,
            new_session_id(),
            new_segment_id(),
            context="cli:abc\u202edef",
            origin=SegmentOrigin("import"),
        )
    listing = invoke("list", "--storage-dir", str(root))
    assert listing.exit_code == 0
    assert "cli:abc\\u202edef" in listing.stdout and "\u202e" not in listing.stdout
    rows = json.loads(invoke("list", "--json", "--storage-dir", str(root)).stdout)["contexts"]
    assert [r["context_id"] for r in rows] == ["cli:abc\u202edef"]
    shown = invoke("show", "cli:abc\u202edef", "--storage-dir", str(root))
    assert shown.exit_code == 0


def test_cli_refuses_a_misleading_new_name(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        create_segment(store, context="cli:src")
    result = invoke("fork", "cli:src", "cli:x\u2067y", "--storage-dir", str(root))
    assert_one_line_error(result, "'x\\u2067y'", "U+2067 (RIGHT-TO-LEFT ISOLATE)")
    assert [h.context for h in FsStore(root).list_contexts()] == ["cli:src"]


def _lock_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in (root / ".locks").rglob("*") if p.is_file())


@pytest.mark.parametrize("name", ["cli:x\u202ey", "archive:x"])
def test_a_name_refused_for_a_new_context_leaves_no_lock_behind(
    fake_server: FakeServer, tmp_path: Path, name: str
) -> None:
    """A chat (piped), a manager turn and an Agents SDK session on a new context whose name
    is refused are one-line errors that make nothing for it: no lock file either."""
    root = tmp_path / "sessions"
    with FsStore(root) as store:
        create_segment(store, context="cli:src")
    before = _lock_files(root)
    result = chat_pipe(tmp_path, fake_server.base_url, b"hi\n", name)
    assert result.returncode == 1
    (line,) = result.stderr.decode().strip().splitlines()
    assert line.startswith("Error: invalid context ")
    client = VLLMClient(base_url=fake_server.root_url, max_retries=0, backoff_base=0.001)
    manager = MultiContextManager(client, storage_dir=str(root))

    async def main() -> None:
        with pytest.raises(InvalidContextId):
            await manager.process_with_context(name, "hi")
        await manager.aclose()
        session = TerrariumSession("x", str(root), context=name)
        with pytest.raises(InvalidContextId):
            await session.add_items([{"role": "user", "content": "hi"}])
        session.close()

    asyncio.run(main())
    assert _lock_files(root) == before
    assert [h.context for h in FsStore(root).list_contexts()] == ["cli:src"]
    assert fake_server.requests == []


def test_terminal_chat_refuses_bytes_that_are_not_utf8(
    fake_server: FakeServer, tmp_path: Path
) -> None:
    """On a terminal, a line with a byte that is not UTF-8 gets a one-line error, is not sent
    or logged (no context is made for it), and the chat goes on."""
    pexpect = pytest.importorskip("pexpect")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TERRARIUM_")}
    env.update(TERM="xterm", NO_COLOR="1", PROMPT_TOOLKIT_NO_CPR="1")
    root = tmp_path / "sessions"
    args = ["chat", "cli:t", "--base-url", fake_server.base_url, "--storage-dir", str(root)]
    child = pexpect.spawn(
        sys.executable,
        ["-m", "terrarium.cli", *args],
        env=env,
        cwd=str(tmp_path),
        dimensions=(40, 120),
        encoding="utf-8",
        codec_errors="replace",
        timeout=20,
    )
    try:
        child.expect("cli:t>")
        os.write(child.child_fd, b"hi \xff there\r")
        child.expect("not valid Unicode")
        child.expect("cli:t>")
        assert not root.exists() or FsStore(root).list_contexts() == []
        child.send("fine\r")
        child.expect("echo: fine")
        child.expect("cli:t>")
        child.sendcontrol("d")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    assert len(fake_server.requests) == 1
    with FsStore(root) as store:
        assert [i["content"] for i in restore(store, "cli:t").history] == ["fine", "echo: fine"]


# --------------------------------------------------------------------------- library arguments


def _context_ref(store: MemoryStore) -> Any:
    create_segment(store, context="cli:a")
    return store.get_head(ContextId.parse("cli:a"))


@pytest.mark.parametrize(
    ("data", "problem"),
    [
        ([1], "entry data of kind 'item' must be a mapping (a JSON object), not list"),
        (object(), "entry data of kind 'item' must be a mapping (a JSON object), not object"),
        (None, "entry data of kind 'item' must be a mapping (a JSON object), not NoneType"),
        ({"x": object()}, "a value JSON has no form for: "),
    ],
)
def test_append_entry_with_data_that_is_no_json_object_is_invalid_entry(
    data: Any, problem: str
) -> None:
    """Data that is not a JSON object, or holds a value JSON has none for, is InvalidEntry
    naming the problem (not AttributeError or TypeError), and nothing is written."""
    store = MemoryStore()
    ref = _context_ref(store)
    with pytest.raises(InvalidEntry) as caught:
        append_entry(store, ref, "item", data)
    assert str(caught.value).startswith(problem), caught.value
    assert store.next_seq(ref.session_id, ref.segment_id) == 1


@pytest.mark.parametrize("at_seq", ["x", 1.0, True, None])
def test_fork_at_with_no_entry_number_names_the_argument(at_seq: Any) -> None:
    store = MemoryStore()
    ref = _context_ref(store)
    with pytest.raises(InvalidEntry, match=r"at_seq must be an entry number \(0, 1, 2, \.\.\.\)"):
        fork_at(store, ref, at_seq)
    assert len(store.list_segments(ref.session_id)) == 1


def test_create_segment_with_a_context_as_its_start_state_says_so() -> None:
    """A context id where the start state goes (``create_segment(store, ctx)``) is named,
    with the keyword it wants; nothing is created."""
    store = MemoryStore()
    with pytest.raises(InvalidEntry, match=r"start must be a SegmentStartState, not ContextId"):
        create_segment(store, ContextId.parse("cli:b"))  # type: ignore[arg-type]
    with pytest.raises(InvalidEntry, match=r"pass the context as context="):
        create_segment(store, "cli:b")  # type: ignore[arg-type]
    assert store.list_contexts() == [] and detached_sessions(store) == []


@pytest.mark.parametrize("name", [" ", "   ", "\u00a0", "\u3000 "])
def test_a_name_of_only_spaces_is_refused_for_new_contexts_and_old_ones_stay(name: str) -> None:
    """``cli: `` showed as ``cli:`` in listings: refused for a new context, with the reason;
    a context an older version made so is still created by an import and read."""
    with pytest.raises(InvalidContextId, match=r"it is only spaces, which show as nothing"):
        create_segment(MemoryStore(), context=f"cli:{name}")
    old = MemoryStore()
    origin = SegmentOrigin("import")
    ids = (new_session_id(), new_segment_id())
    create_segment_with_ids(old, *ids, context=f"cli:{name}", origin=origin)
    store = MemoryStore()
    jsonl.import_context(store, jsonl.export_context(old, f"cli:{name}"))
    assert [h.context for h in store.list_contexts()] == [f"cli:{name}"]
    assert restore(store, f"cli:{name}").history == []
