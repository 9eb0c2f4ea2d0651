"""Cluster providers: the scenario suite (e2e/tests/test_scenarios.py) runs unchanged on the
local control plane (default, what CI runs) or on any cluster named by CKPT_E2E_KUBECONFIG
(the kind path, e2e/kind/run.sh). A scenario asks its provider for a worker fleet, the
checkpoint source and the faults it injects; everything else (the CR, events, what each agent
serves) it reads the same way on both.

| | local | existing (CKPT_E2E_KUBECONFIG) |
| --- | --- | --- |
| operator | `ckpt-rollout operator`, a child process | the Helm-installed Deployment |
| workers | kwok pods, an agent process per pod (PodRuntime) | worker image pods (examples/) |
| checkpoint source | `ckpt-rollout serve` on loopback | Service ckpt-src (e2e/kind/manifests) |
| versions | `catalog.build` into a temp dir | `catalog.py` in the source's init container |
| reaching agents | pod IPs (loopback) | one `kubectl port-forward` per pod |
| kill the operator | SIGKILL the process, start another | `kubectl delete pod --force` |
| crash a worker | SIGKILL its agent mid-load, delete its pod | `kubectl delete pod --force` |
| restart kube-apiserver | stop and start the process | skipped (not our control plane) |
| freeze the source | SIGSTOP/SIGCONT `serve` | the same, through `kubectl exec` |

A third, `real-node` (realnode_env.py, ``provider`` parametrized indirectly), is the existing
provider on the local control plane's real kubelet node: chart-installed operator pod,
worker-image pods reached by pod IP, `serve` on the node's host address (frozen with SIGSTOP),
kube-apiserver restarted as on the local provider.

In all, a crashed worker's pod is replaced by its Deployment: the replacement boots on the
fleet's initial version and the rollout brings it to the target.
"""

from __future__ import annotations

import copy
import os
import re
import signal
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pytest
import yaml

from ckpt_api.constants import agent_audience
from ckpt_api.vocabulary import (
    COMPONENT_LABEL,
    INSTANCE_LABEL,
    AgentState,
    PodPhase,
)

from .catalog import build as build_catalog
from .catalog import model_flags
from .fixtures import ClusterHandle
from .kubeapi import is_ready
from .kubectl import Kubectl
from .kwok_stages import KUBELET_STOP_LABEL
from .procs import WaitTimeout, spawn, stop, wait_for
from .rollout_env import (
    AGENT_PORT,
    AGENT_SETTINGS_DIR,
    AGENT_SETTINGS_FILE,
    CLI,
    EXAMPLE_RELAY,
    WORKER_LABEL,
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    Worker,
    agent_settings,
    agent_state,
    http_json,
    pod_flags,
    rollout_spec,
)
from .rollout_fixtures import Fleet

# The chart rendering moved to serviceaccounts; these names stay importable from here.
from .serviceaccounts import CHART as CHART
from .serviceaccounts import apply_worker_rbac as apply_worker_rbac
from .serviceaccounts import delete_worker_rbac as delete_worker_rbac
from .serviceaccounts import helm_binary as helm_binary

__all__ = ["ExistingProvider", "LocalProvider", "Provider", "WorkerFleet", "provider", "scenario_catalog"]

ROOT = Path(__file__).resolve().parents[2]
WORKER_EXAMPLE = ROOT / "examples" / "worker-deployment.yaml"


class WorkerFleet(Protocol):
    """A Deployment of worker pods whose agents the test can reach."""

    name: str
    labels: dict[str, str]
    token: str  # accepted by the agents (the operator's identity)

    def workers(self, count: int) -> list[Worker]:
        """Wait until exactly ``count`` pods' agents answer; sorted by pod name."""
        ...

    def scale(self, replicas: int) -> None: ...


