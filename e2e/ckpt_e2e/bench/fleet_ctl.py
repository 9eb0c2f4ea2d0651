"""The controller half of `bench fleet`, run inside the bench's control namespace
(`python -m ckpt_e2e.bench.fleet_ctl '<json>'`): it plays the operator's part, sending update
requests and reading agents' status, and prints one JSON line of timings.

First one raw TCP stream from the control namespace to a sink on a capped host measures the
links' real payload rate. Then two rollouts of two fresh versions of the same size:
- source-only: every agent pulls from the source at once;
- relay: the waves of `fleet_plan` (a canary, then one pipelined wave; or doubling holders),
  the source's egress read from its interface counter before and after.
Each wave's calls go out parents first, each a blocking update_weights that the agent answers once
its load ended: the bench times a wave without polling agents (which cost their CPU).
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from http.client import HTTPConnection
from typing import Any
from urllib.parse import urlsplit

from ckpt_api.agent_api import AgentStatus, LastLoad, SourceRef, UpdateWeightsRequest
from ckpt_api.vocabulary import AgentState
from ckpt_e2e.bench.fleet_plan import WaveMode, plan_waves
from ckpt_e2e.bench.netns import tx_bytes


def _call(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    # Only http:// URLs the bench built itself reach here.
    headers = {"Content-Type": "application/json"}
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def wait_healthy(servers: list[str], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    for url in servers:
        while True:
            try:
                _call("GET", url + "/healthz", timeout=2)
                break
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline:
                    raise SystemExit(f"{url} did not come up in {limit_s}s") from None
                time.sleep(0.2)


def agent_status(url: str) -> AgentStatus:
    """The agent's `/v1/status` (raises OSError or pydantic's ValidationError when it cannot say)."""
    return AgentStatus.model_validate(_call("GET", url + "/v1/status", timeout=5.0))


def serves(status: AgentStatus, version: str) -> bool:
    """Whether the agent serves `version`: it is live and no load is running."""
    return status.state != AgentState.LOADING and status.version == version


def _live(url: str, version: str) -> AgentStatus | None:
    """The agent's status once it serves `version` (verified: the bench asks for checksums)."""
    status = agent_status(url)
    if status.state == AgentState.FAILED:
        raise SystemExit(f"{url}: loading {version} failed: {status.last_error}")
    return status if serves(status, version) else None


def _send_update(url: str, version: str, source: dict[str, str | bool], limit_s: float) -> HTTPConnection:
    """Send a blocking update_weights (no `Prefer: respond-async`): the agent answers once its
    load has ended. Waiting on that answer times a wave without polling: at 50 polls a second
    each `/v1/status` cost an agent ~2 ms of CPU, which at 16 agents took most of the machine's
    two cores from the loads being measured."""
    request = UpdateWeightsRequest(
        version=version, verify_checksum=True, source=SourceRef.model_validate(source)
    )
    parts = urlsplit(url)
    conn = HTTPConnection(parts.hostname or "", parts.port, timeout=limit_s)
    body = json.dumps(request.to_wire()).encode()
    conn.request("POST", "/v1/update_weights", body, {"Content-Type": "application/json"})
    return conn


def _answer(conn: HTTPConnection, url: str, version: str) -> AgentStatus:
    """The agent's status once its blocking update_weights answered: live on `version`."""
    try:
        resp = conn.getresponse()
        body = resp.read()
    except OSError as exc:
        raise SystemExit(f"{url}: update_weights to {version} got no answer: {exc}") from None
    finally:
        conn.close()
    if resp.status != 200:
        raise SystemExit(f"{url}: loading {version} failed: HTTP {resp.status} {body[:2000]!r}")
    status = _live(url, version)
    if status is None:
        raise SystemExit(f"{url}: update_weights to {version} answered, but the agent is not live on it")
    return status


def wave(jobs: list[tuple[str, dict[str, str | bool]]], version: str, limit_s: float) -> list[AgentStatus]:
    """Send every member its update in the order given (a parent's before the members reading
    it; a reader also waits for a peer that has not begun yet), then wait for every answer."""
    sent = [(url, _send_update(url, version, source, limit_s)) for url, source in jobs]
    with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as pool:
        return list(pool.map(lambda job: _answer(job[1], version=version, url=job[0]), sent))


def cpu_times() -> tuple[int, int]:
    """(all, idle) jiffies of the machine's CPUs, from /proc/stat."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    return sum(fields), fields[3] + fields[4]  # idle + iowait


def cpu_busy(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The fraction of all cores busy between two `cpu_times`."""
    total, idle = after[0] - before[0], after[1] - before[1]
    return 1.0 - idle / total if total > 0 else 0.0


