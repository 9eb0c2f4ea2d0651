"""Status patch bodies (CR worker entry, pod condition), built as pure functions."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

from ckpt_agent.service.report import (
    pod_condition_patch,
    rfc3339,
    weights_ready_condition,
    worker_status_patch,
)
from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import WorkerPhase, WorkerReason
from ckpt_api.worker_entries import MAX_MESSAGE, worker_entry


def _entry(**overrides: Any) -> WorkerStatus:
    fields: dict[str, Any] = {
        "version": "global_step_1200",
        "phase": WorkerPhase.FAILED,
        "reason": WorkerReason.CHECKSUM_MISMATCH,
        "message": "tensor 'layers.0.weight' ...",
        "checksum_verified": False,
        "bytes": 1234,
        "seconds": 1.23456,
        "last_transition_time": "2026-01-02T03:04:05Z",
        "live_version": "global_step_1100",
        "wave": 2,
        "uid": "c0ffee",
        "manifest_digest": "sha256:" + "d" * 64,
    }
    fields.update(overrides)
    return worker_entry(**fields)


def test_worker_patch_touches_only_this_pods_entry() -> None:
    patch = worker_status_patch("worker-0", _entry())
    assert patch == {
        "status": {
            "workers": {
                "worker-0": {
                    "version": "global_step_1200",
                    "phase": "Failed",
                    "reason": "ChecksumMismatch",
                    "message": "tensor 'layers.0.weight' ...",
                    "checksumVerified": False,
                    "bytes": 1234,
                    "seconds": 1.235,
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                    "liveVersion": "global_step_1100",
                    "wave": 2,
                    "uid": "c0ffee",
                    "manifestDigest": "sha256:" + "d" * 64,
                    "bytesFromPeers": None,
                    "podUID": None,
                }
            }
        }
    }


def test_unset_fields_are_written_as_null_to_clear_what_an_earlier_entry_said() -> None:
    # Weights lost: nothing is live any more, so the Loading entry's liveVersion must go.
    entry = worker_status_patch("p", _entry(live_version=None, wave=None, uid=None))["status"]["workers"]["p"]
    assert (entry["liveVersion"], entry["wave"], entry["uid"]) == (None, None, None)


def test_long_messages_are_clipped() -> None:
    message = worker_status_patch("p", _entry(message="x" * 5000))["status"]["workers"]["p"]["message"]
    assert len(message) == MAX_MESSAGE
    assert message.endswith("...")


def test_weights_ready_condition_merges_by_type() -> None:
    patch = pod_condition_patch(
        weights_ready_condition(False, "Loading", "loading v2", "2026-01-02T03:04:05Z")
    )
    assert patch == {
        "status": {
            "conditions": [
                {
                    "type": "rollout.ckpt.dev/WeightsReady",
                    "status": "False",
                    "reason": "Loading",
                    "message": "loading v2",
                    "lastTransitionTime": "2026-01-02T03:04:05Z",
                }
            ]
        }
    }
    assert weights_ready_condition(True, "Loaded", "m", "t")["status"] == "True"


def test_rfc3339_is_utc_seconds() -> None:
    assert rfc3339(datetime(2026, 1, 2, 3, 4, 5, 999, tzinfo=UTC)) == "2026-01-02T03:04:05Z"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", rfc3339())
