"""examples/ agree with the chart, the CRD and the agent's contract (no cluster needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CHART, ROOT, Helm, Obj

from ckpt_api.constants import DEFAULT_AGENT_METRICS_PORT, DEFAULT_AGENT_PORT, agent_audience
from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.vocabulary import WEIGHTS_READY_CONDITION
from ckpt_rollout.chartgen.chart_files import STATIC_NAMESPACE, STATIC_RELEASE
from ckpt_rollout.chartgen.chart_values import ChartValues

EXAMPLES = ROOT / "examples"


def _docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _one(path: Path, kind: str) -> Obj:
    found = [d for d in _docs(path) if d["kind"] == kind]
    assert len(found) == 1, f"{path}: {kind}"
    return found[0]


def _worker_container() -> Obj:
    deployment = _one(EXAMPLES / "worker-deployment.yaml", "Deployment")
    container: Obj = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def _flags(args: list[str]) -> dict[str, str]:
    return dict(a.removeprefix("--").split("=", 1) for a in args if a.startswith("--"))


def test_checkpointrollout_example_is_a_valid_spec() -> None:
    cr = _one(EXAMPLES / "checkpointrollout.yaml", "CheckpointRollout")
    assert cr["apiVersion"] == "rollout.ckpt.dev/v1alpha1"
    spec = CheckpointRolloutSpec.model_validate(cr["spec"])
    worker = _one(EXAMPLES / "worker-deployment.yaml", "Deployment")
    assert spec.selector.match_labels == worker["spec"]["template"]["metadata"]["labels"]


def test_worker_example_is_wired_for_the_agent() -> None:
    deployment = _one(EXAMPLES / "worker-deployment.yaml", "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["readinessGates"] == [{"conditionType": WEIGHTS_READY_CONDITION}]
    assert pod["serviceAccountName"] == ChartValues().worker_rbac.service_account.name
    container = _worker_container()
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in container["env"]}
    assert env == {
        "POD_NAME": "metadata.name",
        "POD_NAMESPACE": "metadata.namespace",
        "POD_IP": "status.podIP",
    }
    assert "command" not in container  # the worker image's entrypoint runs the agent
    flags = _flags(container["args"])
    assert flags["port"] == str(DEFAULT_AGENT_PORT)
    assert container["ports"][0]["containerPort"] == DEFAULT_AGENT_PORT
    # The operator's per-namespace audience, for the namespace the agent runs in.
    assert flags["tokenreview-audience"] == agent_audience(
        "$(POD_NAMESPACE)", ChartValues().agent_auth.audience
    )


def test_worker_example_authorizes_by_rbac_and_its_relay_token_is_for_its_namespace(helm: Helm) -> None:
    """No allow-list: SubjectAccessReview decides, by what the chart grants. The example is
    for namespace rl: its peers' token is for rl's agents."""
    flags = _flags(_worker_container()["args"])
    assert "allowed-usernames" not in flags
    assert "relay-allowed-usernames" not in flags
    pod = _one(EXAMPLES / "worker-deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    relay = next(v for v in pod["volumes"] if v["name"] == "relay-token")
    (source,) = relay["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == agent_audience("rl")
    assert flags["relay-token-file"].startswith(
        next(m["mountPath"] for m in _worker_container()["volumeMounts"] if m["name"] == "relay-token")
    )


def _argocd() -> Obj:
    return _one(EXAMPLES / "gitops" / "argocd-application.yaml", "Application")


def _flux() -> Obj:
    return _one(EXAMPLES / "gitops" / "flux-helmrelease.yaml", "HelmRelease")


def test_argocd_application_points_at_the_chart() -> None:
    app = _argocd()
    assert (ROOT / app["spec"]["source"]["path"]) == CHART
    assert app["spec"]["source"]["helm"]["releaseName"] == STATIC_RELEASE
    assert app["spec"]["destination"]["namespace"] == STATIC_NAMESPACE


def test_flux_helmrelease_points_at_the_chart() -> None:
    release = _flux()
    source = _one(EXAMPLES / "gitops" / "flux-helmrelease.yaml", "GitRepository")
    chart = release["spec"]["chart"]["spec"]
    assert ROOT / chart["chart"] == CHART
    assert chart["sourceRef"] == {"kind": "GitRepository", "name": source["metadata"]["name"]}
    assert release["spec"]["releaseName"] == STATIC_RELEASE
    assert release["spec"]["targetNamespace"] == STATIC_NAMESPACE


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(lambda: _argocd()["spec"]["source"]["helm"]["valuesObject"], id="argocd"),
        pytest.param(lambda: _flux()["spec"]["values"], id="flux"),
    ],
)
def test_gitops_values_pass_the_schema(helm: Helm, values: Any) -> None:
    chosen = values()
    ChartValues.model_validate(chosen, strict=True)
    rendered = helm.template(chosen, release=STATIC_RELEASE, namespace=STATIC_NAMESPACE)
    assert rendered.one("ServiceAccount", "ckpt-rollout-worker", "rl")


def test_worker_example_args_parse_with_the_agent_cli() -> None:
    from ckpt_agent.cli import build_parser

    args = build_parser().parse_args(["agent", *_worker_container()["args"]])
    assert args.port == DEFAULT_AGENT_PORT
    assert args.engine == "paddle"
    assert args.tokenreview_audience == agent_audience("$(POD_NAMESPACE)")
    assert args.allowed_usernames is None


def test_worker_example_runs_as_the_worker_images_user() -> None:
    dockerfile = (ROOT / "worker_image" / "Dockerfile").read_text().splitlines()
    users = [line.split()[1] for line in dockerfile if line.startswith("USER ")]
    pod = _one(EXAMPLES / "worker-deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    context = pod["securityContext"]
    assert users[-1] == f"{context['runAsUser']}:{context['runAsGroup']}"


def test_the_worker_podmonitor_scrapes_the_agents_metrics_port() -> None:
    monitor = _one(EXAMPLES / "worker-podmonitor.yaml", "PodMonitor")
    deployment = _one(EXAMPLES / "worker-deployment.yaml", "Deployment")
    assert monitor["spec"]["selector"]["matchLabels"] == deployment["spec"]["template"]["metadata"]["labels"]
    container = _worker_container()
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (
        ports[endpoint["port"]]
        == int(_flags(container["args"])["metrics-port"])
        == DEFAULT_AGENT_METRICS_PORT
    )
    assert endpoint["path"] == "/metrics"
