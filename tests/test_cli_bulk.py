"""terrarium copy, and exporting many sessions at once, through the command line."""

from __future__ import annotations

import json
import os
import shlex
import stat
import tarfile
import tracemalloc
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from helpers.copies import fill, snapshot
from pg import own_database, pg_database, store_url  # noqa: F401  (a fixture)
from terrarium import FsStore, Item, SqliteStore, create_segment, restore, save_delta, states
from terrarium.bundle import MANIFEST
from terrarium.cli import cli, examples
from terrarium.errors import ContextNotFound
from terrarium.formats import jsonl
from terrarium.model import ContextId
from terrarium.stores.url import open_store


def _fill(root: Path) -> None:
    with FsStore(root) as store:
        for context in ("irc:#python", "cli:main", "game:run1"):
            create_segment(store, context=context)
            head = store.get_head(ContextId.parse(context))
            assert head is not None
            save_delta(store, head, [Item.user(f"hi from {context}"), Item.assistant("<b>hi</b>")])


def test_copy_between_stores_and_rerun(tmp_path: Path) -> None:
    """copy fs -> sqlite keeps every session; a rerun skips them all and still exits 0."""
    _fill(tmp_path / "src")
    dst = f"sqlite:///{tmp_path / 'dst.db'}"
    runner = CliRunner()
    first = runner.invoke(cli, ["copy", str(tmp_path / "src"), dst])
    assert first.exit_code == 0, first.output
    assert first.output == f"copied 3 sessions (9 lines) to {dst}\n"  # one summary line
    again = runner.invoke(cli, ["copy", str(tmp_path / "src"), dst])
    assert again.exit_code == 0
    assert again.output == f"nothing to copy: 3 sessions already in {dst}\n"
    verbose = runner.invoke(cli, ["copy", str(tmp_path / "src"), dst, "-v"])
    assert verbose.exit_code == 0
    assert verbose.output.splitlines()[:3] == [
        f"skipped {c}: already in {dst}" for c in ("cli:main", "game:run1", "irc:#python")
    ]
    with FsStore(tmp_path / "src") as src, SqliteStore(tmp_path / "dst.db") as copied:
        for head in src.list_contexts():
            assert restore(copied, head.context) == restore(src, head.context)


def test_copy_one_context_and_bad_urls(tmp_path: Path) -> None:
    """--context limits the copy; a bad store URL is a one-line error without the password."""
    _fill(tmp_path / "src")
    runner = CliRunner()
    result = runner.invoke(
        cli, ["copy", str(tmp_path / "src"), str(tmp_path / "dst"), "-c", "cli:main"]
    )
    assert result.exit_code == 0, result.output
    with FsStore(tmp_path / "dst") as dst:
        assert [h.context for h in dst.list_contexts()] == ["cli:main"]
    bad = runner.invoke(cli, ["copy", str(tmp_path / "src"), "mongodb://u:s3cret@h/db"])
    assert bad.exit_code != 0
    assert "s3cret" not in bad.output
    assert len(bad.output.strip().splitlines()) == 1


def test_copy_of_a_context_the_source_lacks_is_a_one_line_error(tmp_path: Path) -> None:
    """A named context the source does not hold: exit 1, one line naming it and the source,
    and nothing copied (not the others named with it either), as export and archive do."""
    _fill(tmp_path / "src")
    src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
    close = f"Error: no session 'cli:mian' in {src}; did you mean cli:main?\n"
    for named, error in [
        (["cli:nope"], f"Error: no session 'cli:nope' in {src}\n"),
        (["cli:main", "cli:mian"], close),
    ]:
        args = [arg for context in named for arg in ("-c", context)]
        result = CliRunner().invoke(cli, ["copy", src, dst, *args])
        assert (result.exit_code, result.stdout, result.stderr) == (1, "", error)
        assert not (tmp_path / "dst").exists()
    assert CliRunner().invoke(cli, ["copy", src, dst, "-c", "cli:main"]).exit_code == 0


