"""The real-node cluster for tests: a local control plane with one real kubelet node beside a
kwok node (realnode.py), what users install on it, and the scenario provider that uses it.

On it, as on a user's cluster:
- the operator is the chart's own Deployment (`helm upgrade --install` of charts/ckpt-rollout,
  the operator image `make images` built, imported into the node's containerd), one release for
  the session, watching every namespace;
- workers are examples/worker-deployment.yaml with the worker image (CPU paddle): the chart's
  worker RBAC, the `rollout.ckpt.dev/WeightsReady` readiness gate, the agent bound to $POD_IP;
- the checkpoint source is `ckpt-rollout serve` of the session's scenario catalog on the host
  end of the node's veth, the one host address pods reach (so it can be frozen with SIGSTOP as
  on the local provider);
- the test reaches pods by IP (the host routes the node's pod subnet), as the operator does.

Fixtures: `real_cluster` (session; skipped when CKPT_E2E_KUBECONFIG names another cluster),
`real_node_env` (session: images, source, chart), `real_node_provider` (per test: a fresh
namespace on that cluster). `provider` (providers.py) hands out the latter for
`@pytest.mark.parametrize("provider", ["local", "real-node"], indirect=True)`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import pytest

from . import images
from .cluster import ClusterOptions, LocalCluster
from .fixtures import CONTROL_PLANE, ClusterHandle, _kubectl_binary, fresh_namespace
from .images import Built
from .kubeapi import is_ready
from .kubectl import Kubectl
from .providers import (
    CHART,
    ExistingFleet,
    ExistingProvider,
    ExistingSettings,
    helm_binary,
    relay_token_for,
    worker_pod_deployment,
)
from .provision import resolve
from .realnode import BINARIES as REAL_NODE_BINARIES
from .realnode import RealNode, placement
from .rollout_env import (
    AGENT_SETTINGS_FILE,
    WORKER_LABEL,
    CheckpointSource,
    Rollouts,
    Worker,
    pod_flags,
    serve_checkpoints,
)

__all__ = ["RealNodeEnv", "RealNodeProvider", "real_cluster", "real_node_env", "real_node_provider"]

OPERATOR_IMAGE = images.IMAGES["operator"].tag
WORKER_IMAGE = images.IMAGES["worker-cpu"].tag
RELEASE = "ckpt-rollout"
SYSTEM_NAMESPACE = "ckpt-rollout-system"


@pytest.fixture(scope="session")
def real_cluster() -> Iterator[ClusterHandle]:
    """A local control plane with one kwok node and the real node."""
    if os.environ.get("CKPT_E2E_KUBECONFIG"):
        pytest.skip("the real node joins the local control plane (CKPT_E2E_KUBECONFIG names another)")
    binaries = resolve([*CONTROL_PLANE, *REAL_NODE_BINARIES])
    with LocalCluster(binaries, ClusterOptions(nodes=1, real_node=True)) as local:
        yield ClusterHandle(local.kubeconfig, Kubectl(_kubectl_binary(False), local.kubeconfig), local)


def real_node_of(handle: ClusterHandle) -> RealNode:
    assert handle.local is not None
    assert handle.local.real_node is not None
    return handle.local.real_node


def chart_values() -> dict[str, Any]:
    """The chart's defaults but the image, and the operator pinned to the real node."""
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    # Agents run --plain-http there (see providers.worker_pod_deployment).
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "agentTLS": {"enabled": False},
        **placement(),
    }


@dataclass
class RealNodeEnv:
    handle: ClusterHandle
    source: CheckpointSource
    helm: Path
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def node(self) -> RealNode:
        return real_node_of(self.handle)

    @property
    def settings(self) -> ExistingSettings:
        return ExistingSettings(
            source_uri=self.source.url,
            worker_image=WORKER_IMAGE,
            operator_namespace=SYSTEM_NAMESPACE,
            operator_release=RELEASE,
            operator_account=RELEASE,
        )

    def helm_run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.helm), "--kubeconfig", str(self.handle.kubeconfig), *args],
            capture_output=True, text=True, check=False, timeout=timeout,
        )  # fmt: skip
        assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr}\n{self.diagnose()}"
        return done

    def diagnose(self) -> str:
        """What went wrong on the node: the system namespace's pods, events and last logs."""
        kubectl = self.handle.kubectl.in_namespace(SYSTEM_NAMESPACE)
        runs = [
            kubectl.run(*args, check=False)
            for args in (
                ("get", "pods", "-o", "wide"),
                ("get", "events", "--sort-by=.lastTimestamp"),
                ("logs", f"deployment/{RELEASE}", "--tail=30", "--all-containers"),
            )
        ]
        return "\n".join(r.stdout + r.stderr for r in runs)


