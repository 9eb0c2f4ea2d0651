"""Rollback after a pause, deadlines, drift, selector conflicts, HA and
metrics — each on the local control plane with real agents."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from ckpt_api.vocabulary import LEASE_NAME
from ckpt_e2e.fixtures import ClusterHandle
from ckpt_e2e.procs import wait_for
from ckpt_e2e.rollout_env import (
    CLI,
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    Worker,
    conditions,
    corrupt_tensor,
    http_text,
    load_calls,
    metric_value,
    operator_with_metrics,
    publish_reference_version,
    rollout_spec,
    serving_versions,
)
from ckpt_e2e.rollout_fixtures import Fleet, OperatorIdentity

pytestmark = pytest.mark.integration


def _spec(source: CheckpointSource, version: str, fleet: Fleet, **extra: Any) -> dict[str, Any]:
    return rollout_spec(source.url, version, fleet.labels, **extra)


def _serving(workers: list[Worker], token: str, source: CheckpointSource) -> dict[str, str | None]:
    """Which published version each worker's /v1/infer output matches."""
    return serving_versions(workers, token, {v: source.version_dir(v) for v in ("v1", "v2", "v3")})


def test_pause_after_canary_then_failure_rolls_back(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    tmp_path: Path,
) -> None:
    publish_reference_version(checkpoint_source.root, "v-late-bad", 31, tmp_path)
    fleet = fleet_factory(4)
    workers = fleet.workers(4)
    rollouts.create(
        "fleet",
        _spec(
            checkpoint_source,
            "v-late-bad",
            fleet,
            verifyChecksum=True,
            # Wave 2 must read the source (a relay would hand it the canary's good bytes).
            strategy={"waves": [1, "100%"], "pauseAfterWave": [0], "peerRelay": False},
        ),
    )
    status = rollouts.wait_phase("fleet", {"Paused"})
    assert status["waveProgress"] == "1/2"
    assert conditions(status)["Paused"]["status"] == "True"
    (canary,) = status["waves"][0]["pods"]

    # The source goes bad after the canary loaded; promote lets wave 2 hit it.
    corrupt_tensor(checkpoint_source.version_dir("v-late-bad"), "head.weight")
    rollouts.api.patch_namespaced_custom_object(
        "rollout.ckpt.dev",
        "v1alpha1",
        rollouts.namespace,
        "checkpointrollouts",
        "fleet",
        {"metadata": {"annotations": {"rollout.ckpt.dev/promote": "0@v-late-bad"}}},
    )
    status = rollouts.wait_phase("fleet", {"RolledBack", "Failed", "Succeeded"})
    assert status["phase"] == "RolledBack", status.get("message")
    assert status["rollback"]["version"] == "v1"
    assert canary in status["rollback"]["pods"]
    assert "ChecksumMismatch" in status["message"]
    assert conditions(status)["Failed"]["status"] == "True"
    assert set(_serving(workers, fleet.token, checkpoint_source).values()) == {"v1"}
    reasons = [e["reason"] for e in rollouts.events("fleet")]
    assert {"Paused", "RollbackStarted", "RolledBack"} <= set(reasons)


def test_paused_time_does_not_count_toward_the_deadline(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
) -> None:
    fleet = fleet_factory(2)
    rollouts.create(
        "fleet",
        _spec(
            checkpoint_source,
            "v2",
            fleet,
            paused=True,
            timeouts={"workerSeconds": 3, "progressDeadlineSeconds": 3},
        ),
    )
    rollouts.wait_phase("fleet", {"Paused"})
    # Stay paused past the deadline: still Paused, not failed.
    with pytest.raises(AssertionError):
        rollouts.wait_phase("fleet", {"Failed", "RolledBack"}, timeout=5)
    rollouts.patch_spec("fleet", {"paused": False})
    status = rollouts.wait_phase("fleet", {"Succeeded", "Failed", "RolledBack"})
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["pausedSeconds"] >= 4


