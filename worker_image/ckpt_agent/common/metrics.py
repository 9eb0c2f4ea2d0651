"""Prometheus metrics of one agent (own registry, so several agents can live in one process)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)

from ckpt_api.vocabulary import HealthCheckOutcome, LoadResult, UpdateResult

# A `_created` series per counter and histogram doubles what Prometheus stores for a timestamp
# nobody queries (restarts show in process_start_time_seconds).
disable_created_metrics()  # type: ignore[no-untyped-call]

# Where a load's bytes came from: the checkpoint source, or an updated peer (relay).
SOURCE = "source"
PEER = "peer"

_BYTE_BUCKETS = tuple(float(1 << s) for s in range(20, 42, 2))  # 1 MiB .. 2 TiB
_SECOND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class AgentMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.update_requests = Counter(
            "ckpt_agent_update_requests_total", "update_weights calls by outcome", ["result"], registry=r
        )
        for result in UpdateResult:
            self.update_requests.labels(result)
        self.loads = Counter(
            "ckpt_agent_loads_total", "finished loads by result and reason", ["result", "reason"], registry=r
        )
        self.load_bytes = Histogram(
            "ckpt_agent_load_bytes", "bytes pulled per successful load", buckets=_BYTE_BUCKETS, registry=r
        )
        self.load_seconds = Histogram(
            "ckpt_agent_load_seconds",
            "duration of finished loads",
            ["result"],
            buckets=_SECOND_BUCKETS,
            registry=r,
        )
        # From zero, so an alert sees the first failure as an increase.
        for load_result in LoadResult:
            self.load_seconds.labels(load_result)
        self.version_info = Gauge(
            "ckpt_agent_version_info", "1 for the live weights version", ["version"], registry=r
        )
        self.health_checks = Counter(
            "ckpt_agent_health_checks_total",
            "smoke checks after a load (strategy.healthCheck), by result",
            ["result"],
            registry=r,
        )
        for outcome in HealthCheckOutcome:
            self.health_checks.labels(outcome)
        self.load_in_progress = Gauge("ckpt_agent_load_in_progress", "1 while a load runs", registry=r)
        self.paused = Gauge("ckpt_agent_engine_paused", "1 while the engine is paused", registry=r)
        self.auth_failures = Counter(
            "ckpt_agent_auth_failures_total", "rejected calls by reason", ["reason"], registry=r
        )
        self.report_failures = Counter(
            "ckpt_agent_report_failures_total",
            "status patches given up after retries",
            ["target"],
            registry=r,
        )

        self.pulled_bytes = Counter(
            "ckpt_agent_pulled_bytes_total",
            "bytes pulled by loads (failed and retried ones too), by CheckpointRollout (empty: a "
            "load no rollout asked for, e.g. the initial version) and origin (source | peer)",
            ["rollout", "origin"],
            registry=r,
        )
        # CPU, memory, open files and start time of the agent's process: what a Deployment's
        # user looks at first when a pod misbehaves.
        ProcessCollector(registry=r)

    def pulled(self, rollout: str | None, origin: str) -> Counter:
        """The byte counter of one rollout (None: a load no rollout asked for) and origin."""
        return self.pulled_bytes.labels(rollout or "", origin)

    def set_live_version(self, version: str | None) -> None:
        self.version_info.clear()
        if version is not None:
            self.version_info.labels(version).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
