"""Rendering the Helm chart's generated files from `chart_values` (the values model) and
ckpt_api's CRD: values.schema.json, values.yaml, the CRD template, and the static manifest of the
`kubectl apply` install path (``helm template`` of the chart). ``python -m
ckpt_rollout.chartgen.chart_files CHART_DIR`` (``make crds``; ``make generate`` adds ``--static-manifest``)
writes them. Tests fail when a committed copy differs from what this module renders.
"""

import argparse
import json
import re
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from ckpt_api.constants import CRD_NAME
from ckpt_api.crd import build_crd
from ckpt_rollout.chartgen.chart_values import (
    CRD_TEMPLATE,
    GENERATED_NOTE,
    SCHEMA_FILE,
    VALUES_FILE,
    ChartValues,
    Json,
)

# --------------------------------------------------------------------------- values.schema.json


def _inline(node: Any, defs: Json) -> Any:
    """Resolve $refs in place (helm's and editors' validators all handle plain nested schemas)."""
    if isinstance(node, list):
        return [_inline(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = dict(defs[node["$ref"].rsplit("/", 1)[-1]])
        target.pop("description", None)  # the field's description wins over the class docstring
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _inline(merged, defs)
    out = {k: _inline(v, defs) for k, v in node.items() if k not in ("title", "$defs")}
    if isinstance(out.get("default"), dict) and out.get("type") == "object" and "properties" in out:
        # A section's default repeats its fields' defaults; values.yaml already shows them.
        del out["default"]
    return out


def values_schema() -> Json:
    raw = ChartValues.model_json_schema(by_alias=True)
    schema: Json = _inline(raw, raw.get("$defs", {}))
    schema.pop("description", None)
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "ckpt-rollout chart values",
        "description": GENERATED_NOTE,
        **schema,
    }


def render_values_schema() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


# --------------------------------------------------------------------------- values.yaml


def _comment(text: str, indent: str) -> list[str]:
    return [f"{indent}# {line}" for line in textwrap.wrap(text, width=96 - len(indent))]


def _values_lines(model: BaseModel, depth: int) -> list[str]:
    indent = "  " * depth
    lines: list[str] = []
    fields = type(model).model_fields
    for name, info in fields.items():
        if not info.description:
            raise ValueError(f"{type(model).__name__}.{name} has no description for values.yaml")
        key = info.alias or name
        value = getattr(model, name)
        if depth == 0 and lines:
            lines.append("")
        lines += _comment(info.description, indent)
        if isinstance(value, BaseModel):
            lines.append(f"{indent}{key}:")
            lines += _values_lines(value, depth + 1)
            continue
        plain = json.loads(json.dumps(value, default=str))
        dumped = yaml.safe_dump({key: plain}, sort_keys=False, default_flow_style=False, width=1000)
        lines += [indent + line for line in dumped.rstrip("\n").splitlines()]
    return lines


def render_values_yaml() -> str:
    head = [
        "# Values of the ckpt-rollout chart. " + GENERATED_NOTE,
        "# values.schema.json (generated from the same model) rejects unknown keys and wrong types.",
        "",
    ]
    return "\n".join(head + _values_lines(ChartValues(), 0)) + "\n"


# --------------------------------------------------------------------------- CRD template


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def render_crd_template() -> str:
    """The CRD of ``ckpt-rollout crd`` as a chart template (so helm can upgrade and keep it)."""
    crd = build_crd()
    spec = yaml.dump({"spec": crd["spec"]}, Dumper=_NoAliasDumper, sort_keys=False, width=100)
    if "{{" in spec or "}}" in spec:
        raise ValueError("the CRD contains template delimiters; escape them before templating")
    head = f"""\
{{{{- /* {GENERATED_NOTE} Same source as crds/{CRD_NAME}.yaml. */ -}}}}
{{{{- if .Values.crds.install }}}}
apiVersion: {crd["apiVersion"]}
kind: {crd["kind"]}
metadata:
  name: {crd["metadata"]["name"]}
  labels:
    {{{{- include "ckpt-rollout.labels" . | nindent 4 }}}}
  {{{{- if .Values.crds.keep }}}}
  annotations:
    helm.sh/resource-policy: keep
  {{{{- end }}}}
"""
    return head + spec + "{{- end }}\n"


# --------------------------------------------------------------------------- files


def generated_files() -> dict[Path, str]:
    """Path (relative to the chart directory) -> content."""
    return {
        VALUES_FILE: render_values_yaml(),
        SCHEMA_FILE: render_values_schema(),
        CRD_TEMPLATE: render_crd_template(),
    }


def write_generated(chart_dir: Path) -> list[Path]:
    written = []
    for rel, content in generated_files().items():
        path = chart_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        written.append(path)
    return written


# The `kubectl apply` install path: the chart rendered once with its defaults, without the CRD
# (that is `kubectl apply -f crds/`), for this release name and namespace, and with what README's
# worker namespace needs (workerRbac for it, and the example workers' agentSettings: README's
# `kubectl apply` commands then need no values file, and both paths give the workers the same).
STATIC_RELEASE = "ckpt-rollout"
STATIC_NAMESPACE = "ckpt-rollout-system"
STATIC_WORKER_NAMESPACE = "rl"


def kube_version_floor(chart_dir: Path) -> str:
    """The oldest Kubernetes the chart supports (`kubeVersion: ">=1.28.0-0"` -> "1.28.0"): what
    `helm template` must be told, since it assumes v1.20 without a cluster to ask."""
    spec = str(yaml.safe_load((chart_dir / "Chart.yaml").read_text())["kubeVersion"])
    match = re.fullmatch(r">=\s*v?(\d+\.\d+\.\d+)(-0)?", spec.strip())
    if match is None:
        raise ValueError(f"{chart_dir}/Chart.yaml: kubeVersion {spec!r} is not a '>=X.Y.Z-0' floor")
    return match.group(1)


def static_values_file(chart_dir: Path) -> Path:
    """examples/agent-settings.yaml of the repository holding charts/<chart>."""
    return chart_dir.resolve().parents[1] / "examples" / "agent-settings.yaml"


def static_manifest_argv(helm: Path, chart_dir: Path) -> list[str]:
    return [
        str(helm), "template", STATIC_RELEASE, str(chart_dir),
        "--namespace", STATIC_NAMESPACE, "--set", "crds.install=false",
        # Generated keys would differ on every render (and a committed CA key is no secret).
        "--set", "agentTLS.generate=false",
        "--set", "workerRbac.enabled=true",
        "--set", f"workerRbac.namespaces={{{STATIC_WORKER_NAMESPACE}}}",
        "--values", str(static_values_file(chart_dir)),
        "--kube-version", kube_version_floor(chart_dir),
    ]  # fmt: skip


def render_static_manifest(helm: Path, chart_dir: Path) -> str:
    argv = static_manifest_argv(helm, chart_dir)
    rendered = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    ns, workers = STATIC_NAMESPACE, STATIC_WORKER_NAMESPACE
    head = (
        f"# The ckpt-rollout operator for `kubectl apply`, in namespace {ns}, with workers in\n"
        f"# namespace {workers}: their ServiceAccount ckpt-rollout-worker, its RBAC and admission policies.\n"
        "# Generated by `make generate` (helm template of charts/ckpt-rollout with its defaults,\n"
        f"# crds.install=false, agentTLS.generate=false, workerRbac.enabled=true for {workers}, and\n"
        "# examples/agent-settings.yaml: the example workers' ConfigMap ckpt-rollout-agent). Do not\n"
        "# edit by hand: for other namespaces or values, use helm (or `helm template`) instead.\n"
        f"# First: `kubectl apply -f crds/`, create namespaces {ns} and {workers}, and the agents'\n"
        f"# TLS Secrets: `ckpt-rollout tls-secrets --namespace {workers} | kubectl apply -f -`\n"
        "# (README.md, Agent TLS).\n"
    )
    return head + rendered


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the Helm chart's generated files.")
    parser.add_argument("chart_dir", type=Path, help="e.g. charts/ckpt-rollout")
    parser.add_argument("--static-manifest", type=Path, help="also write the kubectl install manifest here")
    parser.add_argument("--helm", type=Path, help="helm binary (needed for --static-manifest)")
    args = parser.parse_args(argv)
    if not (args.chart_dir / "Chart.yaml").is_file():
        print(f"{args.chart_dir}: no Chart.yaml here", file=sys.stderr)
        return 2
    for path in write_generated(args.chart_dir):
        print(path)
    if args.static_manifest is not None:
        if args.helm is None:
            parser.error("--static-manifest needs --helm")
        args.static_manifest.parent.mkdir(parents=True, exist_ok=True)
        args.static_manifest.write_text(render_static_manifest(args.helm, args.chart_dir))
        print(args.static_manifest)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