def test_copy_of_a_named_context_gone_meanwhile_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A named context deleted after the check (its read finds none) is named; exit 1."""
    _fill(tmp_path / "src")

    def gone(*args: object, **kwargs: object) -> None:
        raise ContextNotFound("context cli:main does not exist in the source store")

    monkeypatch.setattr("terrarium.copy.read_source", gone)
    result = CliRunner().invoke(
        cli, ["copy", str(tmp_path / "src"), str(tmp_path / "dst"), "-c", "cli:main"]
    )
    assert result.exit_code == 1, result.output
    assert "skipped cli:main: context cli:main does not exist" in result.stderr


@pytest.fixture(scope="module")
def pg_own(pg_database: str) -> Iterator[str]:  # noqa: F811
    """A database of this module's own (the command line's store is its default schema)."""
    yield from own_database(pg_database)


DESTINATIONS = [
    "fs",
    "sqlite",
    pytest.param("postgres", marks=pytest.mark.postgres),
]


@pytest.mark.parametrize("kind", DESTINATIONS)
def test_copy_of_a_whole_store_takes_archived_sessions_along_archived(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """36 sessions, 4 archived, some pinned: every destination gets all 36, the 4 archived
    (read whole from its archive), the pins kept; a rerun finds all 36 (and the detached
    session) there."""
    with FsStore(tmp_path / "src") as src:
        names = fill(src, 36, archived=4)
        expected = snapshot(src)
    dst = store_url(kind, tmp_path, "dst", request)
    runner = CliRunner()
    first = runner.invoke(cli, ["copy", str(tmp_path / "src"), dst])
    assert first.exit_code == 0, first.output
    assert first.output.startswith("copied 37 sessions (")
    store = open_store(dst)
    try:
        assert sorted(a.context for a in states.archived_contexts(store)) == names[-4:]
        assert states.pinned_contexts(store) == frozenset(names[::5])
        assert snapshot(store) == expected
    finally:
        store.close()
    again = runner.invoke(cli, ["copy", str(tmp_path / "src"), dst])
    assert (again.exit_code, again.output) == (
        0,
        f"nothing to copy: 37 sessions already in {dst}\n",
    )


def test_copy_names_each_conflict_in_one_line_and_exits_1(tmp_path: Path) -> None:
    """A session the destination holds otherwise than the source is named in one line, left
    as it is, and the command exits 1; the rest is copied, and the summary counts both."""
    _fill(tmp_path / "src")
    runner = CliRunner()
    dst = tmp_path / "dst"
    assert runner.invoke(cli, ["copy", str(tmp_path / "src"), str(dst)]).exit_code == 0
    with FsStore(dst) as store:
        save_delta(store, _head(store, "cli:main"), [Item.user("only in the copy")])
        before = restore(store, "cli:main")
    with FsStore(tmp_path / "src") as src:
        save_delta(src, _head(src, "cli:main"), [Item.user("only in the source")])
        create_segment(src, context="cli:new")
    result = runner.invoke(cli, ["copy", str(tmp_path / "src"), str(dst)])
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: conflict: cli:main: segment ")
    assert lines[0].endswith(": line 3 differs from the source's; not copied")
    assert lines[1] == f"copied 1 session (1 line) to {dst}; 2 already there; 1 in conflict"
    assert len(lines) == 2
    with FsStore(dst) as store:
        assert restore(store, "cli:main") == before
        assert store.get_head(ContextId.parse("cli:new")) is not None


def test_import_completes_and_names_a_conflict(tmp_path: Path) -> None:
    """`import` of .jsonl exports: a file the store holds in part is completed, one it holds
    equal is already there, one it holds otherwise is named in one line and exits 1."""
    _fill(tmp_path / "src")
    runner = CliRunner()
    files = []
    for context in ("irc:#python", "cli:main", "game:run1"):
        path = tmp_path / f"{context.split(':')[1]}.jsonl"
        out = runner.invoke(
            cli,
            [
                "export",
                context,
                "-f",
                "jsonl",
                "-o",
                str(path),
                "--storage-dir",
                str(tmp_path / "src"),
            ],
        )
        assert out.exit_code == 0, out.output
        files.append(str(path))
    dst = tmp_path / "dst"
    lines = [json.loads(line) for line in Path(files[0]).read_text().splitlines()]
    jsonl.import_context(FsStore(dst), lines[:2])  # an import cut short: two of its lines
    with FsStore(dst) as store:
        jsonl.import_context(store, Path(files[1]).read_text())
        save_delta(store, _head(store, "cli:main"), [Item.user("more")])
    result = runner.invoke(cli, ["import", *files, "--storage-dir", str(dst)])
    assert result.exit_code == 1
    segment = json.loads(Path(files[1]).read_text().splitlines()[0])["segment_id"]
    assert result.stderr.splitlines() == [
        f"error: {files[1]}: cli:main: segment {segment} has 1 more line in the destination "
        "than the source",
        f"imported 2 sessions into {dst}; 1 failed",
        "Error: 1 of 3 files could not be imported",
    ]
    with FsStore(dst) as store:
        assert jsonl.lineage_lines(store, "irc:#python") == lines


def _head(store: FsStore, context: str) -> Any:
    head = store.get_head(ContextId.parse(context))
    assert head is not None
    return head


def test_export_many_to_folder_zip_and_tar(tmp_path: Path) -> None:
    """--all, several names or --type write one file per session into a folder or archive."""
    _fill(tmp_path / "s")
    runner = CliRunner()
    base = ["--storage-dir", str(tmp_path / "s")]
    folder = runner.invoke(
        cli, ["export", "--all", "-f", "markdown", "-o", str(tmp_path / "md"), *base]
    )
    assert folder.exit_code == 0, folder.output
    assert sorted(
        p.relative_to(tmp_path / "md").as_posix() for p in (tmp_path / "md").rglob("*.md")
    ) == [
        "cli/main.md",
        "game/run1.md",
        "irc/#python.md",
    ]
    zipped = runner.invoke(
        cli,
        ["export", "irc:#python", "cli:main", "-f", "html", "-o", str(tmp_path / "x.zip"), *base],
    )
    assert zipped.exit_code == 0, zipped.output
    with zipfile.ZipFile(tmp_path / "x.zip") as archive:
        assert sorted(archive.namelist()) == ["cli/main.html", "irc/#python.html"]
        assert "&lt;b&gt;hi&lt;/b&gt;" in archive.read("irc/#python.html").decode()
    tarred = runner.invoke(
        cli,
        [
            "export",
            "--all",
            "--type",
            "irc",
            "-f",
            "jsonl",
            "-o",
            str(tmp_path / "x.tgz"),
            *base,
        ],
    )
    assert tarred.exit_code == 0, tarred.output
    with tarfile.open(tmp_path / "x.tgz") as archive:
        assert archive.getnames() == ["terrarium-bundle.json", "irc/#python.jsonl"]


def test_export_many_needs_a_destination(tmp_path: Path) -> None:
    """Many sessions to stdout is refused in one line; no session and no --all too."""
    _fill(tmp_path / "s")
    runner = CliRunner()
    base = ["--storage-dir", str(tmp_path / "s")]
    many = runner.invoke(cli, ["export", "--all", *base])
    assert many.exit_code == 2
    assert "-o FOLDER" in many.output
    none = runner.invoke(cli, ["export", *base])
    assert none.exit_code == 2
    assert "--all" in none.output


def test_the_helps_backup_example_imports_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``terrarium export --all -f jsonl -o backup.tar.gz``, as the help writes it, is read
    back by ``import`` as it comes (archived and pinned sessions too); a rerun adds nothing."""
    _fill(tmp_path / "s")
    with FsStore(tmp_path / "s") as store:
        states.pin_context(store, ContextId.parse("cli:main"))
        states.archive_context(store, ContextId.parse("game:run1"))
    monkeypatch.chdir(tmp_path)
    example = shlex.split(examples.EXAMPLES["export"][1])
    assert example == ["terrarium", "export", "--all", "-f", "jsonl", "-o", "backup.tar.gz"]
    runner = CliRunner()
    exported = runner.invoke(cli, [*example[1:], "--storage-dir", "s"])
    assert exported.exit_code == 0, exported.output
    dst = f"sqlite:///{tmp_path / 'restored.db'}"
    imported = runner.invoke(cli, ["import", "backup.tar.gz", "--storage-dir", dst])
    assert imported.exit_code == 0, imported.output
    assert imported.output == f"imported 3 sessions into {dst}\n"
    with FsStore(tmp_path / "s") as src, SqliteStore(tmp_path / "restored.db") as copied:
        assert [h.context for h in copied.list_contexts()] == ["cli:main", "irc:#python"]
        assert [a.context for a in states.archived_contexts(copied)] == ["game:run1"]
        assert states.pinned_contexts(copied) == {"cli:main"}
        for context in ("cli:main", "irc:#python", "game:run1"):
            assert restore(copied, context) == restore(src, context)
    again = runner.invoke(cli, ["import", "backup.tar.gz", "-v", "--storage-dir", dst])
    assert again.exit_code == 0, again.output
    assert again.output.splitlines()[-1] == f"nothing to import: 3 sessions already in {dst}"


