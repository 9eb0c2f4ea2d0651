"""pytest fixtures for rollouts: CRD installed, a published checkpoint source, an operator
process, and a fleet of kwok pods running real agents. Load with
``from ckpt_e2e.rollout_fixtures import *`` in a conftest."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest
from kubernetes import client

from ckpt_api.constants import agent_audience

from .catalog import build as build_catalog
from .catalog import model_flags
from .fixtures import ClusterHandle, PodRuntimeFactory
from .kubectl import Kubectl
from .launchers import Launcher
from .pki import AgentPKI
from .podruntime import PodInfo, PodRuntime
from .rollout_env import (
    WORKER_LABEL,
    AgentOptions,
    CheckpointSource,
    MintedAgentTokens,
    OperatorProcess,
    Rollouts,
    Worker,
    ready_workers,
    serve_checkpoints,
    worker_deployment,
)
from .serviceaccounts import OPERATOR_ACCOUNT, WORKER_ACCOUNT, ChartAccounts, mint_token
from .serviceaccounts import chart_accounts as install_chart_accounts

__all__ = [
    "Fleet",
    "OperatorIdentity",
    "chart_accounts",
    "checkpoint_source",
    "crd_installed",
    "fleet_factory",
    "operator",
    "operator_identity",
    "rollouts",
]

ROOT = Path(__file__).resolve().parents[2]
CRD_FILE = ROOT / "crds" / "checkpointrollouts.rollout.ckpt.dev.yaml"


@pytest.fixture(scope="session")
def crd_installed(cluster: ClusterHandle) -> None:
    cluster.kubectl.apply(CRD_FILE)
    cluster.kubectl.run(
        "wait", "--for=condition=Established", "crd/checkpointrollouts.rollout.ckpt.dev", "--timeout=60s"
    )


@pytest.fixture(scope="session")
def checkpoint_source(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CheckpointSource]:
    """The scenario catalog (ckpt_e2e.catalog: v1-v3, big b1-b3, damaged versions), served
    over http for the whole session."""
    work = tmp_path_factory.mktemp("ckpt")
    root = work / "versions"
    digests = build_catalog(root, work)
    with serve_checkpoints(root, work) as source:
        source.digests = digests
        yield source


@pytest.fixture
def chart_accounts(
    cluster: ClusterHandle, k8s_api: client.ApiClient, kubectl: Kubectl, tmp_path: Path
) -> Iterator[ChartAccounts]:
    """The chart's operator and worker ServiceAccounts and RBAC in the test's namespace, with a
    kubeconfig of each: what the operator and the agents run with."""
    with install_chart_accounts(k8s_api, kubectl, cluster.kubeconfig, tmp_path / "accounts") as accounts:
        yield accounts


class OperatorIdentity(NamedTuple):
    username: str
    # Bound to the audience of the test namespace's agents: what the operator presents to them
    # (a token it minted, or the legacy --agent-token-file).
    token_file: Path
    kubeconfig: Path  # the operator's own credential to the apiserver
    # The operator minting those tokens itself (TokenRequest for its own ServiceAccount).
    minted: MintedAgentTokens


@pytest.fixture
def operator_identity(
    k8s_api: client.ApiClient, chart_accounts: ChartAccounts, tmp_path: Path
) -> OperatorIdentity:
    """The chart's operator ServiceAccount: its name, a token for the agents, a kubeconfig."""
    namespace = chart_accounts.namespace
    token = mint_token(k8s_api, namespace, OPERATOR_ACCOUNT, [agent_audience(namespace)])
    path = tmp_path / "agent-token"
    path.write_text(token)
    return OperatorIdentity(
        chart_accounts.operator_username,
        path,
        chart_accounts.operator_kubeconfig,
        MintedAgentTokens(namespace, OPERATOR_ACCOUNT),
    )


@pytest.fixture
def operator(
    crd_installed: None,
    namespace: str,
    operator_identity: OperatorIdentity,
    tmp_path: Path,
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(
        operator_identity.kubeconfig, namespace, operator_identity.minted, tmp_path / "operator"
    )
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture
def rollouts(k8s_api: client.ApiClient, namespace: str) -> Rollouts:
    return Rollouts(k8s_api, namespace)


@dataclass
class Fleet:
    name: str
    labels: dict[str, str]
    runtime: PodRuntime
    token: str
    kubectl: Kubectl
    scheme: str = "https"  # http: agents run with --plain-http

    def workers(self, count: int) -> list[Worker]:
        return ready_workers(self.runtime, count, self.token, scheme=self.scheme)

    def scale(self, replicas: int) -> None:
        self.kubectl.run("scale", f"deployment/{self.name}", f"--replicas={replicas}")


@pytest.fixture
def fleet_factory(
    kubectl: Kubectl,
    pod_runtime: PodRuntimeFactory,
    checkpoint_source: CheckpointSource,
    operator_identity: OperatorIdentity,
    chart_accounts: ChartAccounts,
) -> Callable[..., Fleet]:
    """``fleet_factory(replicas)`` -> a worker Deployment whose pods run real paddle agents
    starting on v1 (processes, or what ``agent_launcher(pod)`` picks, e.g. the worker image),
    serving https with certificates from the session's agent CA (``agent_pki``: another one;
    ``plain_http``: --plain-http); waits until every agent answers."""

    def make(
        replicas: int,
        name: str = "workers",
        initial_version: str = "v1",
        big: bool = False,
        extra_args: list[str] | None = None,
        agent_launcher: Callable[[PodInfo], Launcher] | None = None,
        plain_http: bool = False,
        agent_pki: AgentPKI | None = None,
        allowed_username: str | None = None,
    ) -> Fleet:
        # allowed_username: the allow-list fallback (that user only, the workers reading the
        # relay) instead of SubjectAccessReview.
        labels = {"app": WORKER_LABEL, "fleet": name}
        kubectl.apply(worker_deployment(name, replicas, labels, WORKER_ACCOUNT))
        options = AgentOptions(
            source_url=checkpoint_source.url,
            initial_version=initial_version,
            kubeconfig=chart_accounts.worker_kubeconfig_for,
            # Authorized by SubjectAccessReview: what the chart's RBAC grants the operator
            # (update agents) and the workers (get agents/relay).
            relay_token=chart_accounts.worker_relay_token_for,
            allowed_username=allowed_username,
            relay_username=chart_accounts.worker_username if allowed_username else None,
            extra_args=[*(extra_args or []), *model_flags(big)],
        )
        if agent_launcher is not None:
            options.launcher = agent_launcher
        if agent_pki is not None:  # serving certificates (and the peers' CA) from another CA
            options.tls = agent_pki
        if plain_http:
            options.tls = None
        runtime = pod_runtime(f"app={WORKER_LABEL},fleet={name}", options.launch)
        token = operator_identity.token_file.read_text()
        fleet = Fleet(name, labels, runtime, token, kubectl, "http" if plain_http else "https")
        fleet.workers(replicas)
        return fleet

    return make
