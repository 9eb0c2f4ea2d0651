"""Prometheus metrics of one agent (own registry, so several agents can live in one process)."""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from ckpt_api.vocabulary import UpdateResult

_BYTE_BUCKETS = tuple(float(1 << s) for s in range(20, 42, 2))  # 1 MiB .. 2 TiB
_SECOND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


class AgentMetrics:
    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.update_requests = Counter(
            "ckpt_agent_update_requests", "update_weights calls by outcome", ["result"], registry=r
        )
        for result in UpdateResult:
            self.update_requests.labels(result)
        self.loads = Counter(
            "ckpt_agent_loads", "finished loads by result and reason", ["result", "reason"], registry=r
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
        self.version_info = Gauge(
            "ckpt_agent_version_info", "1 for the live weights version", ["version"], registry=r
        )
        self.load_in_progress = Gauge("ckpt_agent_load_in_progress", "1 while a load runs", registry=r)
        self.paused = Gauge("ckpt_agent_engine_paused", "1 while the engine is paused", registry=r)
        self.auth_failures = Counter(
            "ckpt_agent_auth_failures", "rejected calls by reason", ["reason"], registry=r
        )
        self.report_failures = Counter(
            "ckpt_agent_report_failures", "status patches given up after retries", ["target"], registry=r
        )

    def set_live_version(self, version: str | None) -> None:
        self.version_info.clear()
        if version is not None:
            self.version_info.labels(version).set(1)

    def render(self) -> bytes:
        return generate_latest(self.registry)