def test_import_refuses_what_is_no_bundle_and_names_a_bad_entry(tmp_path: Path) -> None:
    """An archive without a manifest is one line; a bundle with one unreadable session
    imports the others, names that one, and exits 1."""
    _fill(tmp_path / "s")
    runner = CliRunner()
    base = ["--storage-dir", str(tmp_path / "s")]
    assert (
        runner.invoke(cli, ["export", "--all", "-o", str(tmp_path / "md.zip"), *base]).exit_code
        == 0
    )
    dst = ["--storage-dir", str(tmp_path / "dst")]
    plain = runner.invoke(cli, ["import", str(tmp_path / "md.zip"), *dst])
    assert plain.exit_code == 1
    assert plain.output == (
        f"Error: {tmp_path / 'md.zip'} is not a terrarium bundle: it has no "
        "terrarium-bundle.json (write one with: terrarium export --all -f jsonl -o "
        "FILE.tar.gz)\n"
    )
    folder = tmp_path / "bundle"
    assert (
        runner.invoke(cli, ["export", "--all", "-f", "jsonl", "-o", str(folder), *base]).exit_code
        == 0
    )
    (folder / "game" / "run1.jsonl").write_text("not json\n", encoding="utf-8")
    result = runner.invoke(cli, ["import", str(folder), *dst])
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert lines[0].startswith(f"error: game:run1: {folder}:game/run1.jsonl:1: not valid JSON")
    assert lines[1:] == [
        f"imported 2 sessions into {tmp_path / 'dst'}; 1 failed",
        "Error: 1 of 3 sessions and files could not be imported",
    ]
    with FsStore(tmp_path / "dst") as restored:
        assert [h.context for h in restored.list_contexts()] == ["cli:main", "irc:#python"]


