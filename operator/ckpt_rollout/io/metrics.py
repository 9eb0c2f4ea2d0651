"""Operator Prometheus metrics (served on --metrics-port, with the default registry's process
and Python collectors).

Per-CR series carry ``namespace`` and ``name`` (the CheckpointRollout's) and are dropped when
the CR's loop ends, so a deleted CR leaves no stale phase behind to alert on.
"""

import contextlib
from dataclasses import dataclass

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics

from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.status import CheckpointRolloutStatus
from ckpt_api.vocabulary import Phase, WorkerResult
from ckpt_rollout.domain.world import parse_time

# A `_created` series per counter and histogram doubles what Prometheus stores for a timestamp
# nobody queries (restarts show in process_start_time_seconds).
disable_created_metrics()  # type: ignore[no-untyped-call]

ROLLOUT_SECONDS = Histogram(
    "ckpt_rollout_duration_seconds",
    "Wall time of finished rollouts, by outcome phase",
    ["phase"],
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600),
)
WAVE_SECONDS = Histogram(
    "ckpt_rollout_wave_duration_seconds",
    "Wall time of completed waves",
    buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600),
)
WORKERS = Counter(
    "ckpt_rollout_workers_total", "Worker outcomes seen by the operator", ["result"]
)  # result: a ckpt_api.vocabulary.WorkerResult
AGENT_CALL_SECONDS = Histogram(
    "ckpt_rollout_agent_call_seconds",
    "Latency of operator -> agent HTTP calls",
    ["call"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
API_REQUESTS = Counter(
    "ckpt_rollout_api_requests_total",
    "CheckpointRollout reads and status writes, and worker pods' event reads, by the reconcile loops "
    "(kopf's own calls excluded)",
    ["verb"],
)

# Series born at their first increment hide it from rate() and increase(): start the known
# label values at zero.
for _phase in (Phase.SUCCEEDED, Phase.FAILED, Phase.ROLLED_BACK):
    ROLLOUT_SECONDS.labels(_phase.value)
for _result in WorkerResult:
    WORKERS.labels(_result.value)
AGENT_CALL_SECONDS.labels("update_weights")

_CR = ["namespace", "name"]
PHASE = Gauge("ckpt_rollout_phase", "1 for the current phase of each CheckpointRollout", [*_CR, "phase"])
REPLICAS = Gauge(
    "ckpt_rollout_replicas",
    "Replicas the CheckpointRollout selects: pods, or whole multi-node replicas (status.replicas)",
    _CR,
)
UPDATED = Gauge(
    "ckpt_rollout_updated_replicas", "Replicas serving the target version (status.updatedReplicas)", _CR
)
FAILED = Gauge(
    "ckpt_rollout_failed_replicas", "Replicas whose load of the target failed (status.failedReplicas)", _CR
)
CURRENT_WAVE = Gauge("ckpt_rollout_current_wave", "Spec waves completed (status.currentWave)", _CR)
TOTAL_WAVES = Gauge("ckpt_rollout_waves", "Waves in spec.strategy.waves (status.totalWaves)", _CR)
TARGET_INFO = Gauge(
    "ckpt_rollout_target_version_info", "1 for the version being rolled out", [*_CR, "version"]
)
STABLE_INFO = Gauge(
    "ckpt_rollout_stable_version_info", "1 for the last version fully rolled out", [*_CR, "version"]
)
DEADLINE = Gauge(
    "ckpt_rollout_progress_deadline_timestamp_seconds",
    "When the running rollout exceeds spec.timeouts.progressDeadlineSeconds (Unix time; pauses "
    "so far excluded); absent when no rollout runs",
    _CR,
)
_COUNTS = (REPLICAS, UPDATED, FAILED, CURRENT_WAVE, TOTAL_WAVES)
_PER_CR = (*_COUNTS, DEADLINE)


@dataclass(frozen=True)
class RolloutGauges:
    """What the per-CR gauges show for one status; None: the series is absent."""

    replicas: int
    updated: int
    failed: int
    current_wave: int
    total_waves: int
    target_version: str | None
    stable_version: str | None
    progress_deadline: float | None


def rollout_gauges(spec: CheckpointRolloutSpec, status: CheckpointRolloutStatus) -> RolloutGauges:
    started = parse_time(status.started_at)
    running = started is not None and status.completed_at is None
    return RolloutGauges(
        replicas=status.replicas or 0,
        updated=status.updated_replicas or 0,
        failed=status.failed_replicas or 0,
        current_wave=status.current_wave or 0,
        total_waves=status.total_waves if status.total_waves is not None else len(spec.strategy.waves),
        target_version=status.target_version,
        stable_version=status.stable_version,
        # A fixed instant, not a countdown: an alert compares it with time(), so it fires even
        # when the operator stops stepping the CR (hung, crash-looping), not only when it sees
        # the deadline pass itself.
        progress_deadline=(
            started + spec.timeouts.progress_deadline_seconds + (status.paused_seconds or 0.0)
            if running and started is not None
            else None
        ),
    )


def observe_rollout(
    key: tuple[str, str], spec: CheckpointRolloutSpec, status: CheckpointRolloutStatus
) -> None:
    namespace, name = key
    for candidate in Phase:
        PHASE.labels(namespace, name, candidate.value).set(1 if candidate == status.phase else 0)
    g = rollout_gauges(spec, status)
    for gauge, value in zip(
        _COUNTS, (g.replicas, g.updated, g.failed, g.current_wave, g.total_waves), strict=True
    ):
        gauge.labels(namespace, name).set(value)
    _set_info(TARGET_INFO, key, g.target_version)
    _set_info(STABLE_INFO, key, g.stable_version)
    if g.progress_deadline is None:
        with contextlib.suppress(KeyError):
            DEADLINE.remove(namespace, name)
    else:
        DEADLINE.labels(namespace, name).set(g.progress_deadline)


def _set_info(gauge: Gauge, key: tuple[str, str], version: str | None) -> None:
    _remove_matching(gauge, key)
    if version is not None:
        gauge.labels(*key, version).set(1)


def _remove_matching(gauge: Gauge, key: tuple[str, str]) -> None:
    """Drop every series of ``gauge`` for the CR ``key``, whatever its extra labels."""
    samples = [s for family in gauge.collect() for s in family.samples]
    for sample in samples:
        labels = sample.labels
        if (labels["namespace"], labels["name"]) == key:
            with contextlib.suppress(KeyError):
                gauge.remove(*labels.values())


def forget(key: tuple[str, str]) -> None:
    for gauge in (PHASE, TARGET_INFO, STABLE_INFO):
        _remove_matching(gauge, key)
    for gauge in _PER_CR:
        with contextlib.suppress(KeyError):
            gauge.remove(*key)
