"""Every Python block of docs/integrations.md runs, as a reader would paste it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "integrations.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.M | re.S)


def test_the_page_has_examples() -> None:
    """Each integration has at least one runnable example."""
    assert len(BLOCKS) >= 1
    assert any("TerrariumSession" in block for block in BLOCKS)
    assert any("TerrariumSaver" in block for block in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_example_runs(
    block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The block runs to its end (its own asserts included) in an empty folder."""
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(DOC), "exec"), {"__name__": "__docs__"})
    assert capsys.readouterr().out.strip()
