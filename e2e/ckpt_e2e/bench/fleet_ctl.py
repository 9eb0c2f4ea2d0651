"""The controller half of `bench fleet`, run inside the bench's control namespace
(`python -m ckpt_e2e.bench.fleet_ctl '<json>'`): it plays the operator's part, sending update
requests and polling agents' status, and prints one JSON line of timings.

First one raw TCP stream from the control namespace to a sink on a capped host measures the
links' real payload rate. Then two rollouts of two fresh versions of the same size:
- source-only: every agent pulls from the source at once;
- relay: wave 1 is one agent pulling from the source, then each wave doubles the holders,
  every holder feeding one new agent as its peer (holders 1, 2, 4, ...).
"""

from __future__ import annotations

import json
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ckpt_api.agent_api import PREFER_HEADER, RESPOND_ASYNC, AgentStatus, SourceRef, UpdateWeightsRequest
from ckpt_api.vocabulary import AgentState

POLL_SECONDS = 0.02  # part of every measured wave: keep it small against S/bw


def _call(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 10.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    # Only http:// URLs the bench built itself reach here.
    # Asynchronous update_weights (202, then the status polls the bench times), as the operator's.
    headers = {"Content-Type": "application/json", PREFER_HEADER: RESPOND_ASYNC}
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


def _update_and_wait(url: str, version: str, source: dict[str, str], limit_s: float) -> dict[str, Any]:
    request = UpdateWeightsRequest(
        version=version, verify_checksum=True, source=SourceRef.model_validate(source)
    )
    _call("POST", url + "/v1/update_weights", request.to_wire())
    deadline = time.monotonic() + limit_s
    while True:
        body: dict[str, Any] = _call("GET", url + "/v1/status")
        status = AgentStatus.model_validate(body)
        if status.state != AgentState.LOADING and status.version == version:
            return body
        if status.state == AgentState.FAILED:
            raise SystemExit(f"{url}: loading {version} failed: {status.last_error}")
        if time.monotonic() > deadline:
            raise SystemExit(f"{url}: {version} not live after {limit_s}s")
        time.sleep(POLL_SECONDS)


def wave(jobs: list[tuple[str, dict[str, str]]], version: str, limit_s: float) -> list[dict[str, Any]]:
    with ThreadPoolExecutor(max_workers=max(len(jobs), 1)) as pool:
        futures = [pool.submit(_update_and_wait, url, version, src, limit_s) for url, src in jobs]
        return [f.result() for f in futures]


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

    version = cfg["versions"][1]
    started = time.monotonic()
    holders, waves, fallbacks = 0, [], 0
    while holders < len(agents):
        new = agents[holders : holders + max(holders, 1)]
        jobs = [
            (a, {"uri": source}) if holders == 0 else (a, {"uri": source, "peer": agents[i]})
            for i, a in enumerate(new)
        ]
        wave_started = time.monotonic()
        statuses = wave(jobs, version, limit)
        waves.append({"agents": len(new), "seconds": round(time.monotonic() - wave_started, 3)})
        fallbacks += sum(1 for s in statuses if (s.get("last_load") or {}).get("fallback_reason"))
        holders += len(new)
    relay = time.monotonic() - started
    return {
        "source_only_s": source_only,
        "relay_s": relay,
        "waves": waves,
        "fallbacks": fallbacks,
        "goodput_bytes_per_s": goodput,
    }


if __name__ == "__main__":
    if sys.argv[1] == "sink":
        sink(sys.argv[2], int(sys.argv[3]))
    else:
        print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)
