"""``terrarium serve``: refuses an unreadable store at start, needs a token off loopback, and
enforces it (a real server process, driven with httpx); takes the model options, contacts no
model at start, and compacts through the store it was given."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from starlette.testclient import TestClient

from fakeserver import FakeServer
from helpers.web import long_turns, seed
from terrarium import FsStore
from terrarium.cli import cli
from terrarium.cli.serve import required_token
from terrarium.model import ContextId
from terrarium.sessions import restore
from terrarium.web import ModelAccess


def test_a_missing_store_is_one_line_and_nothing_is_created(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    result = CliRunner().invoke(cli, ["serve", "--storage-dir", str(missing)])
    assert result.exit_code == 1
    assert "no store" in result.output and len(result.output.strip().splitlines()) == 1
    assert not missing.exists()


def test_an_unreadable_sqlite_file_is_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.db"
    bad.write_bytes(b"this is not a database" * 100)
    result = CliRunner().invoke(cli, ["serve", "--storage-dir", f"sqlite:///{bad}"])
    assert result.exit_code != 0
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_an_empty_token_is_refused(tmp_path: Path) -> None:
    FsStore(tmp_path / "s").close()
    result = CliRunner().invoke(
        cli, ["serve", "--storage-dir", str(tmp_path / "s"), "--token", " "]
    )
    assert result.exit_code == 2 and "token" in result.output


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("127.0.0.2", True),
        ("0.0.0.0", False),
        ("192.168.1.5", False),
        ("example.org", False),
        ("localhost.example.org", False),
        ("::", False),
    ],
)
def test_every_surface_takes_the_same_hosts_for_loopback(
    tmp_path: Path, host: str, loopback: bool
) -> None:
    """``serve`` and ``gateway`` generate no token for a ``--host`` exactly when, without a
    token, the dashboard's and the gateway's guards answer that host in ``Host``: a server
    started with no token on a loopback address is one its own guard then serves."""
    from terrarium.gateway import create_app as gateway_app
    from terrarium.web import create_app

    assert (required_token(None, host) is None) is loopback
    shown = f"[{host}]" if ":" in host else host
    expected = 404 if loopback else 403  # past the guard, the route does not exist
    with FsStore(tmp_path / "s") as store:
        for site in (f"http://{shown}:8765", f"http://{shown}"):  # Host with a port, without
            dashboard = TestClient(create_app(store), base_url=site)
            assert dashboard.get("/nothing").status_code == expected, f"dashboard, {site}"
            gateway = TestClient(gateway_app(store, "http://127.0.0.1:9/v1"), base_url=site)
            assert gateway.get("/v1/nothing").status_code == expected, f"gateway, {site}"


@pytest.mark.parametrize("token", ["s3cret", ""])
def test_every_surface_takes_a_token_only_when_it_matches(tmp_path: Path, token: str) -> None:
    """With a token, the dashboard and the gateway answer a request that sends it as a bearer
    token and refuse any other (401); an empty token is matched by nothing, an empty bearer
    token included (the dashboard let ``Authorization: Bearer`` in when given ``token=""``)."""
    from terrarium.gateway import create_app as gateway_app
    from terrarium.web import create_app

    site = "http://192.0.2.10:8765"
    with FsStore(tmp_path / "s") as store:
        surfaces = [
            (TestClient(create_app(store, token=token), base_url=site), "/nothing"),
            (
                TestClient(gateway_app(store, "http://127.0.0.1:9/v1", token=token), base_url=site),
                "/v1/nothing",
            ),
        ]
        for http, path in surfaces:
            for given, expected in [(token, 404 if token else 401), ("", 401), ("nope", 401)]:
                answer = http.get(path, headers={"authorization": f"Bearer {given}"})
                assert answer.status_code == expected, (path, given)


def test_a_port_in_use_is_one_line_before_any_banner(tmp_path: Path) -> None:
    """Another server holds the port: ``serve`` says so in one line on stderr, prints no
    dashboard URL, and exits 1 (a real process, a real listening socket)."""
    FsStore(tmp_path / "s").close()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "terrarium", "serve", "--port", str(port)]
        done = subprocess.run(
            [*command, "--storage-dir", str(tmp_path / "s")],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert done.stdout == ""  # no "terrarium dashboard on http://..." for a server never up
    assert done.stderr == (
        f"Error: cannot listen on 127.0.0.1:{port}: the port is in use (stop what listens "
        "there, or pick another with --port)\n"
    )


def test_port_0_serves_on_a_free_port_and_prints_it(tmp_path: Path) -> None:
    """The banner names the port the dashboard really listens on."""
    with FsStore(tmp_path / "s") as store:
        seed(store)
    command = [sys.executable, "-m", "terrarium", "serve", "--storage-dir", str(tmp_path / "s")]
    with subprocess.Popen([*command, "--port", "0"], stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            url = proc.stdout.readline().split()[-1]
            port = int(url.rsplit(":", 1)[1].strip("/"))
            assert port != 0 and url == f"http://127.0.0.1:{port}/"
            transport = httpx.HTTPTransport(retries=50)  # the socket listens before the line
            with httpx.Client(base_url=url, transport=transport) as http:
                assert http.get("/api/stats").status_code == 200
        finally:
            proc.terminate()
            try:
                assert proc.wait(20) in (0, -15)
            finally:
                proc.kill()


def test_off_loopback_a_token_is_generated_and_enforced(tmp_path: Path) -> None:
    with FsStore(tmp_path / "s") as store:
        seed(store)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "terrarium",
        "serve",
        "--storage-dir",
        str(tmp_path / "s"),
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
    ]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as proc:
        try:
            assert proc.stdout is not None
            assert "?token=" in proc.stdout.readline()
            token = proc.stdout.readline().strip().removeprefix("token: ")
            assert len(token) >= 24
            base = f"http://127.0.0.1:{port}"
            transport = httpx.HTTPTransport(
                retries=50
            )  # retries refused connections while it binds
            with httpx.Client(base_url=base, transport=transport) as http:
                assert http.get("/api/stats").status_code == 401
                assert http.get("/", headers={"authorization": "Bearer nope"}).status_code == 401
                ok = http.get("/api/stats", headers={"authorization": f"Bearer {token}"})
                assert ok.status_code == 200 and ok.json()["totals"]["contexts"] == 3
        finally:
            proc.terminate()
            try:
                assert proc.wait(20) in (0, -15)
            finally:
                proc.kill()


def test_open_starts_the_browser_on_the_dashboard_url(tmp_path: Path) -> None:
    # webbrowser honours $BROWSER: point it at a script that records the URL it is given.
    with FsStore(tmp_path / "s") as store:
        seed(store)
    record = tmp_path / "opened.txt"
    fake = tmp_path / "fake-browser"
    fake.write_text(f'#!/bin/sh\nprintf "%s" "$1" > {record}.part && mv {record}.part {record}\n')
    fake.chmod(0o700)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "terrarium",
        "serve",
        "--storage-dir",
        str(tmp_path / "s"),
        "--port",
        str(port),
        "--open",
    ]
    env = {**os.environ, "BROWSER": str(fake), "DISPLAY": ""}
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
        try:
            assert proc.stdout is not None
            printed = proc.stdout.readline().split()[-1]
            assert printed == f"http://127.0.0.1:{port}/"
            # The browser is started half a second after the line; the server keeps running.
            transport = httpx.HTTPTransport(retries=50)
            with httpx.Client(base_url=printed, transport=transport) as http:
                for _ in range(600):  # a guard against hanging, not a timing: 30 s
                    if record.exists():
                        break
                    assert proc.poll() is None
                    assert http.get("/api/stats").status_code == 200
                    time.sleep(0.05)
            assert record.read_text() == printed
        finally:
            proc.terminate()
            try:
                assert proc.wait(20) in (0, -15)
            finally:
                proc.kill()


def _serve_once(monkeypatch: pytest.MonkeyPatch, args: list[str], use: Any) -> Any:
    """Run ``terrarium serve ARGS`` with uvicorn's serving replaced by ``use(app)``, which
    drives the app while the command runs (its store closes when the command ends)."""
    from terrarium.cli import serve

    monkeypatch.setattr(serve, "run_server", lambda app, sock: use(app))
    return CliRunner().invoke(cli, ["serve", "--port", "0", *args])


def test_serve_takes_the_model_options_and_contacts_no_model_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FsStore(tmp_path / "s") as store:
        seed(store)
    seen: dict[str, Any] = {}

    def use(app: Any) -> None:
        seen["model"] = app.app.state.dashboard.model
        with TestClient(app, base_url="http://127.0.0.1:8765") as http:
            seen["confirm"] = http.get("/confirm", params={"action": "compact", "c": "cli:main"})

    # A model "server" that never accepts: a connection to it would wait in its backlog.
    with socket.socket() as model:
        model.bind(("127.0.0.1", 0))
        model.listen(8)
        url = f"http://127.0.0.1:{model.getsockname()[1]}/v1"
        args = ["--storage-dir", str(tmp_path / "s"), "--allow-writes", "--model", "m"]
        args += ["--base-url", url, "--retries", "0", "--timeout", "5"]
        result = _serve_once(monkeypatch, args, use)
        model.setblocking(False)
        with pytest.raises(BlockingIOError):
            model.accept()  # nobody connected
    assert result.exit_code == 0, result.output
    assert seen["model"] == ModelAccess(url, model="m", retries=0, timeout=5.0)
    assert seen["confirm"].status_code == 200
    assert f"<code>{url}</code>" in seen["confirm"].text


def test_serve_compacts_through_the_store_it_was_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_server: FakeServer
) -> None:
    """``TERRARIUM_BASE_URL`` names the server; the compaction opens the --storage-dir store."""
    with FsStore(tmp_path / "s") as store:
        seed(store)
        long_turns(store, "cli:compacted")
    fake_server.reply = "SUMMARY"
    monkeypatch.setenv("TERRARIUM_BASE_URL", fake_server.base_url)
    done: list[int] = []

    def use(app: Any) -> None:
        with TestClient(app, base_url="http://127.0.0.1:8765") as http:
            csrf = app.app.state.dashboard.csrf
            form = {"action": "compact", "c": "cli:compacted", "csrf": csrf}
            done.append(http.post("/action", data=form, follow_redirects=False).status_code)

    args = ["--storage-dir", str(tmp_path / "s"), "--allow-writes"]
    assert _serve_once(monkeypatch, args, use).exit_code == 0
    assert done == [303] and len(fake_server.requests) == 1
    with FsStore(tmp_path / "s") as store:
        history = restore(store, ContextId.parse("cli:compacted")).history
    assert history[0]["content"].endswith("SUMMARY")


def test_served_connections_do_not_wait_on_nagle() -> None:
    """The connections ``listen``'s socket accepts get TCP_NODELAY from asyncio (it sets it
    only on sockets whose protocol says TCP): an answer written in two pieces, headers then
    body, otherwise waits 40 ms for the client's delayed ACK."""
    import asyncio

    from terrarium.cli.serve import listen

    async def accepted_nodelay() -> int:
        seen: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            conn = writer.get_extra_info("socket")
            seen.set_result(conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        server = await asyncio.start_server(connected, sock=listen("127.0.0.1", 0))
        port = server.sockets[0].getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            return await asyncio.wait_for(seen, 10)
        finally:
            writer.close()
            server.close()
            await server.wait_closed()

    assert asyncio.run(accepted_nodelay()) != 0
