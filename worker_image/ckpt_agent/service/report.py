"""Status patches the agent writes, built as pure functions (unit-tested without a cluster).

- the CR's `status.workers.<pod>` entry (merge-patch on the `status` subresource): a
  ckpt_api WorkerStatus, built by ckpt_api.worker_entries.worker_entry;
- the pod condition `rollout.ckpt.dev/WeightsReady` (strategic merge on `pods/status`:
  conditions merge by `type`, so other conditions are untouched).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import WEIGHTS_READY_CONDITION, ConditionStatus
from ckpt_api.worker_entries import clip


def rfc3339(moment: datetime | None = None) -> str:
    moment = moment or datetime.now(UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def entry_json(entry: WorkerStatus) -> dict[str, Any]:
    """The entry as written: every field, unset ones as null, so that the merge patch also
    clears what an earlier entry of this pod said (a liveVersion after the weights were lost)."""
    return entry.model_dump(by_alias=True, mode="json")


def worker_status_patch(pod_name: str, entry: WorkerStatus) -> dict[str, Any]:
    """Merge-patch body for the CR: touches only this pod's entry."""
    return {"status": {"workers": {pod_name: entry_json(entry)}}}


def weights_ready_condition(
    ready: bool, reason: str, message: str, last_transition_time: str
) -> dict[str, Any]:
    return {
        "type": WEIGHTS_READY_CONDITION,
        "status": ConditionStatus.TRUE if ready else ConditionStatus.FALSE,
        "reason": reason,
        "message": clip(message),
        "lastTransitionTime": last_transition_time,
    }


def pod_condition_patch(condition: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"conditions": [condition]}}
