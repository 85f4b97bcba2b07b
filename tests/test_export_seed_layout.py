"""Many sessions exported as Terrarium JSON form the seed's storage tree (issue 17).

The seed (``seeds/004``, "Storage Structure", "Path Format") keeps each session at
``sessions/{context_type}/{date}/{session_id}.json``: ``date`` is the session's creation date,
``session_id`` the context's name (``#python.json``). ``terrarium export --all -f
terrarium-json`` writes exactly that tree into a folder, a ``.zip`` or a ``.tar.gz``, so the
folder is a sessions folder that terrarium (and the old tool) reads where it lies.
"""

from __future__ import annotations

import json
import re
import tarfile
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from terrarium import SegmentStartState
from terrarium.cli import cli
from terrarium.export import export_many, member_name
from terrarium.formats import terrarium_json
from terrarium.model import new_segment_id, new_session_id
from terrarium.sessions import create_segment_with_ids
from terrarium.stores.base import NewEntry
from terrarium.stores.fs import FsStore

SESSIONS = {
    # context: (creation day, the seed path)
    "cli:main": ("2025-11-05", "cli/2025-11-05/main.json"),
    "cli:xyz123": ("2025-11-06", "cli/2025-11-06/xyz123.json"),
    "irc:#python": ("2025-11-06", "irc/2025-11-06/#python.json"),
    "game:pokemon_run1": ("2025-11-06", "game/2025-11-06/pokemon_run1.json"),
    "web:what?*": ("2025-11-06", "web/2025-11-06/what%3F%2A.json"),  # unsafe: encoded
    "cli:CON": ("2025-11-06", "cli/2025-11-06/%43ON.json"),  # a Windows device name
}
SEED_PATHS = sorted(path for _, path in SESSIONS.values())
LAST_ACTIVE = re.compile(rb'"last_active": "[^"]*"')


