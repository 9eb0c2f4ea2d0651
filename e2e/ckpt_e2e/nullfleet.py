"""A worker fleet of thousands of kwok pods, each answered by a null-engine agent hosted by a few
`ckpt_e2e.multiagent` processes (test harness only).

For a bench, not for churn: the pods are listed once they are all Running and split among the
hosts; pods that come or go afterwards get no agent (PodRuntime follows churn, one process per
pod, for the scenario tests).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
import urllib.error
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import Any

from kubernetes import client

from ckpt_api.vocabulary import PodPhase

from .multiagent import HostedPod, write_pods
from .procs import spawn, stop, wait_for
from .rollout_env import http_json, worker_deployment

# Agents per host process: one asyncio loop serves them all; past ~1000 a host's loop, not the
# machine, becomes the bottleneck of a wave.
AGENTS_PER_HOST = 1000


@dataclass
class _Host:
    proc: subprocess.Popen[bytes]
    log: Path
    pods: list[HostedPod]
    stats_url: str | None = None


@dataclass
class NullFleet:
    api: client.ApiClient
    namespace: str
    replicas: int
    kubeconfig: Path
    token_file: Path
    workdir: Path
    initial_version: str = "v0"
    name: str = "workers"
    labels: dict[str, str] = field(default_factory=lambda: {"app": "rollout-worker"})
    hosts: int | None = None  # default: ceil(replicas / AGENTS_PER_HOST)
    load_seconds: float = 0.0
    report: bool = True  # False: agents write neither CR entries nor pod conditions
    timings: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._hosts: list[_Host] = []

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self, timeout: float = 600.0) -> NullFleet:
        t0 = time.monotonic()
        client.AppsV1Api(self.api).create_namespaced_deployment(
            self.namespace, worker_deployment(self.name, self.replicas, self.labels)
        )
        pods = wait_for(self._running_pods, timeout, f"{self.replicas} Running pods", interval=1.0)
        self.timings["pods_running_s"] = time.monotonic() - t0
        t1 = time.monotonic()
        try:
            self._start_hosts(pods, timeout)
        except BaseException:
            self.stop()
            raise
        self.timings["agents_ready_s"] = time.monotonic() - t1
        return self

    def stop(self) -> None:
        for host in self._hosts:
            stop(host.proc, grace=30.0)  # agents drain their queued reports on SIGTERM
        self._hosts.clear()

    def __enter__(self) -> NullFleet:
        return self.start()

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # -- steps ----------------------------------------------------------------------------------
    def selector(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.labels.items())

    def _running_pods(self) -> list[HostedPod] | None:
        resp: Any = client.CoreV1Api(self.api).list_namespaced_pod(
            self.namespace, label_selector=self.selector(), _preload_content=False
        )
        # Raw JSON: model deserialization of thousands of pods takes seconds per list.
        items = json.loads(resp.data)["items"]
        pods = [
            HostedPod(p["metadata"]["name"], self.namespace, p["status"]["podIP"])
            for p in items
            if p.get("status", {}).get("phase") == PodPhase.RUNNING
            and p["status"].get("podIP")
            and not p["metadata"].get("deletionTimestamp")
        ]
        return sorted(pods, key=lambda p: p.name) if len(pods) == self.replicas else None

    def _start_hosts(self, pods: list[HostedPod], timeout: float) -> None:
        count = self.hosts or max(1, math.ceil(len(pods) / AGENTS_PER_HOST))
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        for i in range(count):
            share = pods[i::count]
            pods_file = self.workdir / f"agents-{i}.json"
            write_pods(pods_file, share)
            log = self.workdir / f"agents-{i}.log"
            argv = [
                sys.executable,
                "-m",
                "ckpt_e2e.multiagent",
                "--pods-file",
                str(pods_file),
                "--token-file",
                str(self.token_file),
                "--initial-version",
                self.initial_version,
                "--load-seconds",
                str(self.load_seconds),
                *([] if self.report else ["--no-report"]),
            ]
            self._hosts.append(_Host(spawn(argv, log, env=env), log, share))
        for host in self._hosts:
            host.stats_url = wait_for(partial(_ready_url, host), timeout, f"agents ready ({host.log})")

    # -- readings -------------------------------------------------------------------------------
    def pods(self) -> list[HostedPod]:
        return [p for h in self._hosts for p in h.pods]

    @property
    def pids(self) -> list[int]:
        return [h.proc.pid for h in self._hosts]

    def stats(self) -> dict[str, Any]:
        """Every host's stats, summed (per-wave critical path: the max over hosts)."""
        total: dict[str, Any] = {"agents": 0, "loads": 0, "versions": {}, "api_requests": {}}
        slowest: dict[str, float] = {}
        for host in self._hosts:
            assert host.stats_url is not None
            one = http_json(f"{host.stats_url}/stats", timeout=30)
            total["agents"] += one["agents"]
            total["loads"] += one["loads"]
            for key in ("versions", "api_requests"):
                for k, v in one[key].items():
                    total[key][k] = total[key].get(k, 0) + v
            for wave, seconds in one["slowest_load_s_by_wave"].items():
                slowest[wave] = max(slowest.get(wave, 0.0), seconds)
        total["slowest_load_s_by_wave"] = slowest
        return total

    def settled_stats(self, quiet_s: float = 2.0, timeout: float = 120.0) -> dict[str, Any]:
        """Stats once the agents' queued reports have gone out: no new API request for
        `quiet_s` (or `timeout` passed)."""
        deadline = time.monotonic() + timeout
        last = self.stats()
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = self.stats()
            if now["api_requests"] == last["api_requests"]:
                return now
            last = now
        return last


def _ready_url(host: _Host) -> str | None:
    """The host's stats URL once it printed `ready`; raises if it died first."""
    text = host.log.read_text(errors="replace") if host.log.exists() else ""
    for line in text.splitlines():
        if line.startswith("ready "):
            url = line.rsplit(" ", 1)[1]
            try:
                http_json(f"{url}/stats", timeout=30)
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return None
            return url
    if host.proc.poll() is not None:
        raise RuntimeError(f"agent host exited with {host.proc.returncode}; log tail:\n{text[-3000:]}")
    return None
