"""examples/ agree with the chart, the CRD and the agent's contract (no cluster needed)."""

from __future__ import annotations

import json
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


def _worker_settings() -> Any:
    """The settings the example's agent runs with: its flags over the model's defaults."""
    from ckpt_agent.cli import agent_settings, build_parser

    return agent_settings(build_parser().parse_args(["agent", *_worker_container()["args"]]), {})


def _flags(args: list[str]) -> dict[str, str]:
    """--name=value -> {name: value}; a switch (--name) -> {name: ""}."""
    return {k: v for k, _, v in (a.removeprefix("--").partition("=") for a in args if a.startswith("--"))}


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
    settings = _worker_settings()
    assert settings.port == DEFAULT_AGENT_PORT
    assert settings.engine == "paddle"
    assert settings.tokenreview_audience == agent_audience("$(POD_NAMESPACE)")
    assert settings.allowed_usernames == []


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


def test_worker_example_waits_for_a_rollout_before_it_is_ready() -> None:
    """A new pod is not Ready before a rollout confirms its version: the readiness gate, and the
    agent holding WeightsReady False until then (not serving its engine's boot weights)."""
    pod = _one(EXAMPLES / "worker-deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    assert pod["readinessGates"] == [{"conditionType": WEIGHTS_READY_CONDITION}]
    settings = _worker_settings()
    assert settings.await_rollout is True
    assert settings.initial_version is None


def _cpu(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_the_examples_fit_a_two_core_node_beside_the_operator() -> None:
    """README's first rollout runs every example pod and the operator on one 2-core node."""
    deployments = [
        _one(EXAMPLES / "worker-deployment.yaml", "Deployment"),
        _one(EXAMPLES / "checkpoint-source.yaml", "Deployment"),
    ]
    requested = sum(
        d["spec"]["replicas"] * _cpu(c["resources"]["requests"]["cpu"])
        for d in deployments
        for c in d["spec"]["template"]["spec"]["containers"]
    )
    operator = _cpu(ChartValues().resources.requests["cpu"])
    assert requested + operator <= 2 * 0.8  # room for what else the node runs


def test_the_checkpoint_source_is_what_the_workers_and_the_rollout_name() -> None:
    from urllib.parse import urlsplit

    from ckpt_agent.cli import build_parser

    service = _one(EXAMPLES / "checkpoint-source.yaml", "Service")
    deployment = _one(EXAMPLES / "checkpoint-source.yaml", "Deployment")
    (port,) = service["spec"]["ports"]
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    (serve,) = deployment["spec"]["template"]["spec"]["containers"]
    assert serve["command"][:4] == ["python", "-m", "ckpt_agent", "serve"]
    args = build_parser().parse_args(serve["command"][3:])
    assert args.host == "0.0.0.0"  # reachable through the Service, not only on loopback
    assert {p["name"]: p["containerPort"] for p in serve["ports"]}[port["targetPort"]] == args.port
    mounts = {m["mountPath"] for m in serve["volumeMounts"]}
    assert args.root in mounts
    cr = _one(EXAMPLES / "checkpointrollout.yaml", "CheckpointRollout")
    name = service["metadata"]["name"]
    for uri in (cr["spec"]["source"]["uri"], _flags(_worker_container()["args"])["source"]):
        parts = urlsplit(uri)
        assert parts.hostname in (name, f"{name}.rl.svc"), uri
        assert parts.port == port["port"], uri


def test_the_examples_kustomization_holds_the_workers_and_their_source() -> None:
    kustomization = yaml.safe_load((EXAMPLES / "kustomization.yaml").read_text())
    assert sorted(kustomization["resources"]) == ["checkpoint-source.yaml", "worker-deployment.yaml"]
    local = yaml.safe_load((ROOT / "local" / "kustomization.yaml").read_text())
    assert local["resources"] == ["../examples"]


def test_the_local_values_pass_the_schema(helm: Helm) -> None:
    """local/values.yaml (README's first rollout): chart keys only, and it renders."""
    values = yaml.safe_load((ROOT / "local" / "values.yaml").read_text())
    ChartValues.model_validate_json(json.dumps(values), strict=True)  # JSON: enums from strings
    rendered = helm.template(values, release=STATIC_RELEASE, namespace=STATIC_NAMESPACE)
    assert rendered.one("Deployment", STATIC_RELEASE, STATIC_NAMESPACE)