@dataclass
class Provider(ABC):
    kind: ClassVar[str]
    kubeconfig: Path
    namespace: str
    kubectl: Kubectl  # bound to the test's namespace
    rollouts: Rollouts
    source_uri: str  # spec.source.uri: where agents pull versions from
    versions: Path  # a local copy of the catalog: what each version must answer

    def version_dir(self, version: str) -> Path:
        return self.versions / version

    def spec(self, version: str, fleet: WorkerFleet, **extra: Any) -> dict[str, Any]:
        return rollout_spec(self.source_uri, version, fleet.labels, **extra)

    def cli(self, *args: str) -> str:
        """`ckpt-rollout ARGS -n NAMESPACE` with the cluster's kubeconfig, as a user runs it."""
        result = subprocess.run(
            [*CLI, *args, "-n", self.namespace],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
        )
        assert result.returncode == 0, f"ckpt-rollout {' '.join(args)}: {result.stderr}"
        return result.stdout

    def fleet(
        self,
        replicas: int,
        *,
        name: str = "workers",
        initial_version: str = "v1",
        big: bool = False,
        extra_args: list[str] | None = None,
        at_rest: bool = True,
    ) -> WorkerFleet:
        """A worker Deployment whose agents boot on ``initial_version``; returns once every
        agent has finished that boot load (a scenario starts from a fleet at rest), or, with
        ``at_rest=False``, once every agent answers (its boot load may still run)."""
        fleet = self._start_fleet(replicas, name, initial_version, [*(extra_args or []), *model_flags(big)])
        if not at_rest:
            return fleet

        states: dict[str, str | None] = {}

        def resting() -> bool:
            states.update({w.name: agent_state(w, fleet.token) for w in fleet.workers(replicas)})
            return all(state == AgentState.IDLE for state in states.values())

        # Generous: on the real node these are containers of the CPU image booting a 100 MB
        # model each on a shared 2-core machine (120 s was once not enough under load).
        try:
            wait_for(resting, 300, f"{replicas} agents done loading {initial_version}", interval=0.2)
        except WaitTimeout as exc:
            raise WaitTimeout(f"{exc}; agent states: {states}") from None
        return fleet

    @abstractmethod
    def _start_fleet(
        self, replicas: int, name: str, initial_version: str, extra_args: list[str]
    ) -> WorkerFleet:
        """Create the Deployment; return once ``replicas`` agents answer."""

    @abstractmethod
    def kill_operator(self) -> None:
        """The operator dies at once: no cleanup, no last status write."""

    @abstractmethod
    def start_operator(self) -> None:
        """Returns once a fresh operator runs."""

    @abstractmethod
    def crash_worker(self, fleet: WorkerFleet, pod: str) -> None:
        """The pod's agent dies where it stands and the pod goes; its Deployment replaces it."""

    @abstractmethod
    def stops_like_a_kubelet(self, pod: str) -> None:
        """From now on ``pod``, once deleted, stays (being deleted) until its agent has stopped,
        then goes: its agent's last reports land while the pod still exists. A kubelet does so
        for every pod (within the grace period)."""

    @abstractmethod
    def apiserver_down(self) -> AbstractContextManager[None]:
        """kube-apiserver is down for the block and back (same data) after it."""

    @abstractmethod
    def source_stalled(self) -> AbstractContextManager[None]:
        """For the block the checkpoint source takes connections and answers nothing (frozen):
        loads that need it stay in progress, a moment a scenario can act in."""

    @abstractmethod
    def operator_log(self) -> str:
        """What the running operator logged so far."""

    @abstractmethod
    def close(self) -> None:
        """Release what the provider started for the test."""


# --------------------------------------------------------------------------- local