def test_hung_worker_exceeds_the_progress_deadline_then_a_retry_succeeds(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    cluster: ClusterHandle,
) -> None:
    fleet = fleet_factory(2)
    workers = fleet.workers(2)
    processes = list(fleet.runtime.running().values())
    for proc in processes:  # every agent hangs: whoever is the canary never answers
        os.kill(proc.pid, signal.SIGSTOP)
    try:
        rollouts.create(
            "fleet",
            _spec(
                checkpoint_source,
                "v2",
                fleet,
                # The operator's calls to a stopped agent time out after 3 s (--agent-timeout in
                # the harness): past this deadline, which the next step sees before anything else.
                timeouts={"workerSeconds": 2, "progressDeadlineSeconds": 2},
                failurePolicy={"onFailure": "Halt"},
            ),
        )
        status = rollouts.wait_phase("fleet", {"Failed", "Succeeded"}, timeout=60)
    finally:
        for proc in processes:
            os.kill(proc.pid, signal.SIGCONT)
    assert status["phase"] == "Failed"
    assert conditions(status)["Failed"]["reason"] == "ProgressDeadlineExceeded", status

    # The cause fixed (agents answer again, a deadline that fits), the same version once more.
    rollouts.patch_spec("fleet", {"timeouts": {"workerSeconds": 60, "progressDeadlineSeconds": 300}})
    retry = subprocess.run(
        [*CLI, "retry", "fleet", "-n", rollouts.namespace, "--kubeconfig", str(cluster.kubeconfig)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert retry.returncode == 0, retry.stderr
    status = rollouts.wait_phase("fleet", {"Succeeded", "Failed", "RolledBack"}, timeout=120)
    assert status["phase"] == "Succeeded", status.get("message")
    assert set(_serving(workers, fleet.token, checkpoint_source).values()) == {"v2"}
    reasons = [e["reason"] for e in rollouts.events("fleet")]
    assert reasons.count("RolloutStarted") == 2


def _weights_ready(cluster: ClusterHandle, namespace: str, fleet: Fleet) -> dict[str, tuple[str, str]]:
    pods = cluster.kubectl.in_namespace(namespace).json("get", "pods", "-l", f"fleet={fleet.name}")
    found = {}
    for pod in pods["items"]:
        for cond in pod["status"].get("conditions", []):
            if cond["type"] == "rollout.ckpt.dev/WeightsReady":
                found[pod["metadata"]["name"]] = (cond["status"], cond.get("reason", ""))
    return found


def test_pod_added_after_success_is_brought_to_the_stable_version(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    cluster: ClusterHandle,
) -> None:
    fleet = fleet_factory(2, extra_args=["--await-rollout"])
    rollouts.create("fleet", _spec(checkpoint_source, "v2", fleet))
    rollouts.wait_phase("fleet", {"Succeeded"})
    first = {w.name for w in fleet.workers(2)}
    assert {s for s, _ in _weights_ready(cluster, rollouts.namespace, fleet).values()} == {"True"}

    # With the operator away, the new pod loads its boot weights but is not WeightsReady.
    operator.stop()
    fleet.scale(3)
    workers = fleet.workers(3)
    (new,) = [w for w in workers if w.name not in first]

    def new_pod_condition() -> tuple[str, str] | None:
        return _weights_ready(cluster, rollouts.namespace, fleet).get(new.name)

    assert wait_for(new_pod_condition, 30, "the new pod's WeightsReady condition") == (
        "False",
        "AwaitingRollout",
    )
    assert _serving([new], fleet.token, checkpoint_source)[new.name] == "v1"

    operator.start()

    def all_on_v2() -> bool:
        return set(_serving(workers, fleet.token, checkpoint_source).values()) == {"v2"}

    wait_for(all_on_v2, 60, "the new pod serving v2", interval=0.5)
    status = rollouts.wait_phase("fleet", {"Succeeded"})
    assert status["updatedReplicas"] == 3
    assert status["waves"][-1]["kind"] == "Drift"
    assert status["waves"][-1]["pods"] == [new.name]
    wait_for(
        lambda: {s for s, _ in _weights_ready(cluster, rollouts.namespace, fleet).values()} == {"True"},
        30,
        "every pod WeightsReady",
    )


def test_overlapping_selectors_stall_the_later_rollout(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
) -> None:
    fleet = fleet_factory(2)
    workers = fleet.workers(2)
    rollouts.create("first", _spec(checkpoint_source, "v2", fleet))
    rollouts.wait_phase("first", {"Succeeded"})
    rollouts.create(
        "second",
        {**_spec(checkpoint_source, "v3", fleet), "selector": {"matchLabels": {"app": fleet.labels["app"]}}},
    )

    def stalled() -> dict[str, Any] | None:
        cond = conditions(rollouts.status("second")).get("Stalled")
        return cond if cond and cond["status"] == "True" else None

    cond = wait_for(stalled, 30, "second rollout Stalled")
    assert cond["reason"] == "SelectorConflict"
    assert "first" in cond["message"]
    assert set(_serving(workers, fleet.token, checkpoint_source).values()) == {"v2"}
    assert all(load_calls(w, fleet.token) == 1 for w in workers)


@pytest.fixture
def operator_pair(
    crd_installed: None,
    namespace: str,
    operator_identity: OperatorIdentity,
    tmp_path: Path,
) -> Iterator[tuple[OperatorProcess, OperatorProcess]]:
    args = ["--leader-election", "--lease-namespace", namespace]
    pair = tuple(
        OperatorProcess(
            operator_identity.kubeconfig,
            namespace,
            operator_identity.token_file,
            tmp_path / "ops",
            args,
            name=n,
        )
        for n in ("op-a", "op-b")
    )
    for op in pair:
        op.start()
    yield pair  # type: ignore[misc]
    for op in pair:
        op.stop()


def test_two_replicas_hand_over_without_double_updates(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator_pair: tuple[OperatorProcess, OperatorProcess],
    rollouts: Rollouts,
    cluster: ClusterHandle,
) -> None:
    fleet = fleet_factory(4, initial_version="b1", big=True)
    workers = fleet.workers(4)
    lease = cluster.kubectl.in_namespace(rollouts.namespace)

    def holder() -> str | None:
        out = lease.run("get", "lease", LEASE_NAME, "-o", "jsonpath={.spec.holderIdentity}", check=False)
        return out.stdout.strip() or None

    wait_for(holder, 30, "a lease holder")
    rollouts.create("fleet", _spec(checkpoint_source, "b2", fleet, strategy={"waves": [1, 2, "100%"]}))

    def wave2_started() -> bool:
        return len(rollouts.status("fleet").get("waves") or []) >= 2

    wait_for(wave2_started, 120, "wave 2 started", interval=0.05)
    # Each replica holds the Lease as "<hostname>-<pid>" (ckpt_rollout.controller.leader).
    identity = {op.name: f"{socket.gethostname()}-{op.proc.pid if op.proc else None}" for op in operator_pair}
    (active,) = [op for op in operator_pair if identity[op.name] == holder()]
    (standby,) = [op for op in operator_pair if op is not active]
    before = lease.json("get", "lease", LEASE_NAME)["spec"]
    active.kill()
    wait_for(lambda: holder() == identity[standby.name], 60, "the standby to take the Lease")
    after = lease.json("get", "lease", LEASE_NAME)["spec"]
    # A takeover, counted as one in the Lease (not the standby renewing a lease it held).
    assert after.get("leaseTransitions", 0) == before.get("leaseTransitions", 0) + 1, (before, after)
    assert after["acquireTime"] > before["acquireTime"], (before, after)
    status = rollouts.wait_phase("fleet", {"Succeeded", "Failed", "RolledBack"}, timeout=180)
    assert status["phase"] == "Succeeded", status.get("message")
    assert standby.alive
    # Logging is set up before the election: the standby's wait is in its log.
    assert "waiting for lease" in standby.log_path.read_text()
    for w in workers:
        assert load_calls(w, fleet.token) == 1, w.name


def test_operator_metrics(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    crd_installed: None,
    namespace: str,
    operator_identity: OperatorIdentity,
    rollouts: Rollouts,
    tmp_path: Path,
) -> None:
    identity = operator_identity
    with operator_with_metrics(identity.kubeconfig, namespace, identity.token_file, tmp_path) as (_, port):
        fleet = fleet_factory(2)
        rollouts.create("fleet", _spec(checkpoint_source, "v2", fleet))
        rollouts.wait_phase("fleet", {"Succeeded"})
        text = http_text(f"http://127.0.0.1:{port}/metrics")
        # Idle: a finished CR is stepped from kopf's live body every idle_poll_s (2 s); three
        # of those steps must not cost one API request.
        time.sleep(6.5)
        idle_text = http_text(f"http://127.0.0.1:{port}/metrics")
    requests = metric_value(text, "ckpt_rollout_api_requests_total")
    assert requests > 0  # the counter works: the rollout's status patches
    assert metric_value(idle_text, "ckpt_rollout_api_requests_total") == requests
    # Every step read the live body: no GET of the CR, ever (the copies are ordered by
    # resourceVersion, never re-read).
    assert metric_value(idle_text, "ckpt_rollout_api_requests_total", {"verb": "get"}) == 0
    assert metric_value(text, "ckpt_rollout_workers_total", {"result": "updated"}) == 2
    assert metric_value(text, "ckpt_rollout_duration_seconds_count", {"phase": "Succeeded"}) == 1
    assert metric_value(text, "ckpt_rollout_wave_duration_seconds_count") == 2
    assert metric_value(text, "ckpt_rollout_agent_call_seconds_count", {"call": "update_weights"}) == 2
    assert metric_value(text, "ckpt_rollout_phase", {"name": "fleet", "phase": "Succeeded"}) == 1


def test_json_logs_one_object_per_line(
    crd_installed: None,
    namespace: str,
    operator_identity: OperatorIdentity,
    tmp_path: Path,
) -> None:
    op = OperatorProcess(
        operator_identity.kubeconfig,
        namespace,
        operator_identity.token_file,
        tmp_path / "op",
        ["--log-format", "json"],
    )
    op.start()
    try:
        lines = wait_for(
            lambda: [ln for ln in op.log_path.read_text().splitlines() if ln.strip()][:3] or None,
            30,
            "the operator's first log lines",
        )
    finally:
        op.stop()
    for line in lines:
        record = json.loads(line)
        assert record["message"], line
