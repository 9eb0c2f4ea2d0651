"""Operator Prometheus metrics (served on --metrics-port)."""

import contextlib

from prometheus_client import Counter, Gauge, Histogram

from ckpt_api.vocabulary import Phase

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
    "ckpt_rollout_api_requests",
    "CheckpointRollout reads and status writes by the reconcile loops (kopf's own calls excluded)",
    ["verb"],
)
PHASE = Gauge(
    "ckpt_rollout_phase", "1 for the current phase of each CheckpointRollout", ["namespace", "name", "phase"]
)


def observe_phase(key: tuple[str, str], phase: str | None) -> None:
    for candidate in Phase:
        PHASE.labels(key[0], key[1], candidate.value).set(1 if candidate.value == phase else 0)


def forget(key: tuple[str, str]) -> None:
    for candidate in Phase:
        with contextlib.suppress(KeyError):
            PHASE.remove(key[0], key[1], candidate.value)
