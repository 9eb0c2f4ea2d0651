"""The operator ignores status.workers entries the worker admission policy would have refused
(where it is not installed): keys that are no pod of the rollout, entries of an earlier pod of
the same name. A table of the pure rule, then one executor step with such entries in the CR."""

from __future__ import annotations

from typing import Any

import pytest
from test_executor import Agents, Api, _rollout

from ckpt_api.status import CheckpointRolloutStatus
from ckpt_rollout.controller.executor import Reconciler
from ckpt_rollout.domain.entry_trust import trusted_status, untrusted_entries
from ckpt_rollout.domain.world import Memory, Pod, Tuning

UPDATED = {"version": "v2", "phase": "Updated", "reason": "Loaded"}


def _status(workers: dict[str, dict[str, Any]], **more: Any) -> CheckpointRolloutStatus:
    waves = [{"index": 0, "target": 2, "pods": ["a", "b"], "called": ["a", "b"]}]
    return CheckpointRolloutStatus.model_validate({"waves": waves, "workers": workers, **more})


@pytest.mark.parametrize(
    ("workers", "live", "more", "ignored"),
    [
        # Selected pods, no UID recorded (the operator's own entries, older agents): kept.
        ({"a": UPDATED, "b": UPDATED}, {"a": "ua", "b": "ub"}, {}, {}),
        ({"a": {**UPDATED, "podUID": "ua"}}, {"a": "ua"}, {}, {}),
        # Written by an earlier pod of the same name.
        (
            {"a": {**UPDATED, "podUID": "old"}},
            {"a": "ua"},
            {},
            {"a": "written by pod UID old, not the live pod's ua"},
        ),
        # The live pod's UID unknown: nothing to compare.
        ({"a": {**UPDATED, "podUID": "old"}}, {"a": ""}, {}, {}),
        # A member that went away keeps its entry (what it reported before it left counts).
        ({"b": UPDATED}, {"a": "ua"}, {}, {}),
        ({"b": {**UPDATED, "podUID": "ub"}}, {"a": "ua"}, {}, {}),
        # A key no wave or rollback holds and no selected pod has.
        ({"x": UPDATED}, {"a": "ua"}, {}, {"x": "not a pod this rollout selects or called"}),
        # So does one whose place in its wave another took (replaced).
        ({"c": UPDATED}, {"a": "ua"}, {"waves": [{"index": 0, "target": 1, "replaced": ["c"]}]}, {}),
        # A rollback's members count as members too.
        ({"r": UPDATED}, {}, {"rollback": {"version": "v1", "reason": "Aborted", "pods": ["r"]}}, {}),
    ],
)
def test_untrusted_entries(
    workers: dict[str, dict[str, Any]], live: dict[str, str], more: dict[str, Any], ignored: dict[str, str]
) -> None:
    status = _status(workers, **more)
    assert untrusted_entries(status, live) == ignored
    kept = trusted_status(status, ignored).workers
    assert sorted(kept) == sorted(set(workers) - set(ignored))


async def test_the_operator_does_not_act_on_entries_it_cannot_tie_to_its_pods() -> None:
    """A stale Updated entry of a recreated pod, and a Failed entry under a key of no pod of the
    rollout: trusted, the wave would be complete and the failure would roll the rollout back.
    Ignored, the recreated pod is asked again, nothing fails, and both entries stay untouched."""
    obj, _ = _rollout(2, 4)
    fleet = [
        Pod(f"w-{i:03d}", f"127.3.0.{i + 1}", {"app": "rollout-worker"}, uid=f"uid-{i}") for i in range(2)
    ]
    stale = {**UPDATED, "podUID": "uid-before-restart"}
    forged = {"version": "v2", "phase": "Failed", "reason": "ChecksumMismatch"}
    obj["status"] |= {
        "phase": "Progressing",
        "targetVersion": "v2",
        "waves": [{"index": 0, "target": 2, "pods": ["w-000", "w-001"], "called": ["w-000", "w-001"]}],
        "workers": {"w-000": stale, "w-001": {**UPDATED, "podUID": "uid-1"}, "intruder": forged},
    }
    api = Api(obj)
    memory = Memory()
    await Reconciler(api, Agents(api), Tuning()).step(api.obj, fleet, memory, lambda *_: None)  # type: ignore[arg-type]
    status = api.obj["status"]
    assert status["phase"] == "Progressing"
    assert status["waves"][0].get("phase", "Running") == "Running"
    assert status["workers"]["w-000"] == stale
    assert status["workers"]["intruder"] == forged
    assert sorted(memory.ignored) == [
        "intruder: not a pod this rollout selects or called",
        "w-000: written by pod UID uid-before-restart, not the live pod's uid-0",
    ]
