"""Status patches the agent writes, built as pure functions (unit-tested without a cluster).

- the CR's `status.workers.<pod>` entry (merge-patch on the `status` subresource);
- the pod condition `rollout.ckpt.dev/WeightsReady` (strategic merge on `pods/status`:
  conditions merge by `type`, so other conditions are untouched).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ckpt_api.constants import WEIGHTS_READY_CONDITION

# Status objects are read by humans and kubectl; a stack trace does not belong there.
MAX_MESSAGE = 1024

Phase = Literal["Loading", "Updated", "Failed"]


def rfc3339(moment: datetime | None = None) -> str:
    moment = moment or datetime.now(UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def clip(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


@dataclass(frozen=True)
class WorkerEntry:
    version: str  # the version this entry is about (the one requested)
    phase: Phase
    reason: str
    message: str
    checksum_verified: bool
    bytes: int
    seconds: float
    last_transition_time: str
    live_version: str | None  # what the worker serves now (differs from `version` on failure)
    wave: int | None = None
    uid: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "phase": self.phase,
            "reason": self.reason,
            "message": clip(self.message),
            "checksumVerified": self.checksum_verified,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "lastTransitionTime": self.last_transition_time,
            "liveVersion": self.live_version,
            "wave": self.wave,
            "uid": self.uid,
        }


def worker_status_patch(pod_name: str, entry: WorkerEntry) -> dict[str, Any]:
    """Merge-patch body for the CR: touches only this pod's entry."""
    return {"status": {"workers": {pod_name: entry.to_json()}}}


def weights_ready_condition(
    ready: bool, reason: str, message: str, last_transition_time: str
) -> dict[str, Any]:
    return {
        "type": WEIGHTS_READY_CONDITION,
        "status": "True" if ready else "False",
        "reason": reason,
        "message": clip(message),
        "lastTransitionTime": last_transition_time,
    }


def pod_condition_patch(condition: dict[str, Any]) -> dict[str, Any]:
    return {"status": {"conditions": [condition]}}
