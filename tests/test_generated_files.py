"""Generated files are committed; these tests fail when they drift from their generators."""

from pathlib import Path

import yaml

from ckpt_api.crd import build_crd, render_crd

ROOT = Path(__file__).resolve().parents[1]
CRD_FILE = ROOT / "crds" / "checkpointrollouts.rollout.ckpt.dev.yaml"


def test_committed_crd_matches_the_generator() -> None:
    assert CRD_FILE.read_text() == render_crd(), "run `make crds` and commit the result"


def test_crd_is_structural_and_complete() -> None:
    crd = yaml.safe_load(render_crd())
    version = crd["spec"]["versions"][0]
    assert crd["spec"]["names"]["shortNames"] == ["ckr"]
    assert version["subresources"] == {"status": {}}
    columns = [c["name"].upper() for c in version["additionalPrinterColumns"]]
    assert columns == ["VERSION", "TARGET", "PHASE", "UPDATED", "REPLICAS", "WAVE", "AGE"]

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            for forbidden in ("$ref", "anyOf", "title"):
                assert forbidden not in node, path
            assert node.get("additionalProperties", {}) is not False, path
            if "properties" in node or "items" in node:
                assert node.get("type") in ("object", "array"), path
            for key, value in node.items():
                walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(version["schema"]["openAPIV3Schema"], "openAPIV3Schema")


def test_cross_field_rules_are_cel() -> None:
    spec = build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    waves = spec["properties"]["strategy"]["properties"]["waves"]
    rules = [v["message"] for v in waves["x-kubernetes-validations"]]
    assert any("strictly increasing" in r for r in rules)
    assert spec["properties"]["timeouts"]["x-kubernetes-validations"]


def test_constraints_lock_is_fresh() -> None:
    from ckpt_e2e.lockfile import recorded_hash, requirements_hash

    assert recorded_hash() == requirements_hash(), "pyproject's requirements changed: run `make lock`"


def test_every_requirement_is_pinned_by_the_lock() -> None:
    import tomllib

    from packaging.requirements import Requirement

    from ckpt_e2e.lockfile import normalize, pins

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pinned = pins()
    reqs = [
        *project["dependencies"],
        *(r for extra in project["optional-dependencies"].values() for r in extra),
    ]
    assert reqs
    for raw in reqs:
        req = Requirement(raw)
        name = normalize(req.name)
        assert name in pinned, f"{req.name} is not in constraints.txt: run `make lock`"
        assert req.specifier.contains(pinned[name], prereleases=True), f"{raw} vs pinned {pinned[name]}"


def test_every_install_uses_the_lock() -> None:
    makefile = (ROOT / "Makefile").read_text()
    assert "pip install --quiet -c constraints.txt -e" in makefile
    for dockerfile in ("operator/Dockerfile", "worker_image/Dockerfile"):
        installs = [line for line in (ROOT / dockerfile).read_text().splitlines() if "pip install" in line]
        assert installs, dockerfile
        for line in installs:
            assert "-c constraints.txt" in line, f"{dockerfile}: every pip install is pinned: {line.strip()}"
