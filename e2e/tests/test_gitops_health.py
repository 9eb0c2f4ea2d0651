"""What Argo CD and Flux conclude about real rollouts: CheckpointRollouts driven into every phase
on the local control plane (real agents, paddle tensors), each recorded as the apiserver returns
it, then judged by Argo CD's rules (our health Lua in Lua 5.1) and by Flux's (kstatus, from
sigs.k8s.io/cli-utils). One fleet of two agents walks through all phases in turn.
"""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple

import pytest

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_e2e.gitops import Health, argocd_health, kstatus
from ckpt_e2e.procs import wait_for
from ckpt_e2e.providers import Provider
from ckpt_e2e.rollout_env import WORKER_LABEL, conditions, rollout_spec

pytestmark = pytest.mark.integration

NAME = "fleet"
RIVAL = "rival"  # selects the same pods later: Stalled
FRESH = "fresh"  # selects no pod
NOBODY = {"app": WORKER_LABEL, "fleet": "nobody"}
ENDED = {"Succeeded", "Failed", "RolledBack"}


class Expected(NamedTuple):
    phase: str | None  # what the recorded status says (None: no status yet)
    argocd: str
    kstatus: str


# Recorded case -> what the status says, Argo CD's health, kstatus's status.
EXPECTED = {
    "no-status": Expected(None, "Progressing", "Current"),  # kstatus: see the test's docstring
    "progressing": Expected("Progressing", "Progressing", "InProgress"),
    "paused": Expected("Paused", "Suspended", "InProgress"),
    "selector-conflict": Expected("Pending", "Degraded", "Failed"),
    "rolling-back": Expected("RollingBack", "Progressing", "InProgress"),
    "rolled-back-aborted": Expected("RolledBack", "Degraded", "Failed"),
    "succeeded": Expected("Succeeded", "Healthy", "Current"),
    "generation-ahead": Expected("Succeeded", "Progressing", "InProgress"),
    "pending-no-workers": Expected("Pending", "Progressing", "InProgress"),
    "failed": Expected("Failed", "Degraded", "Failed"),
    "rolled-back": Expected("RolledBack", "Degraded", "Failed"),
}


def test_kstatus_names_the_object_it_cannot_read() -> None:
    """Bad input: a clear error naming the object, no verdicts for the others."""
    good = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CheckpointRollout", "metadata": {"name": "a"}}
    assert kstatus([good]) == [Health("Current", "Resource is current")]
    with pytest.raises(RuntimeError, match="object 1: Object 'Kind' is missing"):
        kstatus([good, {"metadata": {"name": "b"}}])


def _delete(provider: Provider, name: str) -> None:
    provider.rollouts.api.delete_namespaced_custom_object(GROUP, VERSION, provider.namespace, PLURAL, name)


def _stalled(provider: Provider, name: str) -> dict[str, Any]:
    def stalled() -> dict[str, Any] | None:
        obj = provider.rollouts.get(name)
        cond = conditions(obj.get("status") or {}).get("Stalled")
        return obj if cond is not None and cond["status"] == "True" else None

    return wait_for(stalled, 60, f"{name} Stalled", interval=0.2)


