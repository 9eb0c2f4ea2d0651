"""The operator on a real control plane, driving real agents (paddle engine) in kwok pods."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from ckpt_agent.synth import expected_infer_output
from ckpt_e2e.kubectl import Kubectl
from ckpt_e2e.procs import wait_for
from ckpt_e2e.rollout_env import (
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    Worker,
    corrupt_tensor,
    http_json,
    publish_reference_version,
    served_output,
    update_calls,
)
from ckpt_e2e.rollout_fixtures import Fleet

pytestmark = pytest.mark.integration


def _spec(source: CheckpointSource, version: str, fleet: Fleet, **extra: Any) -> dict[str, Any]:
    return {
        "version": version,
        "source": {"uri": source.url},
        "selector": {"matchLabels": fleet.labels},
        **extra,
    }


def _serves(worker: Worker, token: str, version_dir: Any) -> bool:
    return bool(np.allclose(served_output(worker, token), expected_infer_output(version_dir), atol=1e-5))


def test_five_workers_three_waves_with_checksums(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    kubectl: Kubectl,
) -> None:
    fleet = fleet_factory(5)
    workers = fleet.workers(5)
    assert all(_serves(w, fleet.token, checkpoint_source.version_dir("v1")) for w in workers)

    rollouts.create(
        "fleet",
        _spec(checkpoint_source, "v2", fleet, verifyChecksum=True, strategy={"waves": [1, "60%", "100%"]}),
    )
    kubectl.run("wait", "--for=condition=Complete", "ckr/fleet", "--timeout=180s", timeout=200)

    status = rollouts.status("fleet")
    assert status["phase"] == "Succeeded"
    assert status["stableVersion"] == "v2"
    assert status["updatedReplicas"] == 5
    assert status["replicas"] == 5
    assert [len(w["pods"]) for w in status["waves"]] == [1, 2, 2]
    assert all(w["phase"] == "Completed" for w in status["waves"])
    assert status.get("workers", {}) == {}, "successes are folded into wave counters"
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Complete"] == "True"
    assert conditions["Ready"] == "True"
    (canary,) = status["waves"][0]["pods"]
    for w in workers:
        assert _serves(w, fleet.token, checkpoint_source.version_dir("v2")), w.name
        assert update_calls(w, fleet.token) == 1, w.name
        # Peer relay (on by default): after the canary, bytes come from updated peers.
        last = http_json(w.url("/v1/status"), token=fleet.token)["last_load"]
        if w.name == canary:
            assert last["peer"] is None
        else:
            assert last["peer"] is not None, w.name
            assert last["bytes_from_peer"] > 0, last
            assert last["fallback_reason"] is None, last

    reasons = [e["reason"] for e in rollouts.events("fleet")]
    assert reasons.count("WaveStarted") == 3
    assert reasons.count("WaveCompleted") == 3
    assert "RolloutCompleted" in reasons

    table = kubectl.run("get", "ckr", "fleet").stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "VERSION", "PHASE", "UPDATED", "REPLICAS", "WAVE", "AGE"]
    assert table.splitlines()[1].split()[1:6] == ["v2", "Succeeded", "5", "5", "3/3"]


def test_corrupted_tensor_halts_at_the_canary(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    tmp_path: Any,
) -> None:
    publish_reference_version(checkpoint_source.root, "v-corrupt", 9, tmp_path)
    corrupt_tensor(checkpoint_source.version_dir("v-corrupt"), "layers.1.weight")
    fleet = fleet_factory(4)
    workers = fleet.workers(4)

    rollouts.create(
        "fleet",
        _spec(
            checkpoint_source,
            "v-corrupt",
            fleet,
            verifyChecksum=True,
            strategy={"waves": [1, "100%"]},
            failurePolicy={"maxFailures": 0, "onFailure": "Halt"},
        ),
    )
    status = rollouts.wait_phase("fleet", {"Failed", "Succeeded"})
    assert status["phase"] == "Failed"
    assert len(status["waves"]) == 1, "no wave after the failed canary"
    (canary,) = status["waves"][0]["pods"]
    entry = status["workers"][canary]
    assert entry["phase"] == "Failed"
    assert entry["reason"] == "ChecksumMismatch"
    assert "layers.1.weight" in entry["message"]
    failed = {c["type"]: c for c in status["conditions"]}["Failed"]
    assert failed["status"] == "True"
    assert failed["reason"] == "ChecksumMismatch"

    for w in workers:
        # The canary still serves v1; nobody else was even asked.
        assert _serves(w, fleet.token, checkpoint_source.version_dir("v1")), w.name
        expected_calls = 1 if w.name == canary else 0
        assert update_calls(w, fleet.token) == expected_calls, w.name
    reasons = [e["reason"] for e in rollouts.events("fleet")]
    assert "WorkerFailed" in reasons
    assert "RolloutFailed" in reasons


def test_operator_killed_mid_wave_resumes_without_double_calls(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    tmp_path: Any,
) -> None:
    fleet = fleet_factory(5, initial_version="b1", big=True)
    workers = fleet.workers(5)
    rollouts.create(
        "fleet",
        _spec(checkpoint_source, "b2", fleet, verifyChecksum=True, strategy={"waves": [1, "60%", "100%"]}),
    )

    def wave2_called() -> dict[str, Any] | None:
        status = rollouts.status("fleet")
        waves = status.get("waves") or []
        return status if len(waves) >= 2 and waves[1].get("called") else None

    wait_for(wave2_called, 120, "wave 2 calls", interval=0.05)
    operator.kill()
    frozen = rollouts.status("fleet")
    assert frozen["phase"] == "Progressing"
    assert frozen["waves"][1]["phase"] == "Running", "killed in the middle of wave 2"

    operator.start()
    status = rollouts.wait_phase("fleet", {"Succeeded", "Failed"}, timeout=240)
    assert status["phase"] == "Succeeded", status.get("message")
    assert [w["phase"] for w in status["waves"]] == ["Completed"] * 3
    for w in workers:
        assert update_calls(w, fleet.token) == 1, w.name
        assert _serves(w, fleet.token, checkpoint_source.version_dir("b2")), w.name