def test_a_bundle_is_never_read_outside_itself(tmp_path: Path) -> None:
    """A manifest naming ``../x`` or a symbolic link out of a bundle folder is refused for
    that session, with the reason; the file outside is not read."""
    _fill(tmp_path / "s")
    runner = CliRunner()
    folder = tmp_path / "bundle"
    args = [
        "export",
        "--all",
        "-f",
        "jsonl",
        "-o",
        str(folder),
        "--storage-dir",
        str(tmp_path / "s"),
    ]
    assert runner.invoke(cli, args).exit_code == 0
    outside = tmp_path / "outside.jsonl"
    outside.write_bytes((folder / "cli" / "main.jsonl").read_bytes())  # a good file, outside
    manifest = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))
    manifest["contexts"][0]["file"] = "../outside.jsonl"  # cli:main's
    (folder / MANIFEST).write_text(json.dumps(manifest), encoding="utf-8")
    (folder / "irc" / "#python.jsonl").unlink()
    (folder / "irc" / "#python.jsonl").symlink_to(outside)
    result = runner.invoke(cli, ["import", str(folder), "--storage-dir", str(tmp_path / "dst")])
    assert result.exit_code == 1
    assert result.output.splitlines()[:2] == [
        f"error: cli:main: {folder}: the manifest names a file outside it: '../outside.jsonl'",
        f"error: irc:#python: {folder}: irc/#python.jsonl is a link out of the bundle: not read",
    ]
    with FsStore(tmp_path / "dst") as restored:
        assert [h.context for h in restored.list_contexts()] == ["game:run1"]


