"""Render the chart with `helm template` and look objects up in the result."""

from __future__ import annotations

import json
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from ckpt_rollout.chartgen.chart_files import kube_version_floor

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "ckpt-rollout"
KUBE_FLOOR = kube_version_floor(CHART)

Obj = dict[str, Any]

# Half of the chart tests' renders repeat another's values (91 renders, 49 distinct); the chart
# does not change while tests run, so one helm process per distinct render, per pytest worker.
_RENDERS: dict[str, str] = {}


def find_helm() -> Path | None:
    """The pinned helm the project provisions (never built from here: CI provisions it first)."""
    from ckpt_e2e.provision import cached_path, explicit_path

    path = explicit_path("helm") or cached_path("helm")
    return path if path.is_file() else None


@dataclass(frozen=True)
class Rendered:
    objects: list[Obj]

    def kinds(self) -> list[tuple[str, str]]:
        return sorted((o["kind"], o["metadata"]["name"]) for o in self.objects)

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, name: str | None = None, namespace: str | None = None) -> Obj:
        found = [
            o
            for o in self.of_kind(kind)
            if (name is None or o["metadata"]["name"] == name)
            and (namespace is None or o["metadata"].get("namespace") == namespace)
        ]
        assert len(found) == 1, f"expected one {kind} {name or ''} in {namespace}, got {self.kinds()}"
        return found[0]


@dataclass(frozen=True)
class Helm:
    binary: Path

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([str(self.binary), *args], capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed: {result.stderr}")
        return result

    def template_args(
        self, values: Obj | None, sets: list[str], release: str, namespace: str, workdir: Path
    ) -> list[str]:
        # The floor Chart.yaml declares: render as the oldest supported cluster would.
        args = ["template", release, str(CHART), "--namespace", namespace, "--kube-version", KUBE_FLOOR]
        if values is not None:
            values_file = workdir / "values.json"
            values_file.write_text(json.dumps(values))
            args += ["--values", str(values_file)]
        for item in sets:
            args += ["--set", item]
        return args

    def template(
        self,
        values: Obj | None = None,
        *sets: str,
        release: str = "rel",
        namespace: str = "ops",
    ) -> Rendered:
        key = json.dumps([str(self.binary), values, sets, release, namespace], sort_keys=True)
        if (out := _RENDERS.get(key)) is None:
            with tempfile.TemporaryDirectory() as tmp:
                out = self.run(*self.template_args(values, list(sets), release, namespace, Path(tmp))).stdout
            _RENDERS[key] = out
        # Each caller parses its own copy: tests edit the objects they get.
        return Rendered([d for d in yaml.safe_load_all(out) if d])

    def template_error(self, values: Obj | None = None, *sets: str) -> str:
        """Render expecting failure; returns helm's error output."""
        with tempfile.TemporaryDirectory() as tmp:
            args = self.template_args(values, list(sets), "rel", "ops", Path(tmp))
            result = self.run(*args, check=False)
        assert result.returncode != 0, f"helm accepted values {values} {sets}:\n{result.stdout[:2000]}"
        return result.stderr


def rule_set(rules: list[Obj]) -> set[tuple[str, str, str]]:
    """RBAC rules flattened to (apiGroup, resource, verb) triples."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }
