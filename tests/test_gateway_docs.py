"""Every Python block of docs/gateway.md runs as written, in order, against a real gateway
in front of the test model server (the only change: the gateway's address)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from fakeserver import FakeServer
from helpers.gateway import GatewayProcess

DOC = Path(__file__).resolve().parents[1] / "docs" / "gateway.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```$", DOC.read_text(encoding="utf-8"), re.M | re.S)
ADDRESS = "http://localhost:8100/v1"


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[tuple[FakeServer, GatewayProcess]]:
    with FakeServer(models=["Qwen/Qwen3-8B"]) as fake:
        with GatewayProcess(tmp_path / "sessions", fake.base_url) as process:
            yield fake, process


def test_the_doc_shows_every_api() -> None:
    text = "".join(BLOCKS)
    for needle in (
        "previous_response_id",
        "stream=True",
        "conversations.create",
        "Runner.run",
        "OpenAIConversationsSession",
        "X-Session-Id",
    ):
        assert needle in text, needle


def test_the_blocks_run_in_order(
    gateway: tuple[FakeServer, GatewayProcess], capsys: pytest.CaptureFixture[str]
) -> None:
    fake, process = gateway
    namespace: dict[str, object] = {"__name__": "__gateway_doc__"}
    for index, block in enumerate(BLOCKS):
        assert ADDRESS in block or index > 0, "the first block makes the client"
        exec(compile(block.replace(ADDRESS, process.url), f"{DOC}:block{index}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "echo: Name a prime number." in out and "echo: And the next one?" in out
    assert "echo: Hi there" in out
    roles = [m["role"] for m in fake.requests[1]["messages"]]
    assert roles == ["user", "assistant", "user"]  # the second response continued the first