def _retar(source: Path, dest: Path, link: str) -> None:
    """``source``'s members into ``dest``, ``link`` made a symbolic link to /etc/passwd."""
    with tarfile.open(source, "r:gz") as old, tarfile.open(dest, "w:gz") as new:
        for info in old.getmembers():
            if info.name == link:
                info.type, info.linkname, info.size = tarfile.SYMTYPE, "/etc/passwd", 0
                new.addfile(info)
            else:
                new.addfile(info, old.extractfile(info))


def test_a_tar_bundle_names_a_link_member_and_an_archive_cut_short(tmp_path: Path) -> None:
    """A member that is a link is refused for its session as a link, not as missing; an
    archive cut short says so, not that it has no manifest; neither imports anything."""
    _fill(tmp_path / "s")
    runner = CliRunner()
    whole = tmp_path / "whole.tar.gz"
    args = ["export", "--all", "-f", "jsonl", "-o", str(whole), "--storage-dir"]
    assert runner.invoke(cli, [*args, str(tmp_path / "s")]).exit_code == 0
    linked = tmp_path / "linked.tar.gz"
    _retar(whole, linked, "irc/#python.jsonl")
    dst = ["--storage-dir", str(tmp_path / "dst")]
    result = runner.invoke(cli, ["import", str(linked), *dst])
    assert result.exit_code == 1
    assert result.output.splitlines()[0] == (
        f"error: irc:#python: {linked}: irc/#python.jsonl is not a regular file: not read"
    )
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(whole.read_bytes()[: whole.stat().st_size * 3 // 4])
    with FsStore(tmp_path / "dst") as store:
        before = snapshot(store)
    result = runner.invoke(cli, ["import", str(cut), *dst])
    assert result.exit_code == 1
    assert result.output == (
        f"Error: {cut}: {MANIFEST}: Compressed file ended before the end-of-stream marker "
        "was reached\n"
    )
    with FsStore(tmp_path / "dst") as store:
        assert snapshot(store) == before


def test_a_legacy_file_beside_the_store_goes_into_the_bundle(tmp_path: Path) -> None:
    """``--all`` takes the sessions ``list`` shows, legacy files too: they come back in the
    log."""
    _fill(tmp_path / "s")
    legacy = tmp_path / "s" / "cli" / "2025-11-06" / "old.json"
    legacy.parent.mkdir(parents=True)
    messages = [{"role": "user", "content": "from the seed", "timestamp": "2025-11-06T10:00:00"}]
    legacy.write_text(
        json.dumps({"session_id": "old", "context_type": "cli", "messages": messages})
    )
    runner = CliRunner()
    args = ["export", "--all", "-f", "jsonl", "-o", str(tmp_path / "b.zip")]
    assert runner.invoke(cli, [*args, "--storage-dir", str(tmp_path / "s")]).exit_code == 0
    result = runner.invoke(
        cli, ["import", str(tmp_path / "b.zip"), "--storage-dir", str(tmp_path / "dst")]
    )
    assert result.exit_code == 0, result.output
    with FsStore(tmp_path / "dst") as restored:
        assert "cli:old" in [h.context for h in restored.list_contexts()]
        assert [m["content"] for m in restore(restored, "cli:old").history] == ["from the seed"]


def test_export_many_into_a_file_name_is_refused_in_one_line(tmp_path: Path) -> None:
    """``-o single.md`` with several sessions is one line and exit 1, and makes nothing (not
    a folder named single.md); a name ending in / is a folder, whatever its dots."""
    _fill(tmp_path / "s")
    runner = CliRunner()
    base = ["--storage-dir", str(tmp_path / "s")]
    for selection in (["cli:main", "irc:#python"], ["--all"], ["--all", "--type", "cli"]):
        dest = tmp_path / "single.md"
        result = runner.invoke(cli, ["export", *selection, "-o", str(dest), *base])
        assert result.exit_code == 1, result.output
        assert result.output == (
            f"Error: {dest} is not a folder or an archive: many sessions go into a folder "
            f"(write {dest}/ to make one), a .zip, a .tar.gz or a .tgz\n"
        )
        assert not dest.exists()
    (tmp_path / "taken.md").write_text("mine", encoding="utf-8")
    result = runner.invoke(cli, ["export", "--all", "-o", str(tmp_path / "taken.md"), *base])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert (tmp_path / "taken.md").read_text(encoding="utf-8") == "mine"
    dotted = runner.invoke(cli, ["export", "--all", "-o", f"{tmp_path / 'v1.2'}/", *base])
    assert dotted.exit_code == 0, dotted.output
    assert (tmp_path / "v1.2" / "cli" / "main.md").is_file()


def test_export_errors_name_the_file_the_user_gave(tmp_path: Path) -> None:
    """A write that fails names ``-o``'s file and the reason, without ``[Errno N]``: not the
    temporary file written first, and not nothing (a full disk's error names no file)."""
    _fill(tmp_path / "s")
    runner = CliRunner()
    base = ["--storage-dir", str(tmp_path / "s")]
    long = tmp_path / ("x" * 300 + ".tar.gz")
    result = runner.invoke(cli, ["export", "--all", "-o", str(long), *base])
    assert result.exit_code == 1
    assert result.output == f"Error: {long}: File name too long\n"
    if Path("/dev/full").is_char_device():
        result = runner.invoke(cli, ["export", "cli:main", "-o", "/dev/full", *base])
        assert result.output == "Error: /dev/full: No space left on device\n"


def test_finetune_export_into_a_pipe_writes_into_it(tmp_path: Path) -> None:
    """``-f finetune -o /dev/stdout`` (here a named pipe): the lines go into the pipe, which is
    still one; before, the pipe was replaced by a regular file (as root, /dev/stdout too)."""
    _fill(tmp_path / "s")
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    reader = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)  # so the export's open never waits
    args = ["export", "--all", "-f", "finetune", "-o", str(pipe), "--storage-dir"]
    try:
        result = CliRunner().invoke(cli, [*args, str(tmp_path / "s")])
        assert result.exit_code == 0, result.output
        assert stat.S_ISFIFO(pipe.stat().st_mode)
        got = [os.read(reader, 1 << 16)]
    finally:
        os.close(reader)
    assert [json.loads(line)["messages"][0]["role"] for line in got[0].splitlines()] == ["user"] * 3


def test_search_command_plain_json_and_bad_queries(tmp_path: Path) -> None:
    """search prints hits with [highlights]; --json is structured; SQL and FTS syntax is data."""
    _fill(tmp_path / "s")
    runner = CliRunner()
    base = ["--storage-dir", str(tmp_path / "s")]
    plain = runner.invoke(cli, ["search", "python", *base])
    assert plain.exit_code == 0, plain.output
    assert plain.output.splitlines()[0].startswith("irc:#python")
    assert "[python]" in plain.output
    data = json.loads(
        runner.invoke(cli, ["search", "hi", "--json", "--role", "user", *base]).output
    )
    assert sorted(hit["context_id"] for hit in data["hits"]) == [
        "cli:main",
        "game:run1",
        "irc:#python",
    ]
    hit = data["hits"][0]
    start, end = hit["highlights"][0]
    assert hit["snippet"][start:end].lower() == "hi"
    for hostile in ['"', "NEAR(", "'; DROP TABLE docs; --", "a* OR b"]:
        result = runner.invoke(cli, ["search", hostile, *base])
        assert result.exit_code in (0, 1), result.output
        assert "Traceback" not in result.output
    empty = runner.invoke(cli, ["search", "*", *base])
    assert empty.exit_code == 1
    assert len(empty.output.strip().splitlines()) == 1
    with FsStore(tmp_path / "s") as store:
        assert len(restore(store, "irc:#python").history) == 2  # nothing was dropped


def test_search_numbers_hits_by_message_and_marks_other_branches(tmp_path: Path) -> None:
    """A hit is numbered by its place in the conversation (not its entry's seq); a cleared
    message is found only with --all-branches, marked off; --json has message and branch."""
    from terrarium.sessions import clear_segment

    with FsStore(tmp_path / "s") as store:
        for context, items in [
            ("cli:a", [Item.user("hello"), Item.assistant("a walrus"), Item.user("x")]),
            ("cli:b", [Item.user("first"), Item.user("second walrus")]),
        ]:
            create_segment(store, context=context)
            head = store.get_head(ContextId.parse(context))
            assert head is not None
            save_delta(store, head, items)
        clear_segment(store, restore(store, "cli:a"), context="cli:a")
    runner = CliRunner()
    base = ["--storage-dir", str(tmp_path / "s")]
    plain = runner.invoke(cli, ["search", "walrus", *base])
    assert plain.exit_code == 0, plain.output
    assert plain.output.splitlines()[0].endswith("user  #1")
    assert "cli:a" not in plain.output
    every = runner.invoke(cli, ["search", "walrus", "--all-branches", *base])
    lines = [line for line in every.output.splitlines() if line.startswith("cli:a")]
    assert len(lines) == 1 and "(not on the current branch: segment " in lines[0], every.output
    data = json.loads(
        runner.invoke(cli, ["search", "walrus", "--all-branches", "--json", *base]).output
    )
    assert sorted((h["context_id"], h["message"], h["branch"]) for h in data["hits"]) == [
        ("cli:a", None, "off"),
        ("cli:b", 1, "head"),
    ]


@pytest.mark.parametrize("kind", ["folder", "zip", "tar.gz"])
def test_a_bundle_member_past_the_limit_is_refused_and_a_rerun_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """A session file larger than the limit fails that session with the limit named, before
    it is read; the others are imported, and a rerun with a higher limit completes."""
    _fill(tmp_path / "s")
    with FsStore(tmp_path / "s") as store:
        head = store.get_head(ContextId.parse("cli:main"))
        assert head is not None
        save_delta(store, head, [Item.user("y" * 40_000)])
    output = tmp_path / ("bundle" if kind == "folder" else f"b.{kind}")
    args = ["export", "--all", "-f", "jsonl", "-o", str(output), "--storage-dir"]
    assert CliRunner().invoke(cli, [*args, str(tmp_path / "s")]).exit_code == 0
    dst = ["--storage-dir", str(tmp_path / "dst")]
    monkeypatch.setenv("TERRARIUM_IMPORT_MAX_MEMBER", "20000")
    result = CliRunner().invoke(cli, ["import", str(output), *dst])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (
        f"error: cli:main: {output}: cli/main.jsonl is larger than the 20,000 bytes an import "
        "reads of one file: not read ($TERRARIUM_IMPORT_MAX_MEMBER sets the limit; an import "
        "takes about 3 times it in memory)"
    )
    with FsStore(tmp_path / "dst") as restored:
        assert [h.context for h in restored.list_contexts()] == ["game:run1", "irc:#python"]
    monkeypatch.setenv("TERRARIUM_IMPORT_MAX_MEMBER", "60000")
    again = CliRunner().invoke(cli, ["import", str(output), *dst])
    assert again.exit_code == 0, again.output
    assert again.stderr == f"imported 1 session into {tmp_path / 'dst'}; 2 already there\n"
    monkeypatch.setenv("TERRARIUM_IMPORT_MAX_MEMBER", "lots")
    bad = CliRunner().invoke(cli, ["import", str(output), *dst])
    assert bad.exit_code == 1
    assert bad.stderr.endswith(
        "$TERRARIUM_IMPORT_MAX_MEMBER must be a positive number of bytes, not 'lots'\n"
    )


def test_a_plain_jsonl_file_past_the_limit_is_refused_unread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``import FILE.jsonl`` (one session, not a bundle) keeps the limit a bundle's member
    has: a larger file fails with the limit named, before it is read; other files of the same
    import go in, and a higher limit imports it."""
    _fill(tmp_path / "s")
    with FsStore(tmp_path / "s") as store:
        head = store.get_head(ContextId.parse("cli:main"))
        assert head is not None
        save_delta(store, head, [Item.user("y" * 40_000)])
    big, small = tmp_path / "big.jsonl", tmp_path / "small.jsonl"
    for context, file in (("cli:main", big), ("game:run1", small)):
        args = ["export", context, "-f", "jsonl", "-o", str(file)]
        assert CliRunner().invoke(cli, [*args, "--storage-dir", str(tmp_path / "s")]).exit_code == 0
    dst = ["--storage-dir", str(tmp_path / "dst")]
    monkeypatch.setenv("TERRARIUM_IMPORT_MAX_MEMBER", "20000")
    result = CliRunner().invoke(cli, ["import", str(big), str(small), *dst])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == (
        f"error: {big}: {big} is larger than the 20,000 bytes an import reads of one file: "
        "not read ($TERRARIUM_IMPORT_MAX_MEMBER sets the limit; an import takes about 3 times "
        "it in memory)"
    )
    with FsStore(tmp_path / "dst") as restored:
        assert [h.context for h in restored.list_contexts()] == ["game:run1"]
    monkeypatch.setenv("TERRARIUM_IMPORT_MAX_MEMBER", "60000")
    again = CliRunner().invoke(cli, ["import", str(big), *dst])
    assert again.exit_code == 0, again.output
    with FsStore(tmp_path / "dst") as restored:
        assert [h.context for h in restored.list_contexts()] == ["cli:main", "game:run1"]


def test_a_legacy_json_file_past_the_limit_is_refused_on_import_but_shown_in_a_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``import FILE.json`` (a legacy seed file) keeps the limit a .jsonl file has, with the
    same one-line error; the same file lying in a sessions folder is existing data, and
    ``show`` still reads it."""
    session = {"session_id": "big", "messages": [{"role": "user", "content": "y" * 40_000}]}
    big = tmp_path / "old" / "cli" / "big.json"
    big.parent.mkdir(parents=True)
    big.write_text(json.dumps(session))
    monkeypatch.setenv("TERRARIUM_IMPORT_MAX_MEMBER", "20000")
    result = CliRunner().invoke(cli, ["import", str(big), "--storage-dir", str(tmp_path / "dst")])
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: {big} is larger than the 20,000 bytes an import reads of one file: not read "
        "($TERRARIUM_IMPORT_MAX_MEMBER sets the limit; an import takes about 3 times it in "
        "memory)\n"
    )
    shown = CliRunner().invoke(cli, ["show", "cli:big", "--storage-dir", str(tmp_path / "old")])
    assert shown.exit_code == 0, shown.output
    assert "y" * 100 in shown.stdout
    monkeypatch.setenv("TERRARIUM_IMPORT_MAX_MEMBER", "60000")
    again = CliRunner().invoke(cli, ["import", str(big), "--storage-dir", str(tmp_path / "dst")])
    assert again.exit_code == 0, again.output


