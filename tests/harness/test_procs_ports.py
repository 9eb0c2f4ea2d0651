"""Ports for the harness's servers without a pick-then-bind race: port 0 announced by the child
(`spawn_server`), or a port held until the child binds it (`PortReservation`)."""

from __future__ import annotations

import errno
import socket
import urllib.request
from pathlib import Path

import pytest

from ckpt_e2e.procs import PortReservation, listening_ports, spawn, spawn_server, stop, wait_for
from ckpt_e2e.rollout_env import CLI


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:  # 127.0.0.1 only
            return resp.status == 200
    except OSError:
        return False


def test_a_held_port_is_refused_to_others_and_nothing_answers_on_it() -> None:
    with PortReservation(2) as held:
        assert len(set(held.ports)) == 2
        port = held.ports[0]
        with socket.socket() as other, pytest.raises(OSError, match="in use") as bind:
            other.bind(("127.0.0.1", port))
        assert bind.value.errno == errno.EADDRINUSE
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))
    with socket.socket() as after:
        after.bind(("127.0.0.1", port))  # released: anyone may take it again


def test_a_server_binds_the_port_held_for_it(tmp_path: Path) -> None:
    """The child (aiohttp here; Go's and http.server's listeners alike) binds with SO_REUSEADDR."""
    root = tmp_path / "root"
    root.mkdir()
    with PortReservation(1) as held:
        (port,) = held.ports
        proc = spawn([*CLI, "serve", str(root), "--port", str(port)], tmp_path / "serve.log")
        try:
            wait_for(lambda: _healthy(f"http://127.0.0.1:{port}") or proc.poll() is not None, 60, "serve")
            assert proc.poll() is None, (tmp_path / "serve.log").read_text()
            assert ("127.0.0.1", port) in listening_ports({proc.pid})
        finally:
            stop(proc)


def test_spawn_server_returns_the_url_the_child_listens_on(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    log = tmp_path / "serve.log"
    log.write_text("an earlier run on http://127.0.0.1:1\n")  # logs are appended to: not this one
    proc, url = spawn_server([*CLI, "serve", str(root), "--port", "0"], log, "checkpoint source")
    try:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        assert (host, int(port)) in listening_ports({proc.pid})
        assert _healthy(url)
    finally:
        stop(proc)


def test_spawn_server_fails_with_the_log_when_the_child_exits_first(tmp_path: Path) -> None:
    missing = tmp_path / "absent"
    with pytest.raises(RuntimeError, match="source exited with 1 before listening") as failed:
        spawn_server([*CLI, "serve", str(missing), "--port", "0"], tmp_path / "serve.log", "source")
    assert f"{missing} is not a directory" in str(failed.value)
