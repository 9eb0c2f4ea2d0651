"""`bench fleet` and its namespace topology, for real: everything it creates is gone afterwards.
Needs root (skipped otherwise: namespaces cannot be made unprivileged) and iproute2, which
`make test` installs (a missing `ip`/`tc` fails)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest

from ckpt_e2e.bench.netns import NS_PREFIX, Topology, missing_prerequisites, sweep_stale

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


@pytest.fixture(autouse=True)
def _tools_installed() -> None:
    assert missing_prerequisites() is None, missing_prerequisites()


def _ours(prefix: str = NS_PREFIX) -> list[str]:
    """Bench namespaces whose names start with `prefix`: give a run's own (`ckfleet<pid>-`), since
    other runs on the machine (a second checkout's suite) make and remove theirs meanwhile."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def test_topology_links_members_and_destroys_everything() -> None:
    topo = Topology()
    try:
        a, b = topo.add("a", 100), topo.add("b", None)
        # A real TCP exchange between two members across the bridge (and the capped link).
        server = subprocess.Popen(
            b.exec_argv([sys.executable, "-c", _ECHO_SERVER, b.ip]), stdout=subprocess.PIPE, text=True
        )
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "listening"
        reply = subprocess.run(
            a.exec_argv([sys.executable, "-c", _ECHO_CLIENT, b.ip]),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert reply.stdout.strip() == "pong", reply.stderr
        server.wait(timeout=10)
        assert set(_ours(topo.prefix + "-")) == {f"{topo.prefix}-{n}" for n in ("br", "a", "b")}
    finally:
        assert topo.destroy() == []
    assert _ours(topo.prefix + "-") == []


def test_sweep_removes_namespaces_of_dead_runs() -> None:
    # Above any pid_max (no such PID); the suffix keeps a concurrent run's ghost apart from ours.
    ghost = f"{NS_PREFIX}999999999-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ghost], check=True)
    assert ghost in sweep_stale()
    assert ghost not in _ours()


def test_bench_fleet_smoke() -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "ckpt_rollout.cli", "bench", "fleet", "--hosts", "2", "--link-mbps", "400",
         "--size-mb", "4", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        stdout, stderr = bench.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        bench.terminate()  # the bench removes its namespaces on SIGTERM
        stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 0, stderr[-3000:]
    result = json.loads(stdout.strip().splitlines()[-1])
    assert {"hosts", "size_mb", "source_only_s", "relay_s", "ideal_relay_s"} <= result.keys()
    assert result["hosts"] == 2
    assert result["fallbacks"] == 0
    assert [w["agents"] for w in result["waves"]] == [1, 1]
    assert _ours(f"{NS_PREFIX}{bench.pid}-") == [], "the bench left namespaces behind"


_ECHO_SERVER = """
import socket, sys
with socket.create_server((sys.argv[1], 9123)) as s:
    print("listening", flush=True)
    conn, _ = s.accept()
    with conn:
        if conn.recv(4) == b"ping":
            conn.sendall(b"pong")
"""

_ECHO_CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], 9123), timeout=10) as c:
    c.sendall(b"ping")
    print(c.recv(4).decode())
"""
