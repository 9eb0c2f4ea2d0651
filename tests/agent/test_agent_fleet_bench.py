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

from ckpt_e2e.bench.netns import NS_PREFIX, NetnsError, Topology, missing_prerequisites, sweep_stale, tx_bytes

pytestmark = [
    pytest.mark.bench,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]


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
        sent_before = tx_bytes(a.ns)
        reply = subprocess.run(
            a.exec_argv([sys.executable, "-c", _ECHO_CLIENT, b.ip]),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert reply.stdout.strip() == "pong", reply.stderr
        # The handshake, the ping and the close: a few frames, each over 60 bytes with headers.
        assert tx_bytes(a.ns) - sent_before > 3 * 60
        server.wait(timeout=10)
        assert set(_ours(topo.prefix + "-")) == {f"{topo.prefix}-{n}" for n in ("br", "a", "b")}
    finally:
        assert topo.destroy() == []
    assert _ours(topo.prefix + "-") == []


def test_tx_bytes_of_a_missing_namespace_says_so() -> None:
    with pytest.raises(NetnsError, match=f"counters of eth0 in {NS_PREFIX}-no-such"):
        tx_bytes(f"{NS_PREFIX}-no-such")


def test_sweep_removes_namespaces_of_dead_runs() -> None:
    # Above any pid_max (no such PID); the suffix keeps a concurrent run's ghost apart from ours.
    ghost = f"{NS_PREFIX}999999999-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", ghost], check=True)
    assert ghost in sweep_stale()
    assert ghost not in _ours()


@pytest.mark.parametrize(
    ("waves", "sizes", "from_source"),
    # 3 hosts: the pipelined wave's two chains are one agent each (fed by the canary and by the
    # source), so no agent reads a peer that is still loading.
    [("default", [1, 2], [1, 1]), ("doubling", [1, 1, 1], [1, 0, 0])],
)
def test_bench_fleet_smoke(waves: str, sizes: list[int], from_source: list[int]) -> None:
    hosts, size_mb = 3, 4
    bench = subprocess.Popen(
        [sys.executable, "-m", "ckpt_e2e.bench", "fleet", "--hosts", str(hosts),
         "--link-mbps", "400", "--size-mb", str(size_mb), "--waves", waves, "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        stdout, stderr = bench.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        bench.terminate()  # the bench removes its namespaces on SIGTERM
        stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 0, stderr[-3000:]
    r = json.loads(stdout.strip().splitlines()[-1])
    assert {"hosts", "size_mb", "source_only_s", "relay_s", "ideal_relay_s"} <= r.keys()
    assert (r["hosts"], r["waves_mode"], r["fallbacks"]) == (hosts, waves, 0)
    assert [w["agents"] for w in r["waves"]] == sizes
    assert [w["from_source"] for w in r["waves"]] == from_source
    assert r["tensors"] >= size_mb, "tensors of at most 1 MiB, so that relay can pipeline"
    assert (r["canary_s"], r["pipelined_s"]) == (r["waves"][0]["seconds"], r["waves"][-1]["seconds"])
    assert max(r["canary_s"], r["pipelined_s"]) <= r["relay_s"]
    assert all(0.0 <= w["cpu_busy"] <= 1.0 for w in r["waves"])
    assert r["pipelined_cpu_busy"] == r["waves"][-1]["cpu_busy"]
    # The agents verified and staged the version: that cost them CPU per MiB moved. Their CPU is
    # read from /proc in clock ticks (10 ms), and one agent's wave of 4 MiB can round to none.
    assert all(w["agent_cpu_ms_per_mib"] >= 0 for w in r["waves"])
    assert sum(w["agent_cpu_ms_per_mib"] for w in r["waves"]) > 0
    assert r["pipelined_agent_cpu_ms_per_mib"] == r["waves"][-1]["agent_cpu_ms_per_mib"]
    assert r["link_bound_s"] > 0
    # Every agent got the whole version exactly once (no fallback re-read anything), and the
    # source's interface sent at least the payload the agents read from it.
    assert r["bytes_from_peers_mb"] + r["bytes_from_source_mb"] == pytest.approx(
        hosts * r["size_mb"], abs=0.05
    )
    assert r["bytes_from_source_mb"] == pytest.approx(sum(from_source) * r["size_mb"], abs=0.05)
    assert r["source_egress_mb"] >= r["bytes_from_source_mb"] > 0
    assert r["source_egress_ratio"] == pytest.approx(r["source_egress_mb"] / r["size_mb"], rel=0.01)
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
