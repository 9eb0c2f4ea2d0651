"""decide(), failing analyses: a measurement fails on a missed condition, no data, NaN, a
query error or no Prometheus address; past failureLimit the wave fails and the failure policy
runs (rollback by default, or halt), the failing query named in the condition and the status.
One row per situation, with the plan it must produce."""

from __future__ import annotations

from analysis_kit import (
    ANALYSIS,
    FAILURE_09,
    LATENCY,
    ago,
    analysis_message,
    analyzing,
    answered,
    completed,
    failed_with,
    fails_at_once,
    results,
    spec,
    state,
    told,
    value,
)
from machine_kit import (
    CANARY,
    STAMP,
    TUNING,
    Case,
    condition,
    rollout,
    table_tests,
)

from ckpt_api.vocabulary import (
    AnalysisPhase,
    ConditionType,
    EventReason,
    EventType,
    Phase,
    RolloutReason,
    WavePhase,
)
from ckpt_rollout.domain.machine import State
from ckpt_rollout.domain.world import QueryAnswer

LONG_ERROR = QueryAnswer(error="bad_data: " + "x" * 2000)


CASES = [
    Case(
        "a-long-prometheus-error-is-cut-to-fit-the-status",
        rollout(analyzing(), spec=spec()),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ANALYSIS_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=answered(0, LONG_ERROR),
        observe=lambda p: (len(results(p)[0][3]), len(analysis_message(p) or "")),
        observed=(1024, 1024),
    ),
    Case(
        "a-long-error-within-the-failure-limit-is-cut-to-fit-the-status",
        rollout(analyzing(), spec=spec(failureLimit=1)),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=10,
        memory=answered(0, LONG_ERROR),
        observe=lambda p: (len(analysis_message(p) or ""), (analysis_message(p) or "")[:30]),
        observed=(1024, "query errors failed: bad_data:"),
    ),
    fails_at_once(
        "a-value-missing-its-condition-fails", value(0.9), "returned 0.9, which misses result < 0.5"
    ),
    fails_at_once("no-data-fails", value(), "returned no data for result < 0.5"),
    fails_at_once("a-nan-fails", value(float("nan")), "returned NaN for result < 0.5"),
    fails_at_once(
        "one-sample-of-several-missing-fails",
        value(0.1, 0.7, 0.2),
        "returned 0.7, which misses result < 0.5",
    ),
    fails_at_once(
        "a-query-prometheus-refused-fails",
        QueryAnswer(error="bad_data: parse error at char 4"),
        "failed: bad_data: parse error at char 4",
    ),
    Case(
        "a-failed-analysis-names-the-query-in-the-condition-and-rolls-back",
        rollout(analyzing(), spec=spec()),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ANALYSIS_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=answered(0, value(0.9)),
        observe=lambda p: (
            failed_with(p)[:3],
            p.status.rollback and (p.status.rollback.reason, p.status.rollback.pods),
            results(p),
            (completed(p), analysis_message(p)),
            told(p)[0],
        ),
        observed=(
            (WavePhase.FAILED, AnalysisPhase.FAILED, ("True", RolloutReason.ANALYSIS_FAILED)),
            (RolloutReason.ANALYSIS_FAILED, [CANARY]),
            [("errors", 0.9, False, "returned 0.9, which misses result < 0.5")],
            (STAMP, FAILURE_09),
            (EventType.WARNING, EventReason.ANALYSIS_FAILED, FAILURE_09),
        ),
    ),
    Case(
        "a-failed-analysis-with-halt-fails-the-rollout",
        rollout(analyzing(), spec={**spec(), "failurePolicy": {"onFailure": "Halt"}}),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.ANALYSIS_FAILED, EventReason.ROLLOUT_FAILED],
        memory=answered(0, value(0.9)),
        observe=lambda p: (failed_with(p)[:3], p.status.completed_at, p.status.waves[0].completed_at),
        observed=(
            (WavePhase.FAILED, AnalysisPhase.FAILED, ("True", RolloutReason.ANALYSIS_FAILED)),
            STAMP,
            STAMP,
        ),
    ),
    Case(
        "a-failure-within-the-failure-limit-goes-on-measuring",
        rollout(analyzing(), spec=spec(failureLimit=1)),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=10,
        memory=answered(0, value(0.9)),
        observe=lambda p: (state(p), p.status.message, condition(p, ConditionType.PROGRESSING)),
        observed=(
            (AnalysisPhase.RUNNING, 1, 1, STAMP),
            "wave 1/2: analyzing (1/3 measurements, 1 failed)",
            ("True", RolloutReason.ANALYZING),
        ),
    ),
    Case(
        "one-failure-past-the-failure-limit-fails",
        rollout(
            analyzing(started=ago(10), measurements=1, failed=1, measured=ago(10)), spec=spec(failureLimit=1)
        ),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ANALYSIS_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=answered(1, value(0.6)),
        observe=lambda p: state(p),
        observed=(AnalysisPhase.FAILED, 2, 2, STAMP),
    ),
    Case(
        "the-failing-query-of-two-is-named",
        rollout(analyzing(), spec=spec(queries=[ANALYSIS["queries"][0], LATENCY])),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ANALYSIS_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=answered(0, value(0.1), value(3.5)),
        observe=lambda p: (results(p), p.status.message.split(";")[0] if p.status.message else None),
        observed=(
            [
                ("errors", 0.1, True, "returned 0.1, which meets result < 0.5"),
                ("latency", 3.5, False, "returned 3.5, which misses result <= 2"),
            ],
            "wave 1/2: analysis failed: query latency returned 3.5, which misses result <= 2",
        ),
    ),
    Case(
        "no-prometheus-address-anywhere-fails-at-once",
        rollout(analyzing(), spec={"strategy": {"analysis": {**ANALYSIS, "prometheusAddress": None}}}),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ANALYSIS_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (state(p)[:3], p.status.message),
        observed=(
            (AnalysisPhase.FAILED, 0, 0),
            "wave 1/2: analysis failed: no Prometheus address: set spec.strategy.analysis.prometheusAddress "
            "or the operator's --prometheus-url; rolling 1 worker back to v1, "
            "unpinned: no manifest digest of v1 is recorded",
        ),
    ),
    Case(
        # A CR author's address the operator does not allow is never dialled: no measurement.
        "a-prometheus-address-off-the-operators-list-fails-at-once-unmeasured",
        rollout(
            analyzing(),
            spec={"strategy": {"analysis": {**ANALYSIS, "prometheusAddress": "http://169.254.169.254:80"}}},
        ),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ANALYSIS_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (state(p)[:3], p.measurement, p.status.message),
        observed=(
            (AnalysisPhase.FAILED, 0, 0),
            None,
            "wave 1/2: analysis failed: prometheusAddress http://169.254.169.254:80 is not one the "
            "operator may query (http://prometheus.monitoring:9090; --allowed-prometheus adds others); "
            "rolling 1 worker back to v1, unpinned: no manifest digest of v1 is recorded",
        ),
    ),
]

test_decide, test_every_step_comes_to_rest = table_tests(CASES)
