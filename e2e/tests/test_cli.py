"""The user CLI as a user meets it: everyday mistakes end in one line and a documented exit code,
never a traceback; `-o json|yaml`, `--kubeconfig`, `--version`, the kubectl plugin name; promote
refuses a rollout that is not paused, retry one that has not failed; Ctrl-C ends a watch
quietly. Against the local control plane."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from ckpt_e2e.fixtures import ClusterHandle
from ckpt_e2e.procs import PortReservation
from ckpt_e2e.rollout_env import CLI, CheckpointSource, OperatorProcess, Rollouts, rollout_spec
from ckpt_e2e.rollout_fixtures import Fleet

pytestmark = pytest.mark.integration


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})}
    )


def _into_a_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """The command with its stdout a pipe whose reader has gone (`... | head -5` once head has
    its lines): every write fails."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run([*CLI, *args], stdout=write, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write)


def _one_line_error(result: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert text in lines[0], lines[0]


def test_without_a_kubeconfig(tmp_path: Path) -> None:
    result = _run("status", "fleet", env={"KUBECONFIG": str(tmp_path / "absent"), "HOME": str(tmp_path)})
    _one_line_error(result, 3, "ckpt-rollout status: no usable kubeconfig")


def test_with_the_apiserver_unreachable(tmp_path: Path) -> None:
    held = PortReservation(1)  # bound, never listening: connections are refused while held
    (port,) = held.ports
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
    with held:
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
    assert "Source:     http://127.0.0.1:9/x  (manifest not pinned)" in wide.stdout, "wide says more"
    piped = _into_a_closed_pipe("status", "fleet", *base)
    assert (piped.returncode, piped.stderr) == (141, ""), "like a tool SIGPIPE ended: no traceback"

    # No operator runs here: the rollout never paused, so there is nothing to promote.
    _one_line_error(_run("promote", "fleet", *base), 5, "not paused after a wave")
    _one_line_error(_run("retry", "fleet", *base), 5, "only a Failed or RolledBack rollout is retried")
    annotations = rollouts.get("fleet")["metadata"].get("annotations") or {}
    assert not any(key.endswith(("/promote", "/retry")) for key in annotations), "refusals write nothing"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
        # As a terminal's foreground job has it. A run started in the background by a shell
        # without job control (`make test &`, CI) inherits SIGINT ignored, and Python keeps an
        # ignored SIGINT ignored: Ctrl-C would then do nothing (the once-seen "flake").
        preexec_fn=_default_sigint,
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


def test_watch_prints_one_line_per_change_when_not_a_terminal(
    cluster: ClusterHandle,
    namespace: str,
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
) -> None:
    """Piped, `watch` follows the watch API to the end and prints what changed, a line each:
    the rollout's summary, each wave as it starts and completes, each worker's state."""
    fleet = fleet_factory(3)
    rollouts.create(
        "fleet", rollout_spec(checkpoint_source.url, "v2", fleet.labels, strategy={"waves": [1, "100%"]})
    )
    result = _run(
        "watch", "fleet", "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "--timeout", "120"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert not any("\r" in line or "\033" in line for line in lines), "no terminal control codes in a pipe"
    assert lines[-1] == "v2 is live on 3 pods"
    summaries = [line for line in lines if line.startswith(f"{namespace}/fleet ")]
    assert summaries[-1] == f"{namespace}/fleet v2: Succeeded, 3/3 updated, 0 failed, waves 2/2", lines
    status = rollouts.status("fleet")
    (canary,) = status["waves"][0]["pods"]
    rest = ", ".join(status["waves"][1]["pods"])
    assert f"wave 1: Completed (1 pod: {canary})" in lines
    assert f"wave 2: Completed (2 pods: {rest})" in lines
    # Each worker ends Updated, and is named only when its state changes.
    for pod in [canary, *status["waves"][1]["pods"]]:
        mine = [line for line in lines if line.startswith(f"worker {pod}: ")]
        assert mine[-1].startswith(f"worker {pod}: Updated v2"), mine
        assert len(mine) == len(set(mine)), lines
    assert all(a != b for a, b in itertools.pairwise(summaries)), "a line per change only"
