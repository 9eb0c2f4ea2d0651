"""e2e/kind/run.sh, run with stand-ins for docker, kind, make, kubectl, helm and pytest that record
their arguments: the kind path's steps in order, its exit status and its cleanup, on a machine
without Docker (the real run needs one; see e2e/README.md)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "e2e" / "kind" / "run.sh"

# Each stand-in appends "<tool> <args>" to $CALLS; `kind create cluster` writes the kubeconfig,
# pytest records the provider settings it was given and exits with $PYTEST_RC.
STANDIN = """#!/usr/bin/env bash
printf '%s %s\\n' "{name}" "$*" >>"$CALLS"
{body}
"""
BODIES = {
    "docker": 'if [ "$1" = info ]; then exit "${DOCKER_INFO_RC:-0}"; fi',
    "kind": (
        'if [ "$1 $2" = "get clusters" ]; then printf "%s\\n" $EXISTING_CLUSTERS; fi\n'
        'if [ "$1 $2" = "create cluster" ]; then\n'
        '  while [ $# -gt 0 ]; do [ "$1" = --kubeconfig ] && echo "kind: Config" >"$2"; shift; done\n'
        "fi"
    ),
    "make": "",
    "kubectl": "",
    "helm": "",
    "pytest": (
        'printf "env %s %s %s\\n" "$CKPT_E2E_KUBECONFIG" "$CKPT_E2E_WORKER_IMAGE" \\\n'
        '  "$CKPT_E2E_SOURCE_URL" >>"$CALLS"\n'
        'exit "${PYTEST_RC:-0}"'
    ),
}


@dataclass
class Run:
    returncode: int
    output: str
    calls: list[str]
    state: Path

    def steps(self, tool: str) -> list[str]:
        return [c for c in self.calls if c.split(" ", 1)[0] == tool]


@pytest.fixture
def run_script(tmp_path: Path) -> Callable[..., Run]:
    bin_dir = tmp_path / "bin"
    venv_bin = tmp_path / "venv" / "bin"
    for directory in (bin_dir, venv_bin):
        directory.mkdir(parents=True)
    for name, body in BODIES.items():
        target = (venv_bin if name == "pytest" else bin_dir) / name
        target.write_text(STANDIN.format(name=name, body=body))
        target.chmod(0o755)
    calls = tmp_path / "calls.log"

    def run(*args: str, **env: str) -> Run:
        calls.write_text("")
        state = tmp_path / "state"
        result = subprocess.run(
            ["bash", str(SCRIPT), *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={
                **os.environ,
                "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "CALLS": str(calls),
                "STATE_DIR": str(state),
                "VENV": str(tmp_path / "venv"),
                "CKPT_E2E_KUBECTL": str(bin_dir / "kubectl"),
                "CKPT_E2E_HELM": str(bin_dir / "helm"),
                **env,
            },
        )
        return Run(result.returncode, result.stdout + result.stderr, calls.read_text().splitlines(), state)

    return run


def test_builds_loads_installs_tests_and_deletes_the_cluster(run_script: Callable[..., Run]) -> None:
    run = run_script("-k", "abort")
    assert run.returncode == 0, run.output
    order = [c.split(" ", 2)[0] + " " + c.split(" ", 2)[1] for c in run.calls if " " in c]
    kubeconfig = run.state / "kubeconfig"
    # Shared with the local path: the Python env.
    assert run.steps("make") == ["make install"]
    create = next(c for c in run.calls if c.startswith("kind create cluster"))
    assert "--config e2e/kind/cluster.yaml" in create
    assert f"--kubeconfig {kubeconfig}" in create
    assert run.steps("docker")[1:] == [
        "docker build -f operator/Dockerfile -t ckpt-rollout-operator:e2e .",
        "docker build -f worker_image/Dockerfile --build-arg PADDLE=cpu --build-arg MOONCAKE=cpu "
        "-t ckpt-rollout-worker:e2e .",
    ]
    assert (
        "kind load docker-image --name ckpt-e2e ckpt-rollout-operator:e2e ckpt-rollout-worker:e2e"
        in run.calls
    )
    (install,) = run.steps("helm")
    assert install.startswith(
        f"helm --kubeconfig {kubeconfig} upgrade --install ckpt-rollout charts/ckpt-rollout"
    )
    assert "--values e2e/kind/values.yaml" in install
    kubectl = run.steps("kubectl")
    assert any("create configmap ckpt-e2e-catalog" in c and "e2e/ckpt_e2e/catalog.py" in c for c in kubectl)
    assert any("apply -f e2e/kind/manifests/source.yaml" in c for c in kubectl)
    assert any("rollout status deployment/ckpt-src" in c for c in kubectl)
    assert f"env {kubeconfig} ckpt-rollout-worker:e2e http://ckpt-src.ckpt-e2e.svc:8080" in run.calls, (
        run.calls
    )
    assert "pytest e2e/tests/test_scenarios.py -m scenario -k abort" in run.calls
    # In this order, and the cluster goes at the end.
    assert order.index("kind create") < order.index("docker build") < order.index("kind load")
    assert (
        order.index("kind load")
        < order.index("helm --kubeconfig")
        < order.index("pytest e2e/tests/test_scenarios.py")
    )
    assert run.calls[-1] == "kind delete cluster --name ckpt-e2e"


def test_a_failing_suite_fails_the_run_and_still_deletes_the_cluster(run_script: Callable[..., Run]) -> None:
    run = run_script(PYTEST_RC="1")
    assert run.returncode == 1
    assert run.calls[-1] == "kind delete cluster --name ckpt-e2e"


def test_keep_cluster_reuses_and_keeps_it(run_script: Callable[..., Run]) -> None:
    run = run_script(KEEP_CLUSTER="1", EXISTING_CLUSTERS="other ckpt-e2e")
    assert run.returncode == 0, run.output
    assert not any(c.startswith("kind create") for c in run.calls)
    assert "kind get kubeconfig --name ckpt-e2e" in run.calls
    assert not any(c.startswith("kind delete") for c in run.calls)
    assert f"export KUBECONFIG={run.state / 'kubeconfig'}" in run.output


def test_without_a_docker_engine_nothing_is_created(run_script: Callable[..., Run]) -> None:
    run = run_script(DOCKER_INFO_RC="1")
    assert run.returncode == 1
    assert "docker cannot reach an engine" in run.output
    assert run.steps("kind") == []
