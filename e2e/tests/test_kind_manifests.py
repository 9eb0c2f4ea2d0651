"""What the kind path (e2e/kind/run.sh) and the existing-cluster provider send to a cluster,
checked on the local control plane, which has no Docker to run the real thing: the apiserver
admits it (server-side dry run), the worker pods' agent flags parse, and the chart's worker
RBAC the provider renders per test namespace grants the agents what they call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpt_api.constants import agent_audience
from ckpt_e2e.catalog import model_flags
from ckpt_e2e.kubectl import Kubectl
from ckpt_e2e.procs import wait_for
from ckpt_e2e.providers import (
    CHART,
    ExistingSettings,
    apply_worker_rbac,
    delete_worker_rbac,
    helm_binary,
    worker_pod_deployment,
)
from ckpt_e2e.rollout_env import WORKER_LABEL, agent_flags
from ckpt_e2e.versions import KUBERNETES

pytestmark = pytest.mark.integration

KIND = Path(__file__).resolve().parents[1] / "kind"


def _admitted(kubectl: Kubectl, objects: list[dict[str, Any]]) -> None:
    """Server-side dry run: validation, defaulting and admission, nothing stored."""
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    kubectl.run("apply", "--server-side", "--dry-run=server", "-f", "-", input=body)


def test_source_manifest_is_admitted_and_serves_the_providers_url(kubectl: Kubectl, namespace: str) -> None:
    docs = [d for d in yaml.safe_load_all((KIND / "manifests" / "source.yaml").read_text()) if d]
    by_kind = {d["kind"]: d for d in docs}
    assert set(by_kind) == {"Namespace", "Deployment", "Service"}
    pod = by_kind["Deployment"]["spec"]["template"]["spec"]
    # The init container runs the catalog module the local provider builds with.
    (init,) = pod["initContainers"]
    assert init["command"] == ["python", "/catalog/catalog.py", "/data"]
    assert [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v] == ["ckpt-e2e-catalog"]
    service, source_ns = by_kind["Service"]["metadata"]["name"], by_kind["Namespace"]["metadata"]["name"]
    port = by_kind["Service"]["spec"]["ports"][0]["port"]
    assert ExistingSettings().source_uri == f"http://{service}.{source_ns}.svc:{port}"

    namespaced = [d for d in docs if d["kind"] != "Namespace"]
    for d in namespaced:
        d["metadata"]["namespace"] = namespace
    _admitted(kubectl, namespaced)


def test_worker_deployment_is_admitted_and_its_args_parse(kubectl: Kubectl) -> None:
    from ckpt_agent.cli import build_parser, config_from_args

    settings = ExistingSettings()
    flags = agent_flags(
        "0.0.0.0", settings.source_uri, "b1", None, model_flags(True), audience=agent_audience("ns")
    )
    labels = {"app": WORKER_LABEL, "fleet": "workers"}
    deployment = worker_pod_deployment("workers", 3, labels, settings.worker_image, flags)
    _admitted(kubectl, [deployment])

    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(["agent", *container["args"]])
    config = config_from_args(args, env={"POD_NAME": "workers-x", "POD_NAMESPACE": "ns"})
    config.validate()
    assert (config.host, config.source, config.initial_version) == ("0.0.0.0", settings.source_uri, "b1")
    assert config.auth.access_review  # the kind install's chart grants the operator
    assert config.auth.tokenreview_audience == agent_audience("ns")
    assert config.model.hidden == 2048


def test_chart_with_the_kind_values_is_admitted(kubectl: Kubectl, namespace: str) -> None:
    rendered = subprocess.run(
        [
            str(helm_binary()), "template", "ckpt-rollout", str(CHART), "--namespace", namespace,
            "--values", str(KIND / "values.yaml"), "--kube-version", KUBERNETES,
        ],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout  # fmt: skip
    objects = [d for d in yaml.safe_load_all(rendered) if d]
    (deployment,) = [d for d in objects if d["kind"] == "Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "ckpt-rollout-operator:e2e"
    assert "--all-namespaces" in container["args"], "the suite makes a namespace per test"
    # The CRD is the chart tests' business (and cluster-wide, shared with other suites).
    _admitted(kubectl, [d for d in objects if d["kind"] != "CustomResourceDefinition"])


@pytest.mark.usefixtures("crd_installed")
def test_worker_rbac_render_grants_what_agents_call(kubectl: Kubectl, namespace: str) -> None:
    release = apply_worker_rbac(kubectl)
    try:
        worker = f"system:serviceaccount:{namespace}:ckpt-rollout-worker"

        def can(verb: str, resource: str, subresource: str = "", where: str | None = namespace) -> bool:
            args = ["auth", "can-i", verb, resource, f"--as={worker}"]
            args += [f"--subresource={subresource}"] if subresource else []
            args += [f"--namespace={where}"] if where else []
            out = kubectl.run(*args, check=False).stdout.strip()
            assert out in ("yes", "no"), out
            return out == "yes"

        # RBAC reaches the authorizer through its informers: a moment after the apply.
        wait_for(lambda: can("patch", "checkpointrollouts.rollout.ckpt.dev", "status"), 30, "the Role bound")
        assert can("patch", "pods", "status")
        assert can("create", "tokenreviews.authentication.k8s.io", where=None)
        assert not can("patch", "checkpointrollouts.rollout.ckpt.dev")
        assert not can("patch", "pods", "status", where="default")
    finally:
        delete_worker_rbac(kubectl, release)
    left = kubectl.run("get", "clusterrole", "-l", f"app.kubernetes.io/instance={release}", "-o", "name")
    assert left.stdout.strip() == ""


def test_catalog_runs_as_a_standalone_script() -> None:
    """In the source's init container catalog.py runs as a file, without the ckpt_e2e package."""
    catalog = Path(__file__).resolve().parents[1] / "ckpt_e2e" / "catalog.py"
    result = subprocess.run(
        [sys.executable, "-I", str(catalog), "--help"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "ROOT" in result.stdout