_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) a process has used, from /proc/<pid>/stat: the
    bench's namespaces share the machine's pid namespace."""
    with open(f"/proc/{pid}/stat") as stat:
        # The command name (field 2) may hold spaces: count fields after its closing paren.
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S  # utime, stime


def agents_cpu_s(pids: list[int]) -> float:
    return sum(process_cpu_s(pid) for pid in pids)


def relay_rollout(
    agents: list[str],
    source: str,
    version: str,
    mode: WaveMode,
    limit_s: float,
    source_ns: str,
    pids: dict[str, int],
    version_bytes: int,
) -> dict[str, Any]:
    """The relay rollout in `mode`'s waves; `source_ns` is the source's namespace, whose eth0
    counts what the source sent; `pids` the agents' processes, whose CPU time each wave costs is
    divided by the MiB its agents moved (`version_bytes` each): the CPU one hop costs a MiB."""
    egress_before = tx_bytes(source_ns)
    started = time.monotonic()
    waves: list[dict[str, Any]] = []
    loads: list[LastLoad] = []
    for jobs in plan_waves(agents, mode):
        wave_started = time.monotonic()
        cpu_before = cpu_times()
        wave_pids = [pids[j.agent] for j in jobs]
        agents_before = agents_cpu_s(wave_pids)
        statuses = wave([(j.agent, j.source(source)) for j in jobs], version, limit_s)
        agents_cpu = agents_cpu_s(wave_pids) - agents_before
        waves.append(
            {
                "agents": len(jobs),
                "seconds": round(time.monotonic() - wave_started, 3),
                # Every namespace shares this machine's cores: a wave at ~1.0 was CPU-bound,
                # not link-bound.
                "cpu_busy": round(cpu_busy(cpu_before, cpu_times()), 2),
                # What each agent spent per MiB it received, verified, staged and (if it feeds
                # another) served on: the per-hop cost that caps a chain on shared cores.
                "agent_cpu_ms_per_mib": round(agents_cpu * 1e3 / (len(jobs) * version_bytes / 2**20), 2),
                "from_source": sum(1 for j in jobs if j.parent is None),
                "relaying": sum(1 for j in jobs if j.relay_while_loading),
            }
        )
        loads += [s.last_load for s in statuses if s.last_load is not None]
    relay = time.monotonic() - started
    return {
        "relay_s": relay,
        "waves": waves,
        "fallbacks": sum(1 for load in loads if load.fallback_reason),
        "source_egress_bytes": tx_bytes(source_ns) - egress_before,
        "bytes_from_peer": sum(load.bytes_from_peer for load in loads),
        "bytes_from_source": sum(load.bytes_from_source for load in loads),
    }


SINK_READY = "sink: listening"


def tcp_goodput(host: str, port: int, nbytes: int) -> float:
    """Bytes/s of one raw TCP stream to a sink (`sink` below) across the capped links: the
    real payload rate of a link, headers and shaping included."""
    import socket

    chunk = b"\0" * (1 << 20)
    with socket.create_connection((host, port), timeout=30) as sock:
        started = time.monotonic()
        left = nbytes
        while left:
            step = min(left, len(chunk))
            sock.sendall(chunk[:step])
            left -= step
        sock.shutdown(socket.SHUT_WR)
        sock.recv(1)  # the sink answers once it has everything
        return nbytes / (time.monotonic() - started)


def sink(host: str, port: int) -> None:
    """Receive one stream to its end, then acknowledge with one byte."""
    import socket

    with socket.create_server((host, port)) as server:
        # The bench starts the controller only after this line: connecting earlier was refused
        # about one run in five.
        print(SINK_READY, flush=True)
        conn, _ = server.accept()
        with conn:
            while conn.recv(1 << 20):
                pass
            conn.sendall(b"k")


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    agents: list[str] = cfg["agents"]
    source: str = cfg["source"]
    limit = float(cfg["wave_limit_s"])
    goodput = tcp_goodput(cfg["sink_host"], cfg["sink_port"], cfg["goodput_bytes"])
    # The source too: agents pull from it as soon as the first update arrives.
    wait_healthy([source, *agents], float(cfg["startup_limit_s"]))

    started = time.monotonic()
    wave([(a, {"uri": source}) for a in agents], cfg["versions"][0], limit)
    source_only = time.monotonic() - started
    pids = {url: int(pid) for url, pid in cfg["agent_pids"].items()}
    relay = relay_rollout(
        agents, source, cfg["versions"][1], cfg["waves"], limit, cfg["source_ns"], pids, cfg["goodput_bytes"]
    )
    return {"source_only_s": source_only, "goodput_bytes_per_s": goodput, **relay}


if __name__ == "__main__":
    if sys.argv[1] == "sink":
        sink(sys.argv[2], int(sys.argv[3]))
    else:
        print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)
