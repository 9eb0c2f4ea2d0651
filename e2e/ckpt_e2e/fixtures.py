"""pytest plugin: a session cluster, a fresh namespace per test, kubectl and pod runtimes.

Load it from a conftest with ``from ckpt_e2e.fixtures import *``.

Cluster provider: ``CKPT_E2E_KUBECONFIG`` set -> that cluster (e.g. kind) is used as is and
nothing is built; otherwise the pinned binaries are provisioned (cache, else Go build) and a
local control plane is started for the session.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from kubernetes import client, config

from .cluster import ClusterOptions, LocalCluster
from .kubectl import Kubectl
from .podruntime import CommandFactory, PodRuntime
from .procs import wait_for
from .provision import ProvisionError, resolve

__all__ = ["ClusterHandle", "cluster", "fresh_namespace", "k8s_api", "kubectl", "namespace", "pod_runtime"]

CONTROL_PLANE = ["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok"]


@dataclass
class ClusterHandle:
    kubeconfig: Path
    kubectl: Kubectl
    local: LocalCluster | None  # None when an existing cluster is used

    def api_client(self) -> client.ApiClient:
        api: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
            config_file=str(self.kubeconfig)
        )
        return api


def _kubectl_binary(existing_cluster: bool) -> Path:
    try:
        return resolve(["kubectl"])["kubectl"]
    except ProvisionError:
        # With an existing cluster nothing is built; a kubectl on PATH is what its user has.
        found = shutil.which("kubectl") if existing_cluster else None
        if found is None:
            raise
        return Path(found)


@pytest.fixture(scope="session")
def cluster() -> Iterator[ClusterHandle]:
    if existing := os.environ.get("CKPT_E2E_KUBECONFIG"):
        kubeconfig = Path(existing)
        yield ClusterHandle(kubeconfig, Kubectl(_kubectl_binary(True), kubeconfig), None)
        return
    binaries = resolve(CONTROL_PLANE)
    with LocalCluster(binaries, ClusterOptions()) as local:
        handle = ClusterHandle(local.kubeconfig, Kubectl(_kubectl_binary(False), local.kubeconfig), local)
        yield handle


@pytest.fixture(scope="session")
def k8s_api(cluster: ClusterHandle) -> Iterator[client.ApiClient]:
    api = cluster.api_client()
    yield api
    api.close()  # type: ignore[no-untyped-call]


def _namespace_name(test_name: str) -> str:
    stem = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:40].rstrip("-")
    return f"{stem or 't'}-{secrets.token_hex(3)}"


@contextmanager
def fresh_namespace(api: client.ApiClient, test_name: str) -> Iterator[str]:
    """A new namespace named after the test, ready for pods (its `default` ServiceAccount
    exists); deleted after the block."""
    core = client.CoreV1Api(api)
    name = _namespace_name(test_name)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))

    def default_sa() -> bool:
        accounts = core.list_namespaced_service_account(name).items
        return any(sa.metadata is not None and sa.metadata.name == "default" for sa in accounts)

    wait_for(default_sa, 30, f"ServiceAccount {name}/default")
    try:
        yield name
    finally:
        # Deletion is asynchronous (the namespace controller drains it); tests never reuse names.
        core.delete_namespace(name)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, k8s_api: client.ApiClient) -> Iterator[str]:
    """A fresh namespace, ready for pods (its `default` ServiceAccount exists)."""
    with fresh_namespace(k8s_api, request.node.name) as name:
        yield name


@pytest.fixture
def kubectl(cluster: ClusterHandle, namespace: str) -> Kubectl:
    """kubectl bound to the test's namespace."""
    return cluster.kubectl.in_namespace(namespace)


PodRuntimeFactory = Callable[[str, CommandFactory], PodRuntime]


@pytest.fixture
def pod_runtime(k8s_api: client.ApiClient, namespace: str, tmp_path: Path) -> Iterator[PodRuntimeFactory]:
    """Factory: ``pod_runtime("app=worker", command)`` starts a PodRuntime in the namespace;
    all are stopped at teardown, before the namespace goes."""
    started: list[PodRuntime] = []

    def make(label_selector: str, command: CommandFactory) -> PodRuntime:
        log_dir = tmp_path / f"pods-{len(started)}"
        runtime = PodRuntime(k8s_api, namespace, label_selector, command, log_dir)
        started.append(runtime.start())
        return runtime

    yield make
    for runtime in reversed(started):
        runtime.stop()
