"""Worker outcomes from agent pushes (CR status) and pulls (/v1/status)."""

from typing import Any

import pytest

from ckpt_api.agent_api import AgentStatus
from ckpt_api.status import WorkerStatus
from ckpt_rollout.domain.mergepatch import apply_merge_patch, merge_diff
from ckpt_rollout.domain.outcomes import Outcome, pulled_outcome, reported_outcome, settles


@pytest.mark.parametrize(
    ("entry", "present", "called", "expected"),
    [
        ({"version": "v2", "phase": "Updated"}, True, True, Outcome.UPDATED),
        ({"version": "v2", "phase": "Failed"}, True, True, Outcome.FAILED),
        ({"version": "v2", "phase": "Updated"}, False, True, Outcome.UPDATED),  # report outlives pod
        # A pod gone (or being deleted) is gone, whatever its agent said as it shut down.
        ({"version": "v2", "phase": "Failed", "reason": "ChecksumMismatch"}, False, True, Outcome.GONE),
        ({"version": "v2", "phase": "Failed", "reason": "Cancelled"}, False, True, Outcome.GONE),
        # Cancelled on a pod still selected: its agent stopped, which decides nothing.
        ({"version": "v2", "phase": "Failed", "reason": "Cancelled"}, True, True, Outcome.WAITING),
        ({"version": "v2", "phase": "Failed", "reason": "Cancelled"}, True, False, Outcome.UNCALLED),
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
    ("entry", "settled"),
    [
        ({"version": "v2", "phase": "Updated"}, True),
        ({"version": "v2", "phase": "Failed", "reason": "ChecksumMismatch"}, True),
        ({"version": "v2", "phase": "Failed"}, True),
        ({"version": "v2", "phase": "Failed", "reason": "Cancelled"}, False),
        ({"version": "v2", "phase": "Loading"}, False),
        ({"version": "v1", "phase": "Updated"}, False),
        ({"version": "v1", "phase": "Failed", "reason": "ChecksumMismatch"}, False),
    ],
)
def test_settles(entry: dict[str, Any], settled: bool) -> None:
    """Whether an entry decides the load of v2 (a heard outcome then never replaces it)."""
    assert settles(WorkerStatus.model_validate(entry), "v2") is settled


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"state": "loading", "version": "v1", "target": "v2"}, (Outcome.WAITING, "", "")),
        (
            {"state": "idle", "version": "v2"},
            (Outcome.UPDATED, "Loaded", "confirmed by the agent's /v1/status"),
        ),
        (
            {"state": "idle", "version": "v2", "staged": True},  # a replica's follower, staged
            (Outcome.UPDATED, "Staged", "confirmed by the agent's /v1/status"),
        ),
        (
            {
                "state": "failed",
                "version": "v1",
                "last_error": {"version": "v2", "reason": "ChecksumMismatch", "message": "t0"},
            },
            (Outcome.FAILED, "ChecksumMismatch", "t0"),
        ),
        ({"state": "idle", "version": "v1", "last_error": None}, (Outcome.LOST, "", "")),
        (
            {
                "state": "failed",
                "version": "v1",
                "last_error": {"version": "v2", "reason": "Cancelled", "message": "shutting down"},
            },
            (Outcome.WAITING, "", ""),  # neither a failure nor a call to make again
        ),
        (
            {
                "state": "failed",
                "version": "v1",
                "last_error": {"version": "v0", "reason": "X", "message": "m"},
            },
            (Outcome.LOST, "", ""),
        ),
    ],
)
def test_pulled_outcome(status: dict[str, Any], expected: tuple[Outcome, str, str]) -> None:
    """(outcome, reason, message): what a pull writes to status.workers when it decides."""
    assert pulled_outcome(AgentStatus.model_validate(status), target="v2") == expected


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


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ({"a": 1, "b": {"c": 2}}, {"a": 1, "b": {"c": 2}}, {}),
        ({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": 2, "d": 4}}, {"a": None, "b": {"d": 4}}),
        ({"b": {"c": 2}}, {"b": 5}, {"b": 5}),
        ({"b": 5}, {"b": {"c": 2}}, {"b": {"c": 2}}),
        ({"waves": [1, 2]}, {"waves": [1]}, {"waves": [1]}),
        (None, {"a": 1}, {"a": 1}),
        ({"a": 1}, None, None),
    ],
)
def test_merge_diff_sends_only_what_changed(old: Any, new: Any, expected: Any) -> None:
    assert merge_diff(old, new) == expected
    if isinstance(old, dict) and isinstance(new, dict):
        assert apply_merge_patch(old, expected) == new
