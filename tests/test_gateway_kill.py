"""SIGKILL of ``terrarium gateway`` between requests, mid-stream and under load, on the
filesystem, SQLite and PostgreSQL; after a restart every response a client saw completed is
retrievable and can be continued."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from fakeserver import FakeServer
from helpers.gateway import GatewayProcess
from pg import empty_default_schema, own_database, pg_database  # noqa: F401  (a fixture)

MODEL = "fake-model"


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with FakeServer() as server:
        yield server


@pytest.fixture(scope="module")
def pg_own(pg_database: str) -> Iterator[str]:  # noqa: F811
    """A database of this module's own (the command line's store is its default schema)."""
    yield from own_database(pg_database)


@pytest.fixture(params=["fs", "sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'gateway.db'}"
    if request.param == "postgres":
        return empty_default_schema(request.getfixturevalue("pg_own"))
    return str(tmp_path / "sessions")


def check_all(gw: GatewayProcess, completed: dict[str, str]) -> None:
    """Every completed response is there, as it was, and continues."""
    with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as client:
        for response_id, text in completed.items():
            assert client.responses.retrieve(response_id).output_text == text
            more = client.responses.create(
                model=MODEL, input="more", previous_response_id=response_id
            )
            assert more.output_text == "echo: more"


def test_a_kill_between_requests_loses_nothing(fake: FakeServer, storage: str) -> None:
    completed: dict[str, str] = {}
    with GatewayProcess(storage, fake.base_url) as gw:
        with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as client:
            previous = None
            for n in range(5):
                r = client.responses.create(
                    model=MODEL, input=f"turn {n}", previous_response_id=previous
                )
                completed[r.id] = r.output_text
                previous = r.id
            conv = client.conversations.create(items=[{"role": "user", "content": "kept"}])
        gw.kill()
    with GatewayProcess(storage, fake.base_url) as gw:
        check_all(gw, completed)
        with openai.OpenAI(base_url=gw.url, api_key="x") as client:
            items = list(client.conversations.items.list(conv.id))
            assert [i.content[0].text for i in items] == ["kept"]  # type: ignore[union-attr]


def test_a_kill_mid_stream_loses_no_completed_response(fake: FakeServer, storage: str) -> None:
    completed: dict[str, str] = {}
    with GatewayProcess(storage, fake.base_url) as gw:
        with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as client:
            first = client.responses.create(model=MODEL, input="before")
            completed[first.id] = first.output_text
            fake.chunk_delay = 0.3
            seen: list[str] = []
            with pytest.raises(openai.APIError):  # the stream is cut by the kill
                with client.responses.create(
                    model=MODEL, input="cut", previous_response_id=first.id, stream=True
                ) as stream:
                    for event in stream:
                        seen.append(event.type)
                        if event.type == "response.output_text.delta":
                            gw.kill()
            assert "response.completed" not in seen
            fake.chunk_delay = 0.0
    with GatewayProcess(storage, fake.base_url) as gw:
        check_all(gw, completed)


def test_a_kill_under_load_keeps_every_acknowledged_response(
    fake: FakeServer, storage: str
) -> None:
    """Eight clients chain responses until the kill; each one acknowledged is kept."""
    completed: dict[str, str] = {}
    lock = threading.Lock()
    with GatewayProcess(storage, fake.base_url) as gw:

        def client_loop(n: int) -> None:
            with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as client:
                previous = None
                for turn in range(1000):
                    try:
                        r = client.responses.create(
                            model=MODEL, input=f"{n}/{turn}", previous_response_id=previous
                        )
                    except openai.APIError:
                        return
                    with lock:
                        completed[r.id] = r.output_text
                    previous = r.id

        threads = [threading.Thread(target=client_loop, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with lock:
                if len(completed) >= 40:
                    break
            time.sleep(0.01)
        gw.kill()
        for thread in threads:
            thread.join(30)
    with GatewayProcess(storage, fake.base_url) as gw:
        check_all(gw, completed)


def test_a_copied_store_serves_the_same_ids(fake: FakeServer, tmp_path: Path) -> None:
    """Ids live in the log: ``terrarium copy`` to another backend takes them along."""
    from click.testing import CliRunner

    from terrarium.cli import cli

    source, copy = str(tmp_path / "sessions"), f"sqlite:///{tmp_path / 'copy.db'}"
    with GatewayProcess(source, fake.base_url) as gw:
        with openai.OpenAI(base_url=gw.url, api_key="x", max_retries=0) as client:
            first = client.responses.create(model=MODEL, input="copy me")
            completed = {first.id: first.output_text}
            conv = client.conversations.create(items=[{"role": "user", "content": "kept"}])
    copied = CliRunner().invoke(cli, ["copy", source, copy], catch_exceptions=False)
    assert copied.exit_code == 0, copied.output
    with GatewayProcess(copy, fake.base_url) as gw:
        check_all(gw, completed)
        with openai.OpenAI(base_url=gw.url, api_key="x") as client:
            assert client.conversations.retrieve(conv.id).id == conv.id
