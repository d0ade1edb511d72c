"""``expstore ui`` as a user starts it: a port in use is said once, clearly, with exit
status 1 and no "serving at"; bound to every address (``--host 0.0.0.0``), the server
answers to the loopback names and the ``--allow-host`` names on its port, and to no other
Host header."""

from __future__ import annotations

import http.client
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from expstore import ReplayBuffer
from tests.helpers import make_row

pytest.importorskip("uvicorn", reason="the viewer's tests need the ui extra")


@pytest.fixture
def database(tmp_path: Path) -> str:
    path = tmp_path / "web.db"
    with ReplayBuffer(f"sqlite:///{path}", name="web") as buffer:
        buffer.store_batch([make_row("shop-0", step=i) for i in range(3)])
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def expstore_ui(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != "EXPSTORE_URL"}
    return subprocess.Popen(
        [sys.executable, "-m", "expstore", "ui", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_a_port_in_use_is_said_once_and_exits_non_zero(database: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        run = expstore_ui(database, "--port", str(port))
        out, err = run.communicate(timeout=60)
    assert run.returncode == 1
    assert "serving" not in out
    assert err.count("in use") == 1 and f"127.0.0.1:{port}" in err and "--port" in err
    assert "Traceback" not in err and "Errno" not in err


@pytest.fixture
def everywhere(database: str) -> Iterator[int]:
    """``expstore ui --host 0.0.0.0 --allow-host gpu-box --allow-host 10.9.8.7`` running."""
    port = free_port()
    run = expstore_ui(
        database,
        "--host",
        "0.0.0.0",
        "--port",
        str(port),
        "--allow-host",
        "gpu-box",
        "--allow-host",
        "10.9.8.7",
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            assert run.poll() is None, run.communicate()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the viewer did not start"
                time.sleep(0.1)
        yield port
    finally:
        run.terminate()
        out, _ = run.communicate(timeout=30)
        assert "WARNING: bound to 0.0.0.0" in out


def status(port: int, host: str, path: str = "/b/web/rows") -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


def test_bound_to_every_address_it_answers_to_the_names_it_was_given(everywhere: int) -> None:
    port = everywhere
    for host in ("gpu-box", "10.9.8.7", "localhost", "127.0.0.1", "[::1]"):
        assert status(port, f"{host}:{port}") == 200, host
    for host in (
        f"attacker.example:{port}",
        f"gpu-box:{port + 1}",
        f"0.0.0.0:{port}",
        "gpu-box",  # no port: a browser names the port unless it is 80
        f"10.9.8.8:{port}",
    ):
        assert status(port, host) == 400, host
    assert status(port, f"attacker.example:{port}", "/static/ui.css") == 400
