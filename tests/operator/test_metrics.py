"""Per-CheckpointRollout gauges: what each status shows, and that a finished loop leaves none."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.status import CheckpointRolloutStatus
from ckpt_rollout.domain.world import parse_time
from ckpt_rollout.io import metrics

STARTED = "2026-03-01T10:00:00Z"
T0 = parse_time(STARTED)
assert T0 is not None


def _spec(**extra: Any) -> CheckpointRolloutSpec:
    body = {"version": "v2", "source": {"uri": "http://src"}, "selector": {"matchLabels": {"app": "w"}}}
    return CheckpointRolloutSpec.model_validate({**body, **extra})


def _status(**fields: Any) -> CheckpointRolloutStatus:
    return CheckpointRolloutStatus.model_validate(fields)


@pytest.mark.parametrize(
    ("spec", "status", "expected"),
    [
        pytest.param(
            _spec(strategy={"waves": [1, "50%", "100%"]}),
            _status(),
            metrics.RolloutGauges(0, 0, 0, 0, 3, None, None, None),
            id="new-cr-counts-zero-waves-from-spec",
        ),
        pytest.param(
            _spec(timeouts={"progressDeadlineSeconds": 900, "workerSeconds": 60}),
            _status(
                phase="Progressing",
                replicas=5,
                updatedReplicas=2,
                failedReplicas=1,
                currentWave=1,
                totalWaves=3,
                targetVersion="v2",
                stableVersion="v1",
                startedAt=STARTED,
            ),
            metrics.RolloutGauges(5, 2, 1, 1, 3, "v2", "v1", T0 + 900),
            id="running-deadline-is-start-plus-limit",
        ),
        pytest.param(
            _spec(),
            _status(phase="Progressing", startedAt=STARTED, pausedSeconds=120.5),
            metrics.RolloutGauges(0, 0, 0, 0, 2, None, None, T0 + 1800 + 120.5),
            id="paused-time-moves-the-deadline",
        ),
        pytest.param(
            _spec(strategy={"waves": ["100%"]}),
            _status(
                phase="Succeeded",
                replicas=4,
                updatedReplicas=4,
                currentWave=1,
                totalWaves=1,
                targetVersion="v2",
                stableVersion="v2",
                startedAt=STARTED,
                completedAt="2026-03-01T10:01:00Z",
            ),
            metrics.RolloutGauges(4, 4, 0, 1, 1, "v2", "v2", None),
            id="finished-has-no-deadline",
        ),
    ],
)
def test_rollout_gauges(
    spec: CheckpointRolloutSpec, status: CheckpointRolloutStatus, expected: metrics.RolloutGauges
) -> None:
    assert metrics.rollout_gauges(spec, status) == expected


def _value(metric: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(metric, labels)


def test_observe_replaces_info_series_and_forget_drops_every_series() -> None:
    key = ("ns-metrics", "fleet")
    other = ("ns-metrics", "other")
    running = _status(phase="Progressing", targetVersion="v2", stableVersion="v1", startedAt=STARTED)
    metrics.observe_rollout(key, _spec(), running)
    metrics.observe_rollout(other, _spec(), running)
    cr = {"namespace": key[0], "name": key[1]}
    assert _value("ckpt_rollout_phase", **cr, phase="Progressing") == 1
    assert _value("ckpt_rollout_phase", **cr, phase="Succeeded") == 0
    assert _value("ckpt_rollout_progress_deadline_timestamp_seconds", **cr) == T0 + 1800

    done = _status(
        phase="Succeeded", targetVersion="v2", stableVersion="v2", startedAt=STARTED, completedAt=STARTED
    )
    metrics.observe_rollout(key, _spec(), done)
    assert _value("ckpt_rollout_stable_version_info", **cr, version="v2") == 1
    assert _value("ckpt_rollout_stable_version_info", **cr, version="v1") is None, "one version at a time"
    assert _value("ckpt_rollout_progress_deadline_timestamp_seconds", **cr) is None

    metrics.forget(key)
    left = {
        (s.name, s.labels["name"])
        for family in REGISTRY.collect()
        for s in family.samples
        if s.labels.get("namespace") == key[0]
    }
    assert {name for _, name in left} == {"other"}, "forget drops every series of its own CR only"
    assert ("ckpt_rollout_phase", "other") in left
    metrics.forget(other)