@pytest.fixture(scope="session")
def real_node_env(
    real_cluster: ClusterHandle,
    built_images: dict[str, Built],
    checkpoint_source: CheckpointSource,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RealNodeEnv]:
    """Images in the node's containerd, the catalog served where pods reach it, the chart
    installed (its operator pod Ready)."""
    node = real_node_of(real_cluster)
    work = tmp_path_factory.mktemp("real-node")
    t0 = time.monotonic()
    took = node.import_images([OPERATOR_IMAGE, WORKER_IMAGE])
    timings = {f"import {tag}": seconds for tag, seconds in took.items()}
    with serve_checkpoints(checkpoint_source.root, work, host=node.net.host_ip) as source:
        env = RealNodeEnv(real_cluster, source, helm_binary(), timings)
        values = work / "values.json"
        values.write_text(json.dumps(chart_values()))
        started = time.monotonic()
        env.helm_run(
            "upgrade", "--install", RELEASE, str(CHART), "--namespace", SYSTEM_NAMESPACE,
            "--create-namespace", "--values", str(values), "--wait", "--timeout", "4m",
        )  # fmt: skip
        env.timings["helm install --wait"] = time.monotonic() - started
        env.timings["total"] = time.monotonic() - t0
        print(f"real node: {', '.join(f'{k} {v:.1f}s' for k, v in env.timings.items())}")
        yield env


class RealNodeFleet(ExistingFleet):
    def _worker(self, pod: dict[str, Any]) -> Worker | None:
        ip = pod["status"].get("podIP")
        # Plain http, as on the kind path (agent_flags without tls; chart agentTLS.enabled false).
        return Worker(pod["metadata"]["name"], ip, scheme="http") if ip else None


@dataclass
class RealNodeProvider(ExistingProvider):
    """The existing-cluster provider (the kind path's) on the real node, plus what only a
    control plane of our own allows: restarting kube-apiserver, freezing the source process."""

    kind: ClassVar[str] = "real-node"
    env: RealNodeEnv | None = None

    def _start_fleet(
        self, replicas: int, name: str, initial_version: str, extra_args: list[str]
    ) -> RealNodeFleet:
        self._worker_rbac()
        labels = {"app": WORKER_LABEL, "fleet": name}
        # $(POD_IP): the kubelet expands it from the container's env, as examples/ binds. The
        # rest is the namespace's settings file (_worker_rbac: the chart's ConfigMap).
        assert self.kubectl.namespace is not None
        args = ["--config", AGENT_SETTINGS_FILE, *pod_flags("$(POD_IP)", initial_version, extra_args)]
        self.kubectl.apply(
            relay_token_for(
                real_node_deployment(name, replicas, labels, args, plain_http=True), self.kubectl.namespace
            )
        )
        fleet = RealNodeFleet(name, labels, self.token(), self.kubectl, self.log_dir)
        self.fleets.append(fleet)
        fleet.workers(replicas)
        return fleet

    def apiserver_down(self) -> AbstractContextManager[None]:
        assert self.env is not None
        assert self.env.handle.local is not None
        return self.env.handle.local.apiserver_down()

    @contextmanager
    def source_stalled(self) -> Iterator[None]:
        assert self.env is not None
        assert self.env.source.proc is not None
        pid = self.env.source.proc.pid
        os.killpg(pid, signal.SIGSTOP)  # its socket still completes handshakes: clients wait
        try:
            yield
        finally:
            os.killpg(pid, signal.SIGCONT)


def real_node_deployment(
    name: str,
    replicas: int,
    labels: dict[str, str],
    args: list[str],
    image: str = WORKER_IMAGE,
    *,
    plain_http: bool = False,
) -> dict[str, Any]:
    """examples/worker-deployment.yaml for the real node: its image from containerd (never
    pulled), pinned to the node."""
    deployment = worker_pod_deployment(name, replicas, labels, image, args, plain_http=plain_http)
    pod = deployment["spec"]["template"]["spec"]
    pod.update(placement())
    pod["containers"][0]["imagePullPolicy"] = "Never"
    # Replaced pods go at once: a scenario that kills one waits for its successor, not for 30 s.
    pod["terminationGracePeriodSeconds"] = 5
    return deployment


@pytest.fixture
def real_node_provider(
    request: pytest.FixtureRequest, real_node_env: RealNodeEnv, tmp_path: Path
) -> Iterator[RealNodeProvider]:
    handle = real_node_env.handle
    api = handle.api_client()
    try:
        with fresh_namespace(api, request.node.name) as namespace:
            settings = real_node_env.settings
            chosen = RealNodeProvider(
                kubeconfig=handle.kubeconfig,
                namespace=namespace,
                kubectl=handle.kubectl.in_namespace(namespace),
                rollouts=Rollouts(api, namespace),
                source_uri=settings.source_uri,
                versions=real_node_env.source.root,
                settings=settings,
                log_dir=tmp_path / "real-node",
                env=real_node_env,
            )
            try:
                yield chosen
            finally:
                chosen.close()
    finally:
        api.close()  # type: ignore[no-untyped-call]


pod_ready = is_ready
