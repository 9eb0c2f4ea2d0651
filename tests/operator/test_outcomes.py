"""Worker outcomes from agent pushes (CR status) and pulls (/v1/status)."""

from typing import Any

import pytest

from ckpt_api.agent_api import AgentStatus
from ckpt_api.status import WorkerStatus
from ckpt_rollout.mergepatch import apply_merge_patch
from ckpt_rollout.outcomes import Outcome, pulled_outcome, reported_outcome


@pytest.mark.parametrize(
    ("entry", "present", "called", "expected"),
    [
        ({"version": "v2", "phase": "Updated"}, True, True, Outcome.UPDATED),
        ({"version": "v2", "phase": "Failed"}, True, True, Outcome.FAILED),
        ({"version": "v2", "phase": "Updated"}, False, True, Outcome.UPDATED),  # report outlives pod
        ({"version": "v1", "phase": "Updated"}, True, True, Outcome.WAITING),  # stale: older version
        ({"version": "v2", "phase": "Loading"}, True, True, Outcome.WAITING),
        (None, True, False, Outcome.UNCALLED),
        (None, False, True, Outcome.GONE),
        (None, False, False, Outcome.GONE),
    ],
)
def test_reported_outcome(
    entry: dict[str, Any] | None, present: bool, called: bool, expected: Outcome
) -> None:
    parsed = WorkerStatus.model_validate(entry) if entry is not None else None
    assert reported_outcome(parsed, target="v2", present=present, called=called) is expected


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"state": "loading", "version": "v1", "target": "v2"}, Outcome.WAITING),
        ({"state": "idle", "version": "v2"}, Outcome.UPDATED),
        (
            {
                "state": "failed",
                "version": "v1",
                "last_error": {"version": "v2", "reason": "ChecksumMismatch", "message": "t0"},
            },
            Outcome.FAILED,
        ),
        ({"state": "idle", "version": "v1", "last_error": None}, Outcome.LOST),
        (
            {
                "state": "failed",
                "version": "v1",
                "last_error": {"version": "v0", "reason": "X", "message": "m"},
            },
            Outcome.LOST,
        ),
    ],
)
def test_pulled_outcome(status: dict[str, Any], expected: Outcome) -> None:
    outcome, reason, _ = pulled_outcome(AgentStatus.model_validate(status), target="v2")
    assert outcome is expected
    if expected is Outcome.FAILED:
        assert reason == "ChecksumMismatch"


@pytest.mark.parametrize(
    ("target", "patch", "expected"),
    [
        ({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}}, {"a": 1, "b": {"d": 3, "e": 4}}),
        ({"workers": {"p": {}}}, {"workers": None}, {}),
        ({"waves": [1, 2]}, {"waves": [3]}, {"waves": [3]}),
        ({}, {"x": {"y": None}}, {"x": {}}),
    ],
)
def test_merge_patch(target: dict[str, Any], patch: dict[str, Any], expected: dict[str, Any]) -> None:
    assert apply_merge_patch(target, patch) == expected
