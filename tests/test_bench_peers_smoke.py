"""The peers benchmark runs end to end at tiny depths. No timing is asserted: that is its job."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PEERS = (
    "openai-agents SQLiteSession",
    "LangChain SQLChatMessageHistory",
    "LangChain FileChatMessageHistory",
    "LangGraph SqliteSaver",
    "llm LogStore",
)
# Packages of the bench extra; the test hides them, as on a machine with only `dev` installed.
HIDDEN = ("agents", "langchain_community", "langchain_core", "langgraph", "llm", "sqlite_utils")


def run_quick(tmp_path: Path, hidden: bool) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path / "report"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    if hidden:
        blocked = tmp_path / "blocked"
        for name in HIDDEN:
            (blocked / name).mkdir(parents=True)
            (blocked / name / "__init__.py").write_text(
                f"raise ImportError('hidden by the smoke test', name={name!r})\n"
            )
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(blocked), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "peers.py"), "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=280,
        env=env,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result, out


def rows(report: str, section: str, which: int = 0) -> dict[str, list[str]]:
    """The rows of a section's first (or ``which``-th) table, by system name."""
    part = report.split(f"## {section}", 1)[1].split("\n## ", 1)[0]
    tables = [t for t in part.split("\n\n") if t.startswith("| ")]
    cells = [line.strip("|").split("|") for line in tables[which].splitlines()]
    return {c[0].strip(): [x.strip() for x in c[1:]] for c in cells[2:]}


def test_bench_peers_quick_without_the_bench_extra(tmp_path: Path) -> None:
    """With the peers' packages missing, peers.py still measures the floors, terrarium and
    the seed design, names each peer as not installed, and writes only under --out."""
    result, out = run_quick(tmp_path, hidden=True)
    report = (out / "benchmarks.md").read_text(encoding="utf-8")
    for section in ("Append one message", "Restore the whole conversation", "Bytes on disk"):
        table = rows(report, section)
        for name in (
            "floor: os.write / read + decode_lines",
            "floor: SQLite INSERT / SELECT + decode",
            "terrarium FsStore",
            "terrarium SqliteStore",
            "seed: rewrite the whole JSON",
        ):
            assert name in table, (section, name)
            assert table[name][0] not in ("", "-", "skipped"), (section, name)
        assert table["terrarium FsStore"][2] == "1.00x"
        assert table["floor: os.write / read + decode_lines"][1] == "1.00x"
    tails = rows(report, "Append one message", 1)
    assert set(tails) == {
        "floor: os.write / read + decode_lines",
        "floor: SQLite INSERT / SELECT + decode",
        "terrarium FsStore",
        "terrarium SqliteStore",
    } | ({"terrarium PostgresStore"} & set(tails))
    apart = rows(report, "Bytes on disk", 1)
    assert apart["terrarium FsStore"][1] == "1.00x"
    assert {"terrarium FsStore", "terrarium SqliteStore"} <= set(apart)
    for name, cells in apart.items():
        assert cells[0].endswith("B") and cells[2].endswith("B"), name  # log, search index
        for peer in PEERS:
            assert peer not in table, peer
    for peer in PEERS:
        assert f"- {peer}: not measured, not installed" in report, peer
    assert "pip install -e '.[bench]'" in report
    assert "Load average" in report and "Machine:" in report
    if importlib.util.find_spec("matplotlib") is not None:
        assert (out / "benchmarks-append.png").stat().st_size > 0
        assert (out / "benchmarks-restore.png").stat().st_size > 0
        assert "![benchmarks-append.png](benchmarks-append.png)" in report
    else:
        assert "plots not drawn: matplotlib is not installed" in report
    assert result.stdout.strip(), "the report is printed too"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blocked", "report"], (
        "a temporary directory is left behind"
    )


def test_bench_peers_quick_with_what_is_installed(tmp_path: Path) -> None:
    """Each peer is either measured or named as not installed: none fails the run."""
    _, out = run_quick(tmp_path, hidden=False)
    report = (out / "benchmarks.md").read_text(encoding="utf-8")
    table = rows(report, "Append one message")
    for peer in PEERS:
        measured = peer in table and table[peer][0] not in ("", "-", "skipped")
        assert measured or f"- {peer}: not measured, not installed" in report, peer
    assert "terrarium FsStore" in table
