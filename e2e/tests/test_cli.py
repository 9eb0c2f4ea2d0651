"""The user CLI as a user meets it: everyday mistakes end in one line and a documented exit code,
never a traceback; `-o json|yaml`, `--kubeconfig`, `--version`, the kubectl plugin name; promote
refuses a rollout that is not paused, retry one that has not failed; Ctrl-C ends a watch
quietly. Against the local control plane."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ckpt_e2e.fixtures import ClusterHandle
from ckpt_e2e.procs import free_ports
from ckpt_e2e.rollout_env import CLI, Rollouts, rollout_spec

pytestmark = pytest.mark.integration


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


def _one_line_error(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert text in lines[0], lines[0]


def test_without_a_kubeconfig(tmp_path: Path) -> None:
    result = _run("status", "fleet", env={"KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path)})
    _one_line_error(result, 3, "ckpt-rollout status: no usable kubeconfig")


def test_with_the_apiserver_unreachable(tmp_path: Path) -> None:
    (port,) = free_ports(1)  # nothing listens there
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "rl"}}],
                "current-context": "x",
            }
        )
    )
    result = _run("watch", "fleet", "--kubeconfig", str(kubeconfig))
    _one_line_error(result, 3, "cannot reach the apiserver")


def test_not_found_output_formats_and_promote_refused(
    cluster: ClusterHandle, namespace: str, crd_installed: None, rollouts: Rollouts
) -> None:
    kubeconfig = str(cluster.kubeconfig)
    base = ("--kubeconfig", kubeconfig, "-n", namespace)
    _one_line_error(_run("status", "missing", *base), 4, f"checkpointrollout {namespace}/missing not found")

    rollouts.create("fleet", rollout_spec("http://127.0.0.1:9/x", "v2", {"app": "nobody"}))
    as_json = _run("status", "fleet", *base, "-o", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["spec"]["version"] == "v2"
    as_yaml = _run("status", "fleet", *base, "-o", "yaml")
    assert yaml.safe_load(as_yaml.stdout)["metadata"]["name"] == "fleet"
    wide = _run("status", "fleet", *base, "-o", "wide")
    assert wide.returncode == 0, wide.stderr
    assert "Name:" in wide.stdout

    # No operator runs here: the rollout never paused, so there is nothing to promote.
    _one_line_error(_run("promote", "fleet", *base), 5, "not paused after a wave")
    _one_line_error(_run("retry", "fleet", *base), 5, "only a Failed or RolledBack rollout is retried")
    annotations = rollouts.get("fleet")["metadata"].get("annotations") or {}
    assert not any(key.endswith(("/promote", "/retry")) for key in annotations), "refusals write nothing"


def test_ctrl_c_ends_a_watch_quietly(
    cluster: ClusterHandle, namespace: str, crd_installed: None, rollouts: Rollouts
) -> None:
    rollouts.create("fleet", rollout_spec("http://127.0.0.1:9/x", "v2", {"app": "nobody"}))
    kubeconfig = str(cluster.kubeconfig)
    proc = subprocess.Popen(
        [*CLI, "watch", "fleet", "--kubeconfig", kubeconfig, "-n", namespace],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    first = proc.stdout.readline()  # the watch is under way once it printed its first line
    assert "v2" in first, first
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "Traceback" not in err, err


def test_version_and_the_kubectl_plugin_name() -> None:
    result = _run("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("ckpt-rollout ")
    plugin = Path(sys.executable).with_name("kubectl-ckpt")
    assert plugin.exists(), "the package installs the kubectl plugin entry point"
    as_plugin = subprocess.run([str(plugin), "--version"], capture_output=True, text=True, timeout=60)
    assert as_plugin.stdout.split()[:2] == ["kubectl", "ckpt"], as_plugin.stdout
