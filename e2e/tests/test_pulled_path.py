"""Big waves are pulled, small ones pushed — on the local control plane with real paddle agents.

A wave of up to 8 pods is pushed: each agent merge-patches its own status.workers entry
(Loading, then Updated). A bigger wave is pulled: its agents are asked not to write the CR and
the operator polls their /v1/status. What tells the two apart from outside is the CR's history
(a watch, `kubectl get ckr -w`): only an agent ever writes a Loading entry, so a pushed wave shows
one per member and a pulled wave none, yet completes — its outcomes can only have been pulled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from kubernetes import client

from ckpt_e2e.procs import WaitTimeout, wait_for
from ckpt_e2e.rollout_env import (
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    Worker,
    conditions,
    rollout_spec,
    serving_versions,
    update_calls,
)
from ckpt_e2e.rollout_fixtures import Fleet
from ckpt_e2e.status_history import StatusHistory, record

pytestmark = pytest.mark.integration

NAME = "fleet"
PODS = 12
ENDED = {"Succeeded", "Failed", "RolledBack"}


def _rolled_out(
    rollouts: Rollouts, fleet: Fleet, workers: list[Worker], version: str, start: Callable[[], object]
) -> tuple[dict[str, Any], dict[str, float]]:
    """``start()`` a rollout of ``version`` and wait for it to succeed; returns the final status
    and, per pod, the update_weights requests its agent answered meanwhile."""
    before = {w.name: update_calls(w, fleet.token) for w in workers}
    start()
    status = rollouts.wait_phase(NAME, ENDED, timeout=240, version=version)
    assert status["phase"] == "Succeeded", f"{status.get('message')}; waves={status.get('waves')}"
    return status, {w.name: update_calls(w, fleet.token) - before[w.name] for w in workers}


def _settled(rollouts: Rollouts, history: StatusHistory, version: str, pods: list[str]) -> dict[str, Any]:
    """The status once the agents of ``pods`` have written their whole load of ``version`` and the
    operator has seen those writes: a report that lands after the operator pulled that pod (on a
    loaded machine, later than pull_after_s) is folded away then."""
    history.wait_reported(version, pods)

    def folded() -> dict[str, Any] | None:
        status = rollouts.status(NAME)
        return None if status.get("workers") else status

    try:
        return wait_for(folded, 30, f"late reports of {version} folded")
    except WaitTimeout:
        raise AssertionError(f"still listed: {rollouts.status(NAME).get('workers')}") from None


def _assert_waves(
    status: dict[str, Any],
    calls: dict[str, float],
    serving: dict[str, str | None],
    events: list[tuple[str, str]],
    version: str,
    sizes: list[int],
) -> list[list[str]]:
    """What a user checks after a rollout of ``version`` planned in waves of ``sizes`` pods:
    status, events, what each pod serves, one call each. Returns the waves' members."""
    waves = status["waves"]
    assert [len(w["pods"]) for w in waves] == sizes
    assert [(w["kind"], w["phase"], w["updated"], w.get("failed", 0)) for w in waves] == [
        ("Spec", "Completed", n, 0) for n in sizes
    ]
    members = [list(w["pods"]) for w in waves]
    assert sorted(p for pods in members for p in pods) == sorted(serving), "each pod in exactly one wave"
    assert (status["targetVersion"], status["stableVersion"]) == (version, version)
    assert (status["updatedReplicas"], status["replicas"], status["failedReplicas"]) == (PODS, PODS, 0)
    assert status.get("workers", {}) == {}, "successes are folded into the wave counters"
    assert conditions(status)["Complete"]["status"] == "True"
    assert serving == {pod: version for pod in serving}
    assert calls == {pod: 1 for pod in serving}, "one update_weights request per pod"
    for index, pods in enumerate(members):
        label = f"wave {index + 1}/{len(sizes)}"
        prefix = f"{label}: {len(pods)} pods: "
        (started,) = [m for r, m in events if r == "WaveStarted" and m.startswith(prefix)]
        named = started.removeprefix(prefix).removesuffix(", ...").split(", ")
        assert set(named) <= set(pods), (started, pods)
        assert ("WaveCompleted", f"{label} completed: {len(pods)} updated") in events
    assert ("RolloutCompleted", f"{version} is live on {PODS} pods") in events
    return members


def test_a_wave_of_eight_is_pushed_and_a_wave_of_nine_is_pulled(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    k8s_api: client.ApiClient,
    namespace: str,
) -> None:
    fleet = fleet_factory(PODS)
    workers = fleet.workers(PODS)
    versions = {v: checkpoint_source.version_dir(v) for v in ("v1", "v2", "v3")}

    def check(
        status: dict[str, Any], calls: dict[str, float], version: str, sizes: list[int]
    ) -> list[list[str]]:
        serving = serving_versions(workers, fleet.token, versions)
        events = [(e["reason"], e["message"]) for e in rollouts.events(NAME)]
        return _assert_waves(status, calls, serving, events, version, sizes)

    with record(k8s_api, namespace, NAME) as history:
        # v2 in waves of 4 and 8: both within the push limit.
        spec = rollout_spec(checkpoint_source.url, "v2", fleet.labels, strategy={"waves": [4, "100%"]})
        _, calls = _rolled_out(rollouts, fleet, workers, "v2", lambda: rollouts.create(NAME, spec))
        status = _settled(rollouts, history, "v2", [w.name for w in workers])  # a wave of 8 is pushed
        check(status, calls, "v2", [4, 8])

        # v3 on the same CR in waves of 3 and 9: the second is one over the limit.
        patch = {"version": "v3", "strategy": {"waves": [3, "100%"]}}
        status, calls = _rolled_out(rollouts, fleet, workers, "v3", lambda: rollouts.patch_spec(NAME, patch))
        status = _settled(rollouts, history, "v3", status["waves"][0]["pods"])
        _, pulled_wave = check(status, calls, "v3", [3, 9])
        # Agents of a pulled wave are asked not to write the CR at all: none may show up, ever.
        pushed = sorted(set(pulled_wave) & history.agent_reported("v3"))
        assert pushed == [], f"a wave of 9 is pulled, yet these of its agents wrote their load: {pushed}"
