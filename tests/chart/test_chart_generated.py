"""The chart's generated files match their generators, and the generators keep their promises."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import CHART, ROOT, Helm
from pydantic import BaseModel

from ckpt_api.crd import build_crd
from ckpt_rollout.chartgen.chart_files import (
    STATIC_NAMESPACE,
    STATIC_WORKER_NAMESPACE,
    generated_files,
    render_static_manifest,
    values_schema,
)
from ckpt_rollout.chartgen.chart_values import ChartValues

STATIC_MANIFEST = ROOT / "examples" / "kubectl" / "operator.yaml"


@pytest.mark.parametrize("rel", sorted(generated_files(), key=str), ids=str)
def test_committed_chart_file_matches_the_generator(rel: Path) -> None:
    committed = (CHART / rel).read_text()
    assert committed == generated_files()[rel], f"{CHART / rel} is stale: run `make crds` and commit"


def test_static_kubectl_manifest_matches_the_chart(helm: Helm) -> None:
    expected = render_static_manifest(helm.binary, CHART)
    assert STATIC_MANIFEST.read_text() == expected, "run `make generate` and commit"


def test_static_manifest_has_no_crd_and_the_operators_and_the_workers_namespaces() -> None:
    docs = [d for d in yaml.safe_load_all(STATIC_MANIFEST.read_text()) if d]
    assert "CustomResourceDefinition" not in {d["kind"] for d in docs}
    namespaces = {d["metadata"].get("namespace") for d in docs} - {None}
    assert namespaces == {STATIC_NAMESPACE, STATIC_WORKER_NAMESPACE}


def test_static_manifest_holds_what_the_worker_namespace_needs() -> None:
    """The `kubectl apply` path sets up README's worker namespace as helm's workerRbac does: the
    ServiceAccount the example workers run as, its RBAC, and the admission policies."""
    docs = [d for d in yaml.safe_load_all(STATIC_MANIFEST.read_text()) if d]
    workers = {
        (d["kind"], d["metadata"].get("namespace"))
        for d in docs
        if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "worker-agent"
    }
    ns = STATIC_WORKER_NAMESPACE
    assert {("ServiceAccount", ns), ("Role", ns), ("RoleBinding", ns)} <= workers
    assert {"ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} <= {
        kind for kind, _ in workers
    }
    (account,) = [d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["namespace"] == ns]
    example = (ROOT / "examples" / "worker-deployment.yaml").read_text()
    pod = next(d for d in yaml.safe_load_all(example) if d and d["kind"] == "Deployment")
    assert pod["spec"]["template"]["spec"]["serviceAccountName"] == account["metadata"]["name"]


def test_values_yaml_is_the_model_defaults() -> None:
    loaded = yaml.safe_load((CHART / "values.yaml").read_text())
    assert loaded == ChartValues().model_dump(by_alias=True, mode="json")


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    paths = []
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        paths.append(path)
        if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel):
            paths += _field_paths(info.annotation, path + ".")
    return paths


def test_every_value_in_values_yaml_has_a_comment() -> None:
    lines = (CHART / "values.yaml").read_text().splitlines()
    key_line = re.compile(r"^( *)([A-Za-z][A-Za-z0-9]*):")
    stack: list[str] = []
    commented: set[str] = set()
    for i, line in enumerate(lines):
        match = key_line.match(line)
        if not match:
            continue
        depth = len(match.group(1)) // 2
        stack = [*stack[:depth], match.group(2)]
        if lines[i - 1].startswith(match.group(1) + "# "):
            commented.add(".".join(stack))
    fields = _field_paths(ChartValues)
    assert len(fields) >= 50
    assert [f for f in fields if f not in commented] == []


def _objects(node: Any, path: str = "$") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if node.get("type") == "object":
            found.append((path, node))
        for key, value in node.items():
            found += _objects(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _objects(value, f"{path}[{i}]")
    return found


# Objects passed through to the pod spec or to metadata as written; everything else is ours.
OPEN_OBJECTS = {
    "affinity": True,  # core/v1 Affinity
    "tolerations.items": True,  # core/v1 Toleration
    "workerRbac.networkPolicy.metricsFrom.items": True,  # networking/v1 NetworkPolicyPeer
}


def test_schema_closes_every_object_the_chart_owns() -> None:
    schema = values_schema()
    closed = 0
    for path, node in _objects(schema):
        short = re.sub(r"\.properties\.", ".", path).removeprefix("$.")
        if short in OPEN_OBJECTS:
            assert node.get("additionalProperties", True) is True, path
        elif "properties" in node or path == "$":
            assert node.get("additionalProperties") is False, path
            closed += 1
        else:
            # A map (annotations, labels, resources): its values are typed.
            assert isinstance(node.get("additionalProperties"), dict), path
    assert closed >= 15


def test_schema_has_no_refs_for_simple_validators() -> None:
    text = str(values_schema())
    assert "$ref" not in text
    assert "$defs" not in text


def test_chart_crd_template_comes_from_the_same_models() -> None:
    template = (CHART / "templates" / "crds" / "checkpointrollouts.rollout.ckpt.dev.yaml").read_text()
    body = template.split("  {{- end }}\n", 1)[1].rsplit("{{- end }}", 1)[0]
    assert yaml.safe_load(body) == {"spec": build_crd()["spec"]}
    committed = yaml.safe_load((ROOT / "crds" / "checkpointrollouts.rollout.ckpt.dev.yaml").read_text())
    assert committed["spec"] == build_crd()["spec"]


def test_chart_versions() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"], "the image tag defaults to appVersion"
    assert re.fullmatch(r"\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?", chart["version"]), chart["version"]
    assert chart["apiVersion"] == "v2"
