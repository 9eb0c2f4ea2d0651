"""Chart.yaml carries what users and Artifact Hub read, and it agrees with the code it describes."""

from __future__ import annotations

import tomllib
from typing import Any

import yaml
from chart_render import CHART, ROOT, Helm

from ckpt_api.crd import build_crd
from ckpt_api.spec import CheckpointRolloutSpec

# The first Kubernetes minor whose apiextensions accepts each CRD schema feature (KEP-2876 and
# the CRD API's field history); a feature the generated CRD starts using raises the floor.
FEATURE_SINCE = {
    "x-kubernetes-validations": (1, 25),  # CEL validation rules, beta and on by default
    "messageExpression": (1, 27),
    "reason": (1, 28),
    "fieldPath": (1, 28),
    "optionalOldSelf": (1, 30),
}


def _chart() -> dict[str, Any]:
    return dict(yaml.safe_load((CHART / "Chart.yaml").read_text()))


def _rules(node: Any) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if isinstance(node, dict):
        found.extend(node.get("x-kubernetes-validations") or [])
        for value in node.values():
            found.extend(_rules(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_rules(value))
    return found


def _features_used() -> set[str]:
    rules = _rules(build_crd()["spec"])
    used = {"x-kubernetes-validations"} if rules else set()
    for rule in rules:
        used |= set(rule) & set(FEATURE_SINCE)
    return used


def test_kube_version_is_the_floor_the_crds_cel_needs() -> None:
    used = _features_used()
    assert "reason" in used  # the table above is exercised, not vacuous
    major, minor = max(FEATURE_SINCE[f] for f in used)
    assert _chart()["kubeVersion"] == f">={major}.{minor}.0-0"


def test_helm_refuses_a_cluster_older_than_the_floor(helm: Helm) -> None:
    old = helm.run("template", "x", str(CHART), "--kube-version", "1.27.9", check=False)
    assert old.returncode != 0
    assert "kubeVersion" in old.stderr or "incompatible" in old.stderr
    helm.run("template", "x", str(CHART), "--kube-version", "1.28.0")


def test_home_and_sources_match_the_python_project() -> None:
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["urls"]
    chart = _chart()
    assert chart["home"] == urls["Homepage"]
    assert chart["sources"] == [urls["Source"]]


def test_license_file_matches_the_declared_license() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" == _chart()["annotations"]["artifacthub.io/license"]
    assert project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text.splitlines()[1]
    assert "Version 2.0, January 2004" in text


def test_artifacthub_crds_name_the_generated_crd() -> None:
    crd = build_crd()
    (entry,) = yaml.safe_load(_chart()["annotations"]["artifacthub.io/crds"])
    assert entry["kind"] == crd["spec"]["names"]["kind"]
    assert entry["name"] == crd["metadata"]["name"]
    assert entry["version"] in [v["name"] for v in crd["spec"]["versions"]]


def test_artifacthub_example_is_the_repositorys_example_and_valid() -> None:
    (example,) = yaml.safe_load(_chart()["annotations"]["artifacthub.io/crdsExamples"])
    assert example == yaml.safe_load((ROOT / "examples" / "checkpointrollout.yaml").read_text())
    CheckpointRolloutSpec.model_validate(example["spec"])


def test_artifacthub_images_are_what_the_chart_deploys(helm: Helm) -> None:
    (image,) = yaml.safe_load(_chart()["annotations"]["artifacthub.io/images"])
    pod = helm.template().one("Deployment")["spec"]["template"]["spec"]
    assert [c["image"] for c in pod["containers"]] == [image["image"]]
    assert _chart()["annotations"]["artifacthub.io/operator"] == "true"