def test_a_zip_bomb_member_is_refused_without_being_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 64 MiB member that compresses to almost nothing is refused by its size: the import
    allocates a small part of it (before, it read it whole)."""
    _fill(tmp_path / "s")
    exported = tmp_path / "exported.zip"
    args = ["export", "--all", "-f", "jsonl", "-o", str(exported), "--storage-dir"]
    assert CliRunner().invoke(cli, [*args, str(tmp_path / "s")]).exit_code == 0
    with (
        zipfile.ZipFile(exported) as old,
        zipfile.ZipFile(tmp_path / "b.zip", "w", zipfile.ZIP_DEFLATED) as new,
    ):
        manifest = json.loads(old.read(MANIFEST))
        manifest["contexts"].append({"context": "cli:bomb", "file": "bomb.jsonl", "head": "x"})
        new.writestr(MANIFEST, json.dumps(manifest))
        for info in old.infolist()[1:]:
            new.writestr(info, old.read(info))
        with new.open("bomb.jsonl", "w") as member:
            for _ in range(64):
                member.write(b" " * 2**20)
    assert (tmp_path / "b.zip").stat().st_size < 2**20
    monkeypatch.setenv("TERRARIUM_IMPORT_MAX_MEMBER", str(2**20))
    tracemalloc.start()
    try:
        result = CliRunner().invoke(
            cli, ["import", str(tmp_path / "b.zip"), "--storage-dir", str(tmp_path / "dst")]
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20
    assert result.exit_code == 1
    assert "error: cli:bomb: " in result.stderr and "bomb.jsonl is larger than" in result.stderr