@dataclass
class LocalProvider(Provider):
    kind: ClassVar[str] = "local"
    handle: ClusterHandle
    source: CheckpointSource
    operator: OperatorProcess
    make_fleet: Callable[..., Fleet]

    def _start_fleet(
        self, replicas: int, name: str, initial_version: str, extra_args: list[str]
    ) -> WorkerFleet:
        fleet: WorkerFleet = self.make_fleet(
            replicas, name=name, initial_version=initial_version, extra_args=extra_args
        )
        return fleet

    def kill_operator(self) -> None:
        self.operator.kill()

    def start_operator(self) -> None:
        self.operator.start()

    def crash_worker(self, fleet: WorkerFleet, pod: str) -> None:
        assert isinstance(fleet, Fleet)
        process = fleet.runtime.running()[pod]
        os.killpg(process.pid, signal.SIGKILL)
        process.proc.wait()
        # kwok keeps a pod Running whatever its "container" does: the pod goes, as the node
        # would report it on a real cluster, and the Deployment replaces it.
        self.kubectl.run("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false")

    def stops_like_a_kubelet(self, pod: str) -> None:
        # kwok deletes a pod being deleted at once, but not one with this label: the pod
        # runtime deletes it once it stopped its process.
        self.kubectl.run("label", "pod", pod, f"{KUBELET_STOP_LABEL}=true")

    def apiserver_down(self) -> AbstractContextManager[None]:
        assert self.handle.local is not None
        return self.handle.local.apiserver_down()

    @contextmanager
    def source_stalled(self) -> Iterator[None]:
        assert self.source.proc is not None
        # Stopped, its listening socket still completes handshakes: clients wait, not fail.
        os.killpg(self.source.proc.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.killpg(self.source.proc.pid, signal.SIGCONT)

    def operator_log(self) -> str:
        return self.operator.log_path.read_text(errors="replace")

    def close(self) -> None:
        """Nothing: the operator and fleet fixtures stop what they started."""


# --------------------------------------------------------------------------- existing cluster


@dataclass(frozen=True)
class ExistingSettings:
    """What e2e/kind/run.sh installed; override with the environment for another cluster."""

    source_uri: str = "http://ckpt-src.ckpt-e2e.svc:8080"
    source_namespace: str = "ckpt-e2e"
    source_deployment: str = "ckpt-src"
    worker_image: str = "ckpt-rollout-worker:e2e"
    operator_namespace: str = "ckpt-rollout-system"
    operator_release: str = "ckpt-rollout"
    operator_account: str = "ckpt-rollout"

    @classmethod
    def from_env(cls) -> ExistingSettings:
        env = os.environ.get
        d = cls()
        return cls(
            source_uri=env("CKPT_E2E_SOURCE_URL", d.source_uri),
            source_namespace=env("CKPT_E2E_SOURCE_NAMESPACE", d.source_namespace),
            source_deployment=env("CKPT_E2E_SOURCE_DEPLOYMENT", d.source_deployment),
            worker_image=env("CKPT_E2E_WORKER_IMAGE", d.worker_image),
            operator_namespace=env("CKPT_E2E_OPERATOR_NAMESPACE", d.operator_namespace),
            operator_release=env("CKPT_E2E_OPERATOR_RELEASE", d.operator_release),
            operator_account=env("CKPT_E2E_OPERATOR_ACCOUNT", d.operator_account),
        )

    @property
    def operator_username(self) -> str:
        return f"system:serviceaccount:{self.operator_namespace}:{self.operator_account}"

    @property
    def operator_selector(self) -> str:
        return f"{INSTANCE_LABEL}={self.operator_release},{COMPONENT_LABEL}=operator"


def worker_pod_deployment(
    name: str, replicas: int, labels: dict[str, str], image: str, args: list[str], *, plain_http: bool = False
) -> dict[str, Any]:
    """examples/worker-deployment.yaml (what users deploy) with this fleet's name, labels,
    image and agent flags, and requests small enough for a laptop's kind cluster. ``plain_http``:
    the agents serve plain http by their settings file (as --plain-http among ``args`` says)."""
    deployment: dict[str, Any] = copy.deepcopy(yaml.safe_load(WORKER_EXAMPLE.read_text()))
    deployment["metadata"] = {"name": name, "labels": dict(labels)}
    spec = deployment["spec"]
    spec["replicas"] = replicas
    spec["selector"] = {"matchLabels": dict(labels)}
    spec["template"]["metadata"]["labels"] = dict(labels)
    container = spec["template"]["spec"]["containers"][0]
    container["image"] = image
    container["args"] = args
    if any(a == "--config" or a.startswith("--config=") for a in args):
        mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
        if mounts.get("agent-settings") != AGENT_SETTINGS_DIR:
            raise ValueError(f"{WORKER_EXAMPLE}: no ConfigMap volume agent-settings at {AGENT_SETTINGS_DIR}")
    else:
        _without_agent_settings(spec["template"]["spec"])
    container["resources"] = {"requests": {"cpu": "100m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}}
    if plain_http or "--plain-http" in args:
        _without_tls(spec["template"]["spec"])
    return deployment


def _without_agent_settings(pod: dict[str, Any]) -> None:
    """The example's settings ConfigMap unmounted, for agents given only flags: their namespace
    may have no ConfigMap ckpt-rollout-agent, and a missing one would hold the pod unstarted."""
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "agent-settings"]
    container = pod["containers"][0]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "agent-settings"]


def relay_token_for(deployment: dict[str, Any], namespace: str) -> dict[str, Any]:
    """The example's projected relay token (for namespace rl's agents) made ``namespace``'s."""
    for volume in deployment["spec"]["template"]["spec"]["volumes"]:
        for source in (volume.get("projected") or {}).get("sources", []):
            if "serviceAccountToken" in source:
                source["serviceAccountToken"]["audience"] = agent_audience(namespace)
    return deployment


def _without_tls(pod: dict[str, Any]) -> None:
    """The example's TLS parts removed, for agents run --plain-http: the clusters of this
    provider install the chart with agentTLS.enabled=false (test namespaces are made per test,
    so the chart cannot issue their serving Secrets)."""
    pod["volumes"] = [v for v in pod["volumes"] if v["name"] != "agent-tls"]
    container = pod["containers"][0]
    container["volumeMounts"] = [m for m in container["volumeMounts"] if m["name"] != "agent-tls"]
    for probe in ("livenessProbe", "readinessProbe"):
        container[probe]["httpGet"].pop("scheme", None)


@dataclass
class PortForward:
    proc: subprocess.Popen[bytes]
    port: int


@dataclass
class ExistingFleet:
    name: str
    labels: dict[str, str]
    token: str
    kubectl: Kubectl
    log_dir: Path
    forwards: dict[str, PortForward] = field(default_factory=dict)  # by pod uid

    def scale(self, replicas: int) -> None:
        self.kubectl.run("scale", f"deployment/{self.name}", f"--replicas={replicas}")

    def _forward(self, pod: str, uid: str) -> PortForward | None:
        fwd = self.forwards.get(uid)
        if fwd is not None and fwd.proc.poll() is None:
            return fwd
        log = self.log_dir / f"port-forward-{pod}-{uid[:8]}.log"
        argv = [
            str(self.kubectl.binary),
            f"--kubeconfig={self.kubectl.kubeconfig}",
            f"--namespace={self.kubectl.namespace}",
            "port-forward",
            f"pod/{pod}",
            f":{AGENT_PORT}",
            "--address=127.0.0.1",
        ]
        proc = spawn(argv, log)

        def forwarding() -> int | None:
            text = log.read_text() if log.exists() else ""
            found = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", text)
            return int(found.group(1)) if found else None

        with suppress(WaitTimeout):
            wait_for(lambda: forwarding() or proc.poll() is not None, 30, f"port-forward to {pod}")
        port = forwarding()
        if port is None or proc.poll() is not None:  # e.g. the pod is not ready for it yet
            stop(proc)
            return None
        self.forwards[uid] = PortForward(proc, port)
        return self.forwards[uid]

    def _worker(self, pod: dict[str, Any]) -> Worker | None:
        """Where the test reaches this pod's agent: a port-forward (pod IPs are the cluster's)."""
        fwd = self._forward(pod["metadata"]["name"], pod["metadata"]["uid"])
        # Plain http: these agents get no serving certificate (agent_flags without tls), and the
        # chart there runs with agentTLS.enabled false.
        return None if fwd is None else Worker(pod["metadata"]["name"], "127.0.0.1", fwd.port, "http")

    def workers(self, count: int) -> list[Worker]:
        selector = ",".join(f"{k}={v}" for k, v in self.labels.items())

        def answering() -> list[Worker] | None:
            pods = self.kubectl.json("get", "pods", "-l", selector)["items"]
            running = [
                p
                for p in pods
                if p["status"].get("phase") == PodPhase.RUNNING and not p["metadata"].get("deletionTimestamp")
            ]
            if len(running) != count:
                return None
            workers = []
            for pod in running:
                worker = self._worker(pod)
                if worker is None:
                    return None
                try:
                    http_json(worker.url("/v1/status"), token=self.token, timeout=2)
                except OSError:
                    return None
                workers.append(worker)
            return sorted(workers, key=lambda w: w.name)

        return wait_for(answering, 300, f"{count} agents of {self.name} answering", interval=1.0)

    def close(self) -> None:
        for fwd in self.forwards.values():
            stop(fwd.proc)
        self.forwards.clear()


@dataclass
class ExistingProvider(Provider):
    kind: ClassVar[str] = "existing"
    settings: ExistingSettings
    log_dir: Path
    fleets: list[ExistingFleet] = field(default_factory=list)
    _token: str | None = None
    _rbac_release: str | None = None
    _killed: set[str] = field(default_factory=set)  # operator pods kill_operator deleted

    @property
    def operator_kubectl(self) -> Kubectl:
        return self.kubectl.in_namespace(self.settings.operator_namespace)

    def token(self) -> str:
        """A token of the Helm-installed operator's ServiceAccount, for the test namespace's
        agents: what the operator itself mints, so tests read agents as the operator does."""
        if self._token is None:
            assert self.kubectl.namespace is not None
            audience = agent_audience(self.kubectl.namespace)
            self._token = self.operator_kubectl.run(
                "create", "token", self.settings.operator_account, f"--audience={audience}"
            ).stdout.strip()
        return self._token

    def _worker_rbac(self) -> None:
        """The chart's worker objects in the test namespace: RBAC, and the agents' settings."""
        if self._rbac_release is None:
            assert self.kubectl.namespace is not None
            settings = agent_settings(
                self.settings.source_uri, None, EXAMPLE_RELAY, audience=agent_audience(self.kubectl.namespace)
            )
            self._rbac_release = apply_worker_rbac(self.kubectl, settings)

    def _start_fleet(
        self, replicas: int, name: str, initial_version: str, extra_args: list[str]
    ) -> WorkerFleet:
        self._worker_rbac()
        labels = {"app": WORKER_LABEL, "fleet": name}
        # 0.0.0.0, not $POD_IP: kubectl port-forward reaches the agent on the pod's loopback.
        # The rest is the namespace's settings file (_worker_rbac).
        args = ["--config", AGENT_SETTINGS_FILE, *pod_flags("0.0.0.0", initial_version, extra_args)]
        image = self.settings.worker_image
        deployment = worker_pod_deployment(name, replicas, labels, image, args, plain_http=True)
        assert self.kubectl.namespace is not None
        self.kubectl.apply(relay_token_for(deployment, self.kubectl.namespace))
        fleet = ExistingFleet(name, labels, self.token(), self.kubectl, self.log_dir)
        self.fleets.append(fleet)
        fleet.workers(replicas)
        return fleet

    def _operator_pods(self) -> list[dict[str, Any]]:
        pods: list[dict[str, Any]] = self.operator_kubectl.json(
            "get", "pods", "-l", self.settings.operator_selector
        )["items"]
        return pods

    def kill_operator(self) -> None:
        self._killed = {p["metadata"]["name"] for p in self._operator_pods()}
        assert self._killed, f"no operator pod matches {self.settings.operator_selector}"
        self.operator_kubectl.run(
            "delete",
            "pod",
            "-l",
            self.settings.operator_selector,
            "--grace-period=0",
            "--force",
            "--wait=false",
        )

    def start_operator(self) -> None:
        def fresh_ready() -> bool:
            for pod in self._operator_pods():
                if pod["metadata"]["name"] not in self._killed and is_ready(pod):
                    return True
            return False

        wait_for(fresh_ready, 180, "a new operator pod Ready", interval=1.0)

    def stops_like_a_kubelet(self, pod: str) -> None:
        """Nothing to do: a kubelet runs the pod."""

    def crash_worker(self, fleet: WorkerFleet, pod: str) -> None:
        # The agent is the container's PID 1: only the kubelet can SIGKILL it; a forced
        # delete does, and the pod is gone at once.
        self.kubectl.run("delete", "pod", pod, "--grace-period=0", "--force", "--wait=false")

    def operator_log(self) -> str:
        return self.operator_kubectl.run(
            "logs", "-l", self.settings.operator_selector, "--tail=-1", "--all-containers"
        ).stdout

    # The serve process of e2e/kind/manifests/source.yaml, found by its argv; the pod shares its
    # process namespace, so the server is not PID 1 (which ignores signals from inside).
    _SIGNAL_SERVE = (
        "import os, sys\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
        "    if argv[:4] == [b'python', b'-m', b'ckpt_agent', b'serve']:\n"
        "        os.kill(int(pid), int(sys.argv[1]))\n"
    )

    def _signal_source(self, sig: signal.Signals) -> None:
        self.kubectl.in_namespace(self.settings.source_namespace).run(
            "exec", f"deployment/{self.settings.source_deployment}", "-c", "serve", "--",
            "python", "-c", self._SIGNAL_SERVE, str(int(sig)),
        )  # fmt: skip

    @contextmanager
    def source_stalled(self) -> Iterator[None]:
        self._signal_source(signal.SIGSTOP)
        try:
            yield
        finally:
            self._signal_source(signal.SIGCONT)

    def apiserver_down(self) -> AbstractContextManager[None]:
        pytest.skip(
            "restarting kube-apiserver needs control of the control plane's processes: "
            "run on the local control plane (no CKPT_E2E_KUBECONFIG)"
        )

    def close(self) -> None:
        for fleet in self.fleets:
            fleet.close()
        if self._rbac_release is not None:
            delete_worker_rbac(self.kubectl, self._rbac_release)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def scenario_catalog(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Existing clusters: a local copy of the catalog the in-cluster source serves."""
    work = tmp_path_factory.mktemp("catalog")
    build_catalog(work / "versions", work)
    return work / "versions"


@pytest.fixture
def provider(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Provider]:
    """The local provider, or the existing-cluster one when CKPT_E2E_KUBECONFIG is set; with
    ``@pytest.mark.parametrize("provider", ["local", "real-node"], indirect=True)`` also the
    real node's (realnode_env.py: the chart's operator pod, worker-image pods under a kubelet),
    which brings its own cluster and namespace."""
    if getattr(request, "param", "local") == "real-node":
        yield request.getfixturevalue("real_node_provider")
        return
    cluster: ClusterHandle = request.getfixturevalue("cluster")
    namespace: str = request.getfixturevalue("namespace")
    kubectl: Kubectl = request.getfixturevalue("kubectl")
    rollouts: Rollouts = request.getfixturevalue("rollouts")
    chosen: Provider
    if cluster.local is not None:
        source = request.getfixturevalue("checkpoint_source")
        chosen = LocalProvider(
            kubeconfig=cluster.kubeconfig,
            namespace=namespace,
            kubectl=kubectl,
            rollouts=rollouts,
            source_uri=source.url,
            versions=source.root,
            handle=cluster,
            source=source,
            operator=request.getfixturevalue("operator"),
            make_fleet=request.getfixturevalue("fleet_factory"),
        )
    else:
        chosen = ExistingProvider(
            kubeconfig=cluster.kubeconfig,
            namespace=namespace,
            kubectl=kubectl,
            rollouts=rollouts,
            source_uri=ExistingSettings.from_env().source_uri,
            versions=request.getfixturevalue("scenario_catalog"),
            settings=ExistingSettings.from_env(),
            log_dir=tmp_path / "port-forwards",
        )
    try:
        yield chosen
    finally:
        chosen.close()