def _record_every_phase(provider: Provider) -> dict[str, dict[str, Any]]:
    """Case name -> the CheckpointRollout object at that moment."""
    get = provider.rollouts.get
    seen: dict[str, dict[str, Any]] = {}
    fleet = provider.fleet(2)
    held = {"waves": [1, "100%"], "pauseAfterWave": [0], "peerRelay": False}

    # The canary's load waits on the frozen source: mid-wave.
    with provider.source_stalled():
        provider.rollouts.create(NAME, provider.spec("v2", fleet, strategy=held))

        def canary_called() -> dict[str, Any] | None:
            obj = get(NAME)
            status = obj.get("status") or {}
            waves = status.get("waves") or []
            return obj if status.get("phase") == "Progressing" and waves and waves[0].get("called") else None

        seen["progressing"] = wait_for(canary_called, 60, "the canary called", interval=0.1)
    provider.rollouts.wait_phase(NAME, {"Paused"}, timeout=60)
    seen["paused"] = get(NAME)

    provider.rollouts.create(RIVAL, provider.spec("v3", fleet))
    seen["selector-conflict"] = _stalled(provider, RIVAL)
    _delete(provider, RIVAL)

    # Aborted after the canary: its way back to v1 waits on the frozen source.
    with provider.source_stalled():
        provider.cli("abort", NAME)
        provider.rollouts.wait_phase(NAME, {"RollingBack"}, timeout=60)
        seen["rolling-back"] = get(NAME)
    provider.rollouts.wait_phase(NAME, {"RolledBack"}, timeout=60)
    seen["rolled-back-aborted"] = get(NAME)

    provider.rollouts.patch_spec(NAME, {"version": "v3", "strategy": {"pauseAfterWave": []}})
    provider.rollouts.wait_phase(NAME, ENDED, timeout=90, version="v3")
    seen["succeeded"] = get(NAME)

    # With no operator running, Git syncs a new version (never published: it will fail) and a
    # new rollout: the first keeps its old status a generation behind, the second has none.
    provider.kill_operator()
    provider.rollouts.patch_spec(NAME, {"version": "v-missing", "failurePolicy": {"onFailure": "Halt"}})
    seen["generation-ahead"] = get(NAME)
    provider.rollouts.create(FRESH, rollout_spec(provider.source_uri, "v2", NOBODY))
    seen["no-status"] = get(FRESH)
    provider.start_operator()
    provider.rollouts.wait_phase(FRESH, {"Pending"}, timeout=60)
    seen["pending-no-workers"] = get(FRESH)
    provider.rollouts.wait_phase(NAME, ENDED, timeout=90, version="v-missing")
    seen["failed"] = get(NAME)

    provider.rollouts.patch_spec(NAME, {"version": "v-gone", "failurePolicy": {"onFailure": "Rollback"}})
    provider.rollouts.wait_phase(NAME, ENDED, timeout=90, version="v-gone")
    seen["rolled-back"] = get(NAME)
    return seen


def _message(obj: dict[str, Any]) -> str | None:
    return (obj.get("status") or {}).get("message")


def test_argocd_and_kstatus_judge_real_rollouts_in_every_phase(provider: Provider) -> None:
    """Every phase, the selector conflict and a spec the operator has not seen yet, as Argo CD
    (our Lua) and Flux (kstatus) see them. kstatus calls a CR without any status Current (it
    cannot tell a CR nobody reconciles yet from one that needs no reconciling): Flux may pass a
    just-applied rollout until the operator's first status write; Argo CD's Lua says Progressing."""
    started = time.monotonic()
    seen = _record_every_phase(provider)
    recorded_s = time.monotonic() - started
    assert seen.keys() == EXPECTED.keys()
    argo = {case: argocd_health(obj) for case, obj in seen.items()}
    flux = dict(zip(seen, kstatus(list(seen.values())), strict=True))
    judged_s = time.monotonic() - started - recorded_s
    print(f"gitops health: {len(seen)} objects recorded in {recorded_s:.1f}s, judged in {judged_s:.1f}s")

    got = {
        case: Expected((obj.get("status") or {}).get("phase"), argo[case].status, flux[case].status)
        for case, obj in seen.items()
    }
    wrong = {case: seen[case].get("status") for case in seen if got[case] != EXPECTED[case]}
    assert got == EXPECTED, json.dumps(wrong, indent=1)

    generation = seen["generation-ahead"]["metadata"]["generation"]
    behind = f"Waiting for the operator to observe generation {generation}"
    assert argo["generation-ahead"] == Health("Progressing", behind)
    assert flux["generation-ahead"].message == (
        f"CheckpointRollout generation is {generation}, but latest observed generation is {generation - 1}"
    )
    for case in EXPECTED.keys() - {"no-status", "generation-ahead"}:
        message = _message(seen[case])
        assert message, (case, seen[case]["status"])
        # Argo CD shows the status message; kstatus the Reconciling or Stalled condition's,
        # which is the same text.
        assert argo[case].message == message, case
        if flux[case].status != "Current":
            assert flux[case].message == message, case
    assert "VersionNotFound" in json.dumps(seen["failed"]["status"]), seen["failed"]["status"]
