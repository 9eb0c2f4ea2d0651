"""Status patches the agent writes, built as pure functions (unit-tested without a cluster).

- the CR's `status.workers.<pod>` entry (merge-patch on the `status` subresource): a
  ckpt_api WorkerStatus, the model the CRD's schema is generated from;
- the pod condition `rollout.ckpt.dev/WeightsReady` (strategic merge on `pods/status`:
  conditions merge by `type`, so other conditions are untouched).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import WEIGHTS_READY_CONDITION, ConditionStatus, WorkerPhase

# Status objects are read by humans and kubectl; a stack trace does not belong there.
MAX_MESSAGE = 1024


def rfc3339(moment: datetime | None = None) -> str:
    moment = moment or datetime.now(UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


def worker_entry(
    *,
    version: str,
    phase: WorkerPhase,
    reason: str,
    message: str,
    checksum_verified: bool,
    bytes: int,
    seconds: float,
    last_transition_time: str,
    live_version: str | None,
    wave: int | None = None,
    uid: str | None = None,
    manifest_digest: str | None = None,
    bytes_from_peers: int | None = None,
) -> WorkerStatus:
    """This pod's entry. `version`: the version the entry is about (the one requested);
    `live_version`: what the worker serves now (differs from `version` after a failure);
    `manifest_digest`: of the version loaded, in an Updated entry (the operator pins a later
    rollback to it)."""
    return WorkerStatus(
        version=version,
        phase=phase,
        reason=reason,
        message=clip(message),
        checksum_verified=checksum_verified,
        bytes=bytes,
        bytes_from_peers=bytes_from_peers,
        seconds=round(seconds, 3),
        last_transition_time=last_transition_time,
        live_version=live_version,
        wave=wave,
        uid=uid,
        manifest_digest=manifest_digest,
    )


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
