"""One process hosting many agents (test harness only): the pod-runtime stand-in for fleets of
thousands of kwok pods, where a process per pod would not fit on the machine.

Each hosted agent is the real agent (request handling, auth, pause gate, metrics, status
reports to the CR and the pod) bound to its own pod IP on the agent port, with its pod's
name and namespace for reporting, and the null engine (no weights). What the agents of one
host share is one Kubernetes API client (a connection pool instead of a TLS connection per
pod); the host counts the requests made through it, so a bench can tell the agents' API
traffic from the operator's.

Run as ``python -m ckpt_e2e.multiagent --pods-file pods.json ...``: it starts every agent,
prints ``ready <count>``, serves ``GET /stats`` on ``--stats-port`` and stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import signal
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from ckpt_agent.agent import Agent
from ckpt_agent.common.metrics import AgentMetrics
from ckpt_agent.engines.null import NullEngine
from ckpt_agent.server.app import create_app
from ckpt_agent.server.auth import StaticTokenAuthenticator
from ckpt_agent.server.httpserver import AppServer
from ckpt_agent.service.reporting import DisabledReporter, KubeReporter, StatusReporter
from ckpt_agent.service.service import AgentService
from ckpt_api import process_runtime
from ckpt_api.constants import DEFAULT_AGENT_PORT
from ckpt_api.vocabulary import LoadResult, WorkerPhase

log = logging.getLogger(__name__)

# Agents started at once: bounds the burst of binds and app setups.
START_BATCH = 256


@dataclass(frozen=True)
class HostedPod:
    name: str
    namespace: str
    ip: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "namespace": self.namespace, "ip": self.ip}


def read_pods(path: Path) -> list[HostedPod]:
    return [HostedPod(p["name"], p["namespace"], p["ip"]) for p in json.loads(path.read_text())]


def write_pods(path: Path, pods: list[HostedPod]) -> None:
    path.write_text(json.dumps([p.to_json() for p in pods]))


def request_kind(method: str, url: str) -> str:
    """`PATCH checkpointrollouts/status`, `PATCH pods/status`, ...: what a request touched."""
    path = url.split("?", 1)[0].rstrip("/").split("/")
    if "checkpointrollouts" in path:
        resource_path = "checkpointrollouts" + ("/status" if path[-1] == "status" else "")
    elif "pods" in path:
        resource_path = "pods" + ("/status" if path[-1] == "status" else "")
    else:
        resource_path = "other"
    return f"{method.upper()} {resource_path}"


class CountingApiClient:
    """A kubernetes_asyncio ApiClient whose REST requests are counted by `request_kind`."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client
        self.requests: Counter[str] = Counter()
        rest = api_client.rest_client
        original = rest.request

        async def counted(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
            self.requests[request_kind(method, url)] += 1
            return await original(method, url, *args, **kwargs)

        rest.request = counted

    async def close(self) -> None:
        await self.api_client.close()


class MultiAgentHost:
    def __init__(
        self,
        pods: list[HostedPod],
        *,
        token_file: Path,
        initial_version: str,
        port: int = DEFAULT_AGENT_PORT,
        report: bool = True,
        load_seconds: float = 0.0,
    ) -> None:
        self.pods = pods
        self._token_file = token_file
        self._initial_version = initial_version
        self._port = port
        self._report = report
        self._load_seconds = load_seconds
        self.api: CountingApiClient | None = None
        self.agents: dict[str, Agent] = {}

    async def start(self) -> None:
        _raise_open_files_limit()
        if self._report:
            from ckpt_agent.server.kube import new_api_client

            self.api = CountingApiClient(await new_api_client())
        # One authenticator for all: it re-reads the same token file for every agent anyway.
        authenticator = StaticTokenAuthenticator(self._token_file)
        for first in range(0, len(self.pods), START_BATCH):
            batch = self.pods[first : first + START_BATCH]
            agents = [self._agent(pod, authenticator) for pod in batch]
            await asyncio.gather(*(agent.start() for agent in agents))
            self.agents.update((pod.name, agent) for pod, agent in zip(batch, agents, strict=True))

    def _agent(self, pod: HostedPod, authenticator: StaticTokenAuthenticator) -> Agent:
        metrics = AgentMetrics()
        reporter: StatusReporter = DisabledReporter()
        if self.api is not None:
            reporter = KubeReporter(self.api.api_client, pod.name, pod.namespace, metrics)
        service = AgentService(
            NullEngine(self._load_seconds),
            default_source=None,
            reporter=reporter,
            metrics=metrics,
            requires_source=False,
            initial_version=self._initial_version,
        )
        app = create_app(service, authenticator)
        # api_client=None: the shared client is the host's to close, after every agent.
        return Agent(app, service, AppServer(app, pod.ip, self._port), api_client=None)

    async def stop(self) -> None:
        # Agents drain their queued reports on stop, so the shared client closes last.
        await asyncio.gather(*(agent.stop() for agent in self.agents.values()))
        self.agents.clear()
        if self.api is not None:
            await self.api.close()

    def stats(self) -> dict[str, Any]:
        """Counts and per-wave critical path (the slowest load of each wave), for benches."""
        versions: Counter[str] = Counter()
        slowest: dict[int, float] = {}
        for agent in self.agents.values():
            service = agent.service
            versions[service.live.version if service.live else ""] += 1
            last = service.reporter.describe().get("last") or {}
            wave = last.get("wave")
            if last.get("phase") == WorkerPhase.UPDATED and isinstance(wave, int):
                slowest[wave] = max(slowest.get(wave, 0.0), float(last.get("seconds") or 0.0))
        return {
            "agents": len(self.agents),
            "versions": dict(versions),
            "loads": sum(a.service.updates[LoadResult.SUCCEEDED] for a in self.agents.values()),
            "slowest_load_s_by_wave": {str(k): v for k, v in sorted(slowest.items())},
            "api_requests": dict(self.api.requests) if self.api else {},
        }


def _raise_open_files_limit() -> None:
    """A listening socket per agent plus its connections: the default 1024 is far too few."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


async def _serve(host: MultiAgentHost, stats_port: int) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)

    async def stats(_request: web.Request) -> web.Response:
        return web.json_response(host.stats())

    app = web.Application()
    app.router.add_get("/stats", stats)
    stats_server = AppServer(app, "127.0.0.1", stats_port)
    await host.start()
    await stats_server.start()
    try:
        print(f"ready {len(host.agents)} stats {stats_server.url}", flush=True)
        await stop.wait()
    finally:
        await stats_server.stop()
        await host.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckpt_e2e.multiagent", description=__doc__.split("\n")[0])
    parser.add_argument("--pods-file", type=Path, required=True, help="JSON list of {name, namespace, ip}")
    parser.add_argument("--token-file", type=Path, required=True, help="static bearer token callers present")
    parser.add_argument("--initial-version", required=True)
    parser.add_argument("--port", type=int, default=DEFAULT_AGENT_PORT)
    parser.add_argument("--stats-port", type=int, default=0)
    parser.add_argument("--load-seconds", type=float, default=0.0, help="simulated apply time per load")
    parser.add_argument("--no-report", dest="report", action="store_false", help="no CR/pod status reports")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    host = MultiAgentHost(
        read_pods(args.pods_file),
        token_file=args.token_file,
        initial_version=args.initial_version,
        port=args.port,
        report=args.report,
        load_seconds=args.load_seconds,
    )
    # A thousand agents' heaps in one process: without this, its full collections scan all of
    # them, a cost no agent pod (one agent, one heap) has.
    process_runtime.tune_gc()
    process_runtime.run(_serve(host, args.stats_port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
