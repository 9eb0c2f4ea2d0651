"""Rows and readers shared by the analysis tables of decide() (test_machine_analysis*.py):
an Analyzing canary wave, Prometheus answers, and what a plan says about the analysis."""

from __future__ import annotations

from typing import Any

from machine_kit import (
    CANARY,
    DEADLINE_WAKE,
    NOW,
    STAMP,
    TUNING,
    Case,
    condition,
    entry,
    progressing,
    rollout,
    wave,
)

from ckpt_api.vocabulary import (
    AnalysisPhase,
    ConditionType,
    EventReason,
    Phase,
)
from ckpt_rollout.domain.machine import State
from ckpt_rollout.domain.plan import Plan, Rollout
from ckpt_rollout.domain.world import Memory, QueryAnswer, rfc3339

PROM = "http://prometheus.monitoring:9090"
QUERY = 'sum(rate(errors_total{namespace="{{namespace}}", rollout="{{rollout}}", version="{{version}}"}[1m]))'
RENDERED = 'sum(rate(errors_total{namespace="rl", rollout="fleet", version="v2"}[1m]))'
# Every 10 s for 30 s: three measurements, at 0, 10 and 20 s; it passes at 30 s.
ANALYSIS = {
    "prometheusAddress": PROM,
    "intervalSeconds": 10,
    "durationSeconds": 30,
    "queries": [{"name": "errors", "query": QUERY, "successCondition": "result < 0.5"}],
}
# A second query, its wave placeholder filled in with the wave's status index.
LATENCY = {"name": "latency", "query": 'p99{wave="{{wave}}"}', "successCondition": "result <= 2"}
WAKE = DEADLINE_WAKE - 60  # rollouts here started a minute ago


def ago(seconds: float) -> str:
    return rfc3339(NOW.wall - seconds)


def spec(**analysis: Any) -> dict[str, Any]:
    return {"strategy": {"analysis": {**ANALYSIS, **analysis}}}


def analyzing(
    *,
    started: str = STAMP,
    measurements: int = 0,
    failed: int = 0,
    measured: str | None = None,
    index: int = 0,
    pods: list[str] | None = None,
    before: tuple[dict[str, Any], ...] = (),
    **more: Any,
) -> dict[str, Any]:
    """A status whose wave ``index`` (its members updated) is being analyzed."""
    members = [CANARY] if pods is None else pods
    state: dict[str, Any] = {"phase": "Running", "startedAt": started, "measurements": measurements}
    state |= {"failedMeasurements": failed} | ({"measuredAt": measured} if measured else {})
    return progressing(
        *before,
        wave(index, members, phase="Analyzing", updated=len(members), analysis=state),
        workers={p: entry("v2", "Updated") for p in members},
        **more,
    )


def answered(measurement: int, *answers: QueryAnswer, index: int = 0) -> Memory:
    """The executor took measurement number ``measurement`` of wave ``index``: these answers."""
    return Memory(measured=(f"v2/{index}/{measurement}", answers))


def value(*values: float) -> QueryAnswer:
    return QueryAnswer(values=values)


def state(plan: Plan, index: int = 0) -> tuple[object, ...]:
    a = plan.status.waves[index].analysis
    assert a is not None
    return a.phase, a.measurements, a.failed_measurements, a.measured_at


def results(plan: Plan) -> list[tuple[str, float | None, bool, str]]:
    a = plan.status.waves[0].analysis
    assert a is not None
    return [(r.name, r.value, r.passed, r.message) for r in a.results]


def measurement(plan: Plan) -> tuple[str, str, tuple[tuple[str, str], ...], float] | None:
    m = plan.measurement
    return None if m is None else (m.key, m.address, m.queries, m.timeout_s)


def key(plan: Plan) -> str | None:
    """Which measurement the plan has the executor take (None: none)."""
    return None if plan.measurement is None else plan.measurement.key


def completed(plan: Plan) -> str | None:
    a = plan.status.waves[0].analysis
    assert a is not None
    return a.completed_at


def told(plan: Plan) -> list[tuple[str, str, str]]:
    """The plan's events: type, reason, message."""
    return [(e.type, e.reason, e.message) for e in plan.events]


def analysis_message(plan: Plan, index: int = 0) -> str | None:
    a = plan.status.waves[index].analysis
    assert a is not None
    return a.message


def failed_with(plan: Plan) -> tuple[object, ...]:
    a = plan.status.waves[0].analysis
    assert a is not None
    return plan.status.waves[0].phase, a.phase, condition(plan, ConditionType.FAILED), plan.status.message


def canary_settled(**spec_: Any) -> Rollout:
    return rollout(
        progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Updated")}), spec=spec(**spec_)
    )


def fails_at_once(id_: str, answer: QueryAnswer, message: str) -> Case:
    """A measurement whose one query fails, with no failure tolerated: the canary rolls back."""
    return Case(
        id_,
        rollout(analyzing(), spec=spec()),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ANALYSIS_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=answered(0, answer),
        observe=lambda p: (state(p), p.status.message),
        observed=(
            (AnalysisPhase.FAILED, 1, 1, STAMP),
            f"wave 1/2: analysis failed: query errors {message}; 1 failed measurement > failureLimit 0; "
            "rolling 1 worker back to v1, unpinned: no manifest digest of v1 is recorded",
        ),
    )


FAILURE_09 = (
    "wave 1/2: analysis failed: query errors returned 0.9, which misses result < 0.5; "
    "1 failed measurement > failureLimit 0"
)