def _converse(store: FsStore, context: str, day: str) -> None:
    """A session created at 08:00 UTC on ``day``, with two turns logged that morning."""
    session_id, segment_id = new_session_id(), new_segment_id()
    start = SegmentStartState(system_prompt=f"You talk in {context}.")
    create_segment_with_ids(
        store, session_id, segment_id, start, context=context, ts=f"{day}T08:00:00Z"
    )
    entries = []
    for i in range(2):
        said = {"item": {"role": "user", "content": f"question {i} in {context}"}}
        reply = {"item": {"role": "assistant", "content": f"answer {i} 🐍 <&>"}}
        entries.append(NewEntry("user_input", f"{day}T09:0{i}:00Z", said))
        entries.append(NewEntry("item", f"{day}T09:0{i}:01.25Z", reply))
    store.append(session_id, segment_id, entries)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A filesystem store holding every session of :data:`SESSIONS`."""
    with FsStore(tmp_path / "store") as store:
        for context, (day, _) in SESSIONS.items():
            _converse(store, context, day)
    return tmp_path / "store"


def invoke(*args: str) -> Result:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def export_all(storage: Path, dest: Path) -> Result:
    return invoke(
        "export", "--all", "-f", "terrarium-json", "--storage-dir", str(storage), "-o", str(dest)
    )


def files_of(dest: Path) -> dict[str, bytes]:
    """Every file the export wrote, by its ``/``-separated relative path."""
    if dest.name.endswith(".zip"):
        with zipfile.ZipFile(dest) as archive:
            return {name: archive.read(name) for name in archive.namelist()}
    if dest.name.endswith(".tar.gz"):
        with tarfile.open(dest, "r:gz") as archive:
            out = {}
            for member in archive.getmembers():
                handle = archive.extractfile(member)
                assert handle is not None
                out[member.name] = handle.read()
            return out
    return {
        p.relative_to(dest).as_posix(): p.read_bytes()
        for p in sorted(dest.rglob("*"))
        if p.is_file() and not p.relative_to(dest).parts[0].startswith(".")
    }


@pytest.mark.parametrize("name", ["sessions", "sessions.zip", "sessions.tar.gz"])
def test_the_three_outputs_have_exactly_the_seed_paths(
    root: Path, tmp_path: Path, name: str
) -> None:
    dest = tmp_path / "out" / name
    export_all(root, dest)
    files = files_of(dest)
    assert sorted(files) == SEED_PATHS
    with FsStore(root) as store:
        for context, (_, path) in SESSIONS.items():
            assert files[path].decode() == terrarium_json.export_context(store, context)
            data = json.loads(files[path])
            assert data["session_id"] == context.split(":", 1)[1]  # the raw name, not encoded
            assert data["metadata"]["session_date"] == path.split("/")[1]


def test_member_name_follows_the_format() -> None:
    assert (
        member_name("irc:#python", "terrarium-json", "2025-11-06") == "irc/2025-11-06/#python.json"
    )
    assert member_name("irc:#python", "terrarium-json") == "irc/#python.json"  # no date known
    assert member_name("irc:#python", "markdown", "2025-11-06") == "irc/#python.md"  # not dated
    assert (
        member_name("web:what?*", "terrarium-json", "2025-11-06")
        == "web/2025-11-06/what%3F%2A.json"
    )


def test_the_folder_reads_in_place_as_legacy_files(root: Path, tmp_path: Path) -> None:
    dest = tmp_path / "sessions"
    export_all(root, dest)
    listed = json.loads(invoke("list", "--json", "--storage-dir", str(dest)).stdout)["contexts"]
    assert sorted(row["context_id"] for row in listed) == sorted(SESSIONS)
    for row in listed:
        day, path = SESSIONS[row["context_id"]]
        assert row["legacy"] is True and row["problem"] is None
        assert row["legacy_path"] == str(dest / path)
        assert (row["date"], row["message_count"]) == (day, 4)
    for context in SESSIONS:
        shown = json.loads(invoke("show", context, "--json", "--storage-dir", str(dest)).stdout)
        assert shown["legacy"] is True
        assert shown["system_prompt"] == f"You talk in {context}."
        assert [(m["role"], m["content"]) for m in shown["messages"]] == [
            (role, text)
            for i in range(2)
            for role, text in (
                ("user", f"question {i} in {context}"),
                ("assistant", f"answer {i} 🐍 <&>"),
            )
        ]


@pytest.mark.parametrize("name", ["sessions", "sessions.zip", "sessions.tar.gz"])
def test_round_trip_is_byte_identical_apart_from_last_active(
    root: Path, tmp_path: Path, name: str
) -> None:
    first = tmp_path / "first"
    export_all(root, first)
    again = tmp_path / "again" / name
    export_all(first, again)  # read in place, as legacy files
    before, after = files_of(first), files_of(again)
    assert sorted(after) == sorted(before) == SEED_PATHS
    for path, data in before.items():
        assert LAST_ACTIVE.sub(b"", after[path]) == LAST_ACTIVE.sub(b"", data), path


def test_legacy_files_come_back_where_they_lay(root: Path, tmp_path: Path) -> None:
    """A seed file beside the store is exported to its own path, unchanged; the log's too.

    Its date folder is kept even where it is not the UTC date of ``created_at``.
    """
    said = [
        ("user", "Hello!", "2025-11-04T23:59:00.000001"),
        ("assistant", "Hi.", "2025-11-05T00:00:02.5"),
    ]
    messages = [{"role": r, "content": c, "timestamp": t} for r, c, t in said]
    names = {"session_id": "morning_chat", "context_type": "cli"}
    metadata = {"created_at": said[0][2], "last_active": said[-1][2], "message_count": 2}
    seed = {
        **names,
        "system_prompt": "You are helpful.",
        "messages": messages,
        "metadata": {**metadata, **names, "session_date": "2025-11-04", "owner": "kept"},
    }
    text = terrarium_json.dumps(seed).encode()
    path = "cli/2025-11-04/morning_chat.json"
    (root / path).parent.mkdir()
    (root / path).write_bytes(text)
    dest = tmp_path / "out.zip"
    export_all(root, dest)
    files = files_of(dest)
    assert sorted(files) == sorted([*SEED_PATHS, path])
    assert files[path] == text


def test_other_formats_keep_their_names_and_see_legacy_files(root: Path, tmp_path: Path) -> None:
    (root / "irc" / "2025-11-01").mkdir(parents=True)
    seed = {"session_id": "#linux", "context_type": "irc", "system_prompt": "", "messages": []}
    (root / "irc" / "2025-11-01" / "#linux.json").write_text(json.dumps(seed), encoding="utf-8")
    with FsStore(root) as store:
        result = export_many(store, None, "markdown", tmp_path / "md", type="irc")
    assert result.members == ["irc/#linux.md", "irc/#python.md"]
