"""The environment of `python -m ckpt_e2e.bench controlplane` (test harness only): a local control
plane with the CRD, a null-engine fleet of N kwok pods, and the operator as a child process
whose metrics and RSS the bench reads."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml
from kubernetes import client, config

from ckpt_api import process_runtime
from ckpt_api.agent_api import PREFER_HEADER, RESPOND_ASYNC, AgentStatus, UpdateWeightsRequest
from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.crd import render_crd
from ckpt_api.vocabulary import TERMINAL_PHASES, ConditionStatus, KubeConditionType
from ckpt_rollout.io.agent_http import AgentHttp, Endpoint

from ..cluster import ClusterOptions, LocalCluster
from ..nullfleet import NullFleet
from ..procs import PortReservation, wait_for
from ..provision import resolve
from ..rollout_env import AGENT_PORT, OperatorProcess, Rollouts, http_text, metric_value

CONTROL_PLANE = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]
NAMESPACE = "bench"
TERMINAL = tuple(sorted(TERMINAL_PHASES))


class BenchEnv:
    def __init__(
        self,
        workdir: Path,
        workers: int,
        *,
        hosts: int | None = None,
        load_seconds: float = 0.0,
        agent_reports: bool = True,
        say: Callable[[str], None] = print,
    ) -> None:
        self.workdir = workdir
        self.workers = workers
        self._hosts = hosts
        self._load_seconds = load_seconds
        self._agent_reports = agent_reports
        self._say = say
        self._stack = ExitStack()
        self.labels = {"app": "rollout-worker"}
        self.timings: dict[str, float] = {}
        self._rss_peak_kb = 0

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> BenchEnv:
        try:
            self._start()
        except BaseException:
            self._stack.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stack.close()

    def _start(self) -> None:
        t0 = time.monotonic()
        self._say("control plane (cached binaries, else built from Go modules)")
        binaries = resolve(CONTROL_PLANE)
        self.cluster = self._stack.enter_context(
            LocalCluster(binaries, ClusterOptions(workdir=self.workdir / "cluster"))
        )
        self.timings["cluster_s"] = time.monotonic() - t0
        self.api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.cluster.kubeconfig)
        )
        self._stack.callback(self.api.close)
        install_crd(self.api)
        create_namespace(self.api, NAMESPACE)
        token_file = self.workdir / "agent-token"
        token_file.write_text(secrets.token_urlsafe(32))
        token_file.chmod(0o600)
        self.token = token_file.read_text()

        self._say(f"{self.workers} kwok pods, null-engine agents on their pod IPs")
        self.fleet = NullFleet(
            self.api,
            NAMESPACE,
            self.workers,
            self.cluster.kubeconfig,
            token_file,
            self.workdir,
            initial_version="v0",
            labels=self.labels,
            hosts=self._hosts,
            load_seconds=self._load_seconds,
            report=self._agent_reports,
        )
        self._stack.enter_context(self.fleet)
        self.timings.update(self.fleet.timings)

        # The operator's metrics server takes no port 0 it could report: held while it runs.
        (metrics_port,) = self._stack.enter_context(PortReservation(1)).ports
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.operator = OperatorProcess(
            self.cluster.kubeconfig,
            NAMESPACE,
            token_file,
            self.workdir,
            # The later flags win: metrics on, and agents on a loaded machine get real timeouts.
            extra_args=["--metrics-port", str(metrics_port), "--agent-timeout", "30"],
            # The null fleet's hosted agents (ckpt_e2e.multiagent) serve plain http: this bench
            # measures the control plane, not handshakes.
            agent_tls=False,
        )
        self.operator.start()
        self._stack.callback(self.operator.stop)
        wait_for(lambda: self._metrics_text() is not None, 60, "operator metrics endpoint")
        # A running operator has its pods listed already: its start-up list of N pods is not
        # billed to the rollout measured next.
        self._wait_operator_idle()
        self.rollouts = Rollouts(self.api, NAMESPACE)
        self.timings["setup_s"] = time.monotonic() - t0

    def _wait_operator_idle(self, window_s: float = 1.0, busy_s: float = 0.02) -> None:
        """Until the operator spends under ``busy_s`` CPU seconds in a ``window_s`` window."""
        assert self.operator.proc is not None
        pid = self.operator.proc.pid
        last: list[float] = []  # the reading one window ago

        def idle() -> bool:
            now = _cpu_seconds(pid)
            spent = now - last[0] if last else None
            last[:] = [now]
            return spent is not None and spent < busy_s

        wait_for(idle, 120, "operator idle after its start-up lists", interval=window_s)

    # -- the rollout ----------------------------------------------------------------------------
    def create_rollout(self, name: str, spec: dict[str, Any]) -> None:
        self.rollouts.create(name, spec)

    def wait_terminal(self, name: str, timeout: float) -> str:
        """The phase the operator reports once terminal, from its phase gauge (no API calls);
        samples the operator's RSS meanwhile. "Timeout" if none within `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._sample_rss()
            if not self.operator.alive:
                raise RuntimeError(f"the operator exited; see {self.operator.log_path}")
            # Only the phase gauge: a full scrape (process collector and all) ten times a
            # second would bill the operator's CPU for the bench's own watching.
            text = self._metrics_text("ckpt_rollout_phase") or ""
            for phase in TERMINAL:
                if metric_value(text, "ckpt_rollout_phase", {"name": name, "phase": phase}) == 1:
                    return phase
            time.sleep(0.1)
        return "Timeout"

    def rollout_status(self, name: str) -> dict[str, Any]:
        return self.rollouts.status(name)

    # -- readings -------------------------------------------------------------------------------
    def _metrics_text(self, only: str | None = None) -> str | None:
        url = f"{self.metrics_url}?name[]={only}" if only else self.metrics_url
        try:
            return http_text(url, timeout=10)
        except OSError:
            return None

    def operator_status_requests(self) -> float:
        return metric_value(self._metrics_text() or "", "ckpt_rollout_api_requests_total")

    def apiserver_metrics(self) -> str:
        return str(self.cluster.admin_api().request("GET", "/metrics", timeout=30))

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds used so far by the operator, each control-plane process and the agent
        hosts (summed): where a rollout's time goes on a machine with few cores."""
        assert self.operator.proc is not None
        pids = {"operator": [self.operator.proc.pid], "agents": self.fleet.pids}
        pids.update({name: [pid] for name, pid in self.cluster.pids.items()})
        return {name: sum(_cpu_seconds(pid) for pid in group) for name, group in pids.items()}

    def _proc_status_kb(self, field: str) -> int:
        assert self.operator.proc is not None
        for line in Path(f"/proc/{self.operator.proc.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
        return 0

    def _sample_rss(self) -> None:
        self._rss_peak_kb = max(self._rss_peak_kb, self._proc_status_kb("VmRSS"))

    def operator_peak_rss_mb(self) -> float:
        """Peak RSS over the operator's life: the kernel's high-water mark, else our samples."""
        self._sample_rss()
        return max(self._rss_peak_kb, self._proc_status_kb("VmHWM")) / 1024

    def ideal_wave(self, size: int, concurrency: int, version: str) -> float:
        """Seconds for the bench itself to take `size` agents to `version` with nothing else:
        call each at `concurrency` (no rollout reference, so no CR bookkeeping), then poll
        /v1/status until all serve it. The floor any orchestrator's wave has on this machine,
        measured in the same run; the agents' pod-condition patches happen as in a rollout."""
        return process_runtime.run(self._ideal_wave(size, concurrency, version))

    async def _ideal_wave(self, size: int, concurrency: int, version: str) -> float:
        ips = sorted(p.ip for p in self.fleet.pods())[:size]
        sem = asyncio.Semaphore(concurrency)
        auth = {"Authorization": f"Bearer {self.token}"}
        # The operator's own HTTP to agents: the floor is then what orchestration adds.
        http = AgentHttp(max_connections=256)
        # Asynchronous, as the operator's calls: 202 at once, then the polls below.
        call_headers = {**auth, PREFER_HEADER: RESPOND_ASYNC, "Content-Type": "application/json"}
        body = json.dumps(UpdateWeightsRequest(version=version).to_wire()).encode()

        async def call(ip: str) -> None:
            async with sem:
                where = Endpoint(ip, AGENT_PORT)
                await http.request(where, "POST", "/v1/update_weights", call_headers, body, 30)

        async def serves(ip: str) -> bool:
            async with sem:
                answer = await http.request(Endpoint(ip, AGENT_PORT), "GET", "/v1/status", auth, None, 30)
            return AgentStatus.model_validate_json(answer.body).version == version

        try:
            started = time.monotonic()
            await asyncio.gather(*(call(ip) for ip in ips))
            pending = ips
            while pending:
                done = await asyncio.gather(*(serves(ip) for ip in pending))
                pending = [ip for ip, ok in zip(pending, done, strict=True) if not ok]
                if pending:
                    await asyncio.sleep(0.05)
            return time.monotonic() - started
        finally:
            http.close()


def _cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    # utime and stime are fields 14 and 15 of stat(5); fields[0] here is field 3 (state).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def install_crd(api: client.ApiClient) -> None:
    """Install the CheckpointRollout CRD and wait until its objects are served."""
    ext = client.ApiextensionsV1Api(api)
    body = yaml.safe_load(render_crd())
    ext.create_custom_resource_definition(body)

    def established() -> bool:
        crd = ext.read_custom_resource_definition(body["metadata"]["name"])
        return any(
            c.type == KubeConditionType.ESTABLISHED and c.status == ConditionStatus.TRUE
            for c in crd.status.conditions or []
        )

    wait_for(established, 60, "CRD Established", interval=0.2)
    # Established is not served yet: until the watch cache is initialized, lists get 429
    # ("storage is (re)initializing") and kopf backs off for up to a minute — a delay
    # that would land inside the measured rollout.
    custom = client.CustomObjectsApi(api)

    def served() -> bool:
        try:
            custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        except client.ApiException as exc:
            if exc.status == 429:
                return False
            raise
        return True

    wait_for(served, 60, "CheckpointRollouts served", interval=0.2)


def create_namespace(api: client.ApiClient, name: str) -> None:
    """Create namespace `name` and wait for its default ServiceAccount."""
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def default_sa() -> bool:
        return any(
            sa.metadata is not None and sa.metadata.name == "default"
            for sa in core.list_namespaced_service_account(name).items
        )

    wait_for(default_sa, 60, f"ServiceAccount {name}/default", interval=0.2)
