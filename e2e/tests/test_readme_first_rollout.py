"""README's "First rollout", run as a new user runs it: every `bash` block of that section, in
order and as written, from the repository root, in one shell (ckpt_e2e.readme). The first block
starts the local cluster with the real node (`make cluster-up REAL_NODE=1`), the last stops it
(`make cluster-down`); in between, the operator (step 2 both ways: the chart with helm, or the
static manifests with `kubectl apply`), the example workers and checkpoint source (local/), a
checkpoint made by `ckpt-rollout publish --example`, a CheckpointRollout, `kubectl wait` and
`ckpt-rollout status`.

The test's only additions: the images exist before (README's once-only set-up, `make images`,
is the `built_images` fixture), the cluster's state directory is one of its own (E2E_STATE, which
`make cluster-up`, `cluster-env` and `cluster-down` all read), and between the last block and the
clean-up it reads what the journey left: the rollout Succeeded on every worker, and no worker was
Ready before the rollout confirmed its version (the readiness gate and --await-rollout).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpt_e2e import clusterctl
from ckpt_e2e.images import Built
from ckpt_e2e.kubectl import Kubectl
from ckpt_e2e.provision import resolve
from ckpt_e2e.readme import Block, BlocksRun, run_blocks, section_blocks, shell_env

# It starts the real node itself (make cluster-up REAL_NODE=1), not through the real_cluster fixture.
pytestmark = [pytest.mark.integration, pytest.mark.realnode, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parents[2]
SECTION = "First rollout"
WORKERS = 4  # examples/worker-deployment.yaml
# Step 2's ways (README fences ```bash helm and ```bash kubectl).
INSTALLS = ("helm", "kubectl")


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in obj["status"].get("conditions") or []}


def _tail(run: BlocksRun, lines: int = 80) -> str:
    return "\n".join(run.output.splitlines()[-lines:])


def _journey_and_cleanup(install: str) -> tuple[list[Block], Block]:
    # CKPT_E2E_README: another copy of README, to see this test fail on a broken block.
    override = os.environ.get("CKPT_E2E_README")
    blocks = section_blocks(SECTION, Path(override).read_text() if override else None, variant=install)
    *journey, cleanup = blocks
    assert "make cluster-up REAL_NODE=1" in journey[0].text
    assert cleanup.text.strip() == "make cluster-down"
    return journey, cleanup


@pytest.mark.parametrize("install", INSTALLS)
def test_readme_first_rollout_runs_as_written(
    install: str,
    built_images: dict[str, Built],
    tmp_path: Path,
    record_property: Callable[[str, object], None],
) -> None:
    if os.environ.get("CKPT_E2E_KUBECONFIG"):
        pytest.skip("README's first rollout starts its own local cluster")
    journey, cleanup = _journey_and_cleanup(install)
    state = tmp_path / "cluster"
    env = shell_env(E2E_STATE=str(state))
    run = cleaned = None
    try:
        run = run_blocks(journey, cwd=ROOT, env=env, timeout=1800)
        print(run.output)
        for label, seconds in run.seconds.items():
            print(f"{seconds:7.1f}s  {label}")
        total = sum(run.seconds.values())
        print(f"{total:7.1f}s  README first rollout ({install}), {len(run.seconds)} blocks")
        record_property(f"readme_first_rollout_{install}_seconds", round(total, 1))
        assert run.returncode == 0, f"README block failed: {run.failed_block}\n{_tail(run)}"
        _check_what_it_left(Kubectl(resolve(["kubectl"])["kubectl"], state / "kubeconfig"), run)
    finally:
        cleaned = run_blocks([cleanup], cwd=ROOT, env=env, timeout=180)
        if cleaned.returncode != 0 or (state / "supervisor.pid").exists():
            clusterctl.cmd_down(state, 60.0)
    assert cleaned.returncode == 0, _tail(cleaned)
    assert "cluster stopped" in cleaned.output
    assert not (state / "supervisor.pid").exists()


def _check_what_it_left(kubectl: Kubectl, run: BlocksRun) -> None:
    rl = kubectl.in_namespace("rl")
    ckr = rl.json("get", "ckr", "rollout-worker")
    status = ckr["status"]
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["updatedReplicas"] == WORKERS
    assert {w["phase"] for w in status["waves"]} == {"Completed"}
    assert sum(w["updated"] for w in status["waves"]) == WORKERS
    # `ckpt-rollout status` printed the outcome.
    assert "Succeeded" in run.output
    assert "global_step_1200" in run.output

    # The operator (the chart's, or the static manifest's) runs on the real node, from the image
    # local/values.yaml and local/kubectl/ name.
    (operator,) = kubectl.in_namespace("ckpt-rollout-system").json("get", "pods")["items"]
    assert operator["spec"]["nodeName"] == "ckpt-real-node"
    assert operator["spec"]["containers"][0]["image"] == "localhost/ckpt-rollout-operator:local"

    # The workers ran with the fleet's settings file, which either way (the chart's agentSettings
    # from examples/agent-settings.yaml, or the static manifest's) holds the example's settings.
    config = rl.json("get", "configmap", "ckpt-rollout-agent")["data"]["agent.yaml"]
    example = yaml.safe_load((ROOT / "examples" / "agent-settings.yaml").read_text())
    assert yaml.safe_load(config) == example["agentSettings"]

    # No worker was Ready before the rollout: its containers were up before the CR existed, the
    # pod turned Ready only after (--await-rollout + the readiness gate), and never restarted.
    created = _time(ckr["metadata"]["creationTimestamp"])
    pods = rl.json("get", "pods", "-l", "app=rollout-worker")["items"]
    assert len(pods) == WORKERS
    for pod in pods:
        conditions = _conditions(pod)
        name = pod["metadata"]["name"]
        assert conditions["Ready"]["status"] == "True", name
        assert _time(conditions["ContainersReady"]["lastTransitionTime"]) <= created, name
        assert _time(conditions["Ready"]["lastTransitionTime"]) >= created, name
        assert [c["restartCount"] for c in pod["status"]["containerStatuses"]] == [0], name
        assert pod["spec"]["nodeName"] == "ckpt-real-node", name
