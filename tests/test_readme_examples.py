"""Every Python block of the README runs as written, one after another, as a reader pastes
them into one Python session: in an empty folder, against the test model server over real
HTTP (the only change made to a block is the server's address, ``http://localhost:8000``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fakeserver import FakeServer

README = Path(__file__).resolve().parents[1] / "README.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", README.read_text(encoding="utf-8"), re.M | re.S)
ADDRESS = "http://localhost:8000"


def test_the_readme_has_its_examples() -> None:
    """The manager, the session and the log layer each have a block."""
    assert any("MultiContextManager" in block for block in BLOCKS)
    assert any("PersistentSession" in block for block in BLOCKS)
    assert any("create_segment" in block for block in BLOCKS)


@pytest.mark.parametrize("index", range(len(BLOCKS)), ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_each_block_compiles_as_a_script(index: int) -> None:
    """No top-level ``await``: each block is a script as it stands (SyntaxError otherwise)."""
    compile(BLOCKS[index], f"{README}:block{index}", "exec")


def test_the_blocks_run_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_server: FakeServer
) -> None:
    """One namespace, one folder: no block trips over another's sessions (``cli:main`` made
    twice was ContextExists), and each runs to its end."""
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {"__name__": "__readme__"}
    for index, block in enumerate(BLOCKS):
        code = block.replace(ADDRESS, fake_server.root_url)
        exec(compile(code, f"{README}:block{index}", "exec"), namespace)
    assert any("What's a decorator?" in str(r.get("messages")) for r in fake_server.requests)
