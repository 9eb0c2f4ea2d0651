"""examples/ agree with the chart, the CRD and the agent's contract (no cluster needed)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path, PurePosixPath
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
SETTINGS_CONFIG_MAP = "ckpt-rollout-agent"


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


def _example_settings() -> Any:
    """examples/agent-settings.yaml: the chart values the example workers' settings come from."""
    return yaml.safe_load((EXAMPLES / "agent-settings.yaml").read_text())


def _static_settings_file() -> str:
    """agent.yaml of the static manifest's settings ConfigMap (the `kubectl apply` path)."""
    config_map = _one_named(EXAMPLES / "kubectl" / "operator.yaml", "ConfigMap", SETTINGS_CONFIG_MAP)
    text: str = config_map["data"]["agent.yaml"]
    return text


def _one_named(path: Path, kind: str, name: str) -> Obj:
    (found,) = [d for d in _docs(path) if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _worker_settings() -> Any:
    """The settings the example's agent runs with: its flags over the settings file it mounts
    (the static manifest's ConfigMap) over the model's defaults."""
    from ckpt_agent.cli import agent_settings, build_parser

    args = build_parser().parse_args(["agent", *_worker_container()["args"]])
    with tempfile.TemporaryDirectory() as tmp:
        mounted = Path(tmp) / PurePosixPath(args.config).name
        mounted.write_text(_static_settings_file())
        args.config = str(mounted)
        return agent_settings(args, {})


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
    assert _worker_settings().port == DEFAULT_AGENT_PORT
    assert container["ports"][0]["containerPort"] == DEFAULT_AGENT_PORT
    # The operator's per-namespace audience, for the namespace the agent runs in.
    assert flags["tokenreview-audience"] == agent_audience(
        "$(POD_NAMESPACE)", ChartValues().agent_auth.audience
    )


def test_worker_example_authorizes_by_rbac_and_its_relay_token_is_for_its_namespace(helm: Helm) -> None:
    """No allow-list: SubjectAccessReview decides, by what the chart grants. The example is
    for namespace rl: its peers' token is for rl's agents."""
    settings = _worker_settings()
    assert settings.allowed_usernames == []
    assert settings.relay_allowed_usernames == []
    pod = _one(EXAMPLES / "worker-deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    relay = next(v for v in pod["volumes"] if v["name"] == "relay-token")
    (source,) = relay["projected"]["sources"]
    assert source["serviceAccountToken"]["audience"] == agent_audience("rl")
    assert str(settings.relay_token_file).startswith(
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


@pytest.mark.parametrize(
    "values",
    [
        pytest.param(lambda: _argocd()["spec"]["source"]["helm"]["valuesObject"], id="argocd"),
        pytest.param(lambda: _flux()["spec"]["values"], id="flux"),
    ],
)
def test_gitops_installs_give_the_example_workers_their_settings(values: Any) -> None:
    """Workers deployed beside a GitOps install run from the ConfigMap its values fill: the same
    settings as examples/agent-settings.yaml, or they would start without a source or TLS."""
    example = yaml.safe_load((EXAMPLES / "agent-settings.yaml").read_text())["agentSettings"]
    assert values()["agentSettings"] == example


def test_worker_example_args_parse_with_the_agent_cli() -> None:
    settings = _worker_settings()
    assert settings.port == DEFAULT_AGENT_PORT
    assert settings.engine == "paddle"
    assert settings.tokenreview_audience == agent_audience("$(POD_NAMESPACE)")
    assert settings.allowed_usernames == []


def test_worker_example_runs_the_agent_from_its_namespaces_settings_file() -> None:
    """The fleet's settings come from the chart's ConfigMap, mounted read-only where --config
    reads it; the command line keeps only what must be a flag (the audience names the pod's
    namespace, which only the command line expands)."""
    pod = _one(EXAMPLES / "worker-deployment.yaml", "Deployment")["spec"]["template"]["spec"]
    container = _worker_container()
    flags = _flags(container["args"])
    assert sorted(flags) == ["config", "tokenreview-audience"]
    volume = next(v for v in pod["volumes"] if v.get("configMap", {}).get("name") == SETTINGS_CONFIG_MAP)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert str(PurePosixPath(mount["mountPath"]) / "agent.yaml") == flags["config"]


def test_both_install_paths_give_the_workers_the_example_settings(helm: Helm) -> None:
    """helm with examples/agent-settings.yaml renders the settings ConfigMap that the static
    manifest holds, and the agent reads the example's settings from it."""
    from ckpt_agent.settings import AgentSettings

    values = {**_example_settings(), "workerRbac": {"enabled": True, "namespaces": ["rl"]}}
    rendered = helm.template(values, release=STATIC_RELEASE, namespace=STATIC_NAMESPACE)
    by_helm = rendered.one("ConfigMap", SETTINGS_CONFIG_MAP, "rl")["data"]["agent.yaml"]
    assert yaml.safe_load(by_helm) == yaml.safe_load(_static_settings_file())
    example = AgentSettings.model_validate(_example_settings()["agentSettings"])
    assert example.model_copy(update={"tokenreview_audience": agent_audience("$(POD_NAMESPACE)")}) == (
        _worker_settings()
    )


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
    assert ports[endpoint["port"]] == _worker_settings().metrics_port == DEFAULT_AGENT_METRICS_PORT
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
    for uri in (cr["spec"]["source"]["uri"], _worker_settings().source):
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
