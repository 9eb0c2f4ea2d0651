"""decide(), analysis between waves (spec.strategy.analysis): a settled spec wave is Analyzing,
measured every interval, and passes (the next wave starts, or the rollout succeeds), fails (the
failure policy runs), is skipped by the skip-analysis annotation naming it, never by promote;
the status alone lets a restarted operator resume the count.
One row per situation, with the plan it must produce."""

from __future__ import annotations

from typing import Any

from machine_kit import (
    CANARY,
    DEADLINE_WAKE,
    EARLIER,
    NOW,
    REST,
    STAMP,
    TUNING,
    Case,
    condition,
    done,
    entry,
    progressing,
    rollout,
    table_tests,
    wave,
    wave_rows,
)

from ckpt_api.vocabulary import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    SKIP_ANALYSIS_ANNOTATION,
    AnalysisPhase,
    ConditionType,
    EventReason,
    EventType,
    Phase,
    RolloutReason,
    WaveKind,
    WavePhase,
)
from ckpt_rollout.machine import State
from ckpt_rollout.plan import Plan, Rollout
from ckpt_rollout.world import Memory, QueryAnswer, Tuning, rfc3339

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
            "rolling 1 worker back to v1",
        ),
    )


FAILURE_09 = (
    "wave 1/2: analysis failed: query errors returned 0.9, which misses result < 0.5; "
    "1 failed measurement > failureLimit 0"
)
LONG_ERROR = QueryAnswer(error="bad_data: " + "x" * 2000)

FAILURES = [
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
            "or the operator's --prometheus-url; rolling 1 worker back to v1",
        ),
    ),
]

CASES = [
    Case(
        "a-settled-wave-is-analyzed-and-its-first-measurement-taken",
        canary_settled(),
        State.ADVANCE,
        Phase.PROGRESSING,
        events=[EventReason.ANALYSIS_STARTED],
        wake=WAKE,
        observe=lambda p: (
            wave_rows(p),
            state(p),
            measurement(p),
            p.status.message,
            condition(p, ConditionType.PROGRESSING),
            p.status.current_wave,
            p.status.updated_replicas,
            p.status.waves[0].analysis and p.status.waves[0].analysis.started_at,
            told(p),
        ),
        observed=(
            [(WaveKind.SPEC, WavePhase.ANALYZING, [CANARY], [CANARY])],
            (AnalysisPhase.RUNNING, 0, 0, None),
            ("v2/0/0", PROM, (("errors", RENDERED),), TUNING.prometheus_timeout_s),
            "wave 1/2: analyzing (0/3 measurements, 0 failed)",
            ("True", RolloutReason.ANALYZING),
            0,
            1,
            STAMP,
            [
                (
                    EventType.NORMAL,
                    EventReason.ANALYSIS_STARTED,
                    "wave 1/2: measuring errors every 10s for 30s",
                )
            ],
        ),
    ),
    Case(
        "a-wave-with-a-failure-within-budget-and-a-pod-gone-is-analyzed-with-its-counts",
        rollout(
            progressing(
                done(0, [CANARY]),
                wave(1, REST),
                workers={REST[0]: entry("v2", "Updated"), REST[1]: entry("v2", "Failed", "ChecksumMismatch")},
            ),
            spec={**spec(queries=[ANALYSIS["queries"][0], LATENCY]), "failurePolicy": {"maxFailures": 1}},
            pods=[CANARY, REST[0], REST[1]],  # REST[2] is gone
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        events=[EventReason.WORKER_FAILED, EventReason.ANALYSIS_STARTED],
        wake=WAKE,
        observe=lambda p: (
            (p.status.waves[1].phase, p.status.waves[1].updated, p.status.waves[1].failed),
            p.status.waves[1].gone,
            told(p)[1][2],
        ),
        observed=((WavePhase.ANALYZING, 1, 1), 1, "wave 2/2: measuring errors, latency every 10s for 30s"),
    ),
    Case(
        "the-wave-placeholder-is-the-waves-status-index",
        rollout(
            analyzing(index=1, pods=REST, before=(done(0, [CANARY]),)),
            spec=spec(queries=[LATENCY]),
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=WAKE,
        observe=lambda p: measurement(p),
        observed=("v2/1/0", PROM, (("latency", 'p99{wave="1"}'),), TUNING.prometheus_timeout_s),
    ),
    Case(
        "the-operators-prometheus-serves-a-cr-that-names-none",
        rollout(analyzing(), spec={"strategy": {"analysis": {**ANALYSIS, "prometheusAddress": None}}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=WAKE,
        tuning=Tuning(prometheus_url="https://prom.example:9091/sub", prometheus_timeout_s=3),
        observe=lambda p: measurement(p),
        observed=("v2/0/0", "https://prom.example:9091/sub", (("errors", RENDERED),), 3),
    ),
    Case(
        "a-passing-measurement-is-counted-and-the-next-waits-an-interval",
        rollout(analyzing(), spec=spec()),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=10,
        memory=answered(0, value(0.1)),
        observe=lambda p: (state(p), results(p), measurement(p), p.status.message, analysis_message(p)),
        observed=(
            (AnalysisPhase.RUNNING, 1, 0, STAMP),
            [("errors", 0.1, True, "returned 0.1, which meets result < 0.5")],
            None,
            "wave 1/2: analyzing (1/3 measurements, 0 failed)",
            "every query passed",
        ),
    ),
    Case(
        "the-next-measurement-is-taken-once-the-interval-passed",
        rollout(analyzing(started=ago(10), measurements=1, measured=ago(10)), spec=spec()),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=WAKE,
        observe=lambda p: measurement(p),
        observed=("v2/0/1", PROM, (("errors", RENDERED),), TUNING.prometheus_timeout_s),
    ),
    Case(
        "an-answer-to-an-earlier-measurement-is-not-counted-again",
        rollout(analyzing(started=ago(10), measurements=1, measured=ago(10)), spec=spec()),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=WAKE,
        memory=answered(0, value(0.9)),
        observe=lambda p: (state(p), key(p)),
        observed=((AnalysisPhase.RUNNING, 1, 0, ago(10)), "v2/0/1"),
    ),
    Case(
        "a-restarted-operator-resumes-the-count-from-status-and-waits-the-rest-of-the-interval",
        rollout(analyzing(started=ago(14), measurements=2, measured=ago(4)), spec=spec()),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=6,
        observe=lambda p: (state(p), measurement(p)),
        observed=((AnalysisPhase.RUNNING, 2, 0, ago(4)), None),
    ),
    Case(
        "a-restarted-operator-takes-a-measurement-due-under-the-next-number",
        rollout(analyzing(started=ago(25), measurements=2, measured=ago(15)), spec=spec()),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=WAKE,
        observe=lambda p: key(p),
        observed="v2/0/2",
    ),
    Case(
        "enough-measurements-wait-for-the-duration-to-end",
        rollout(analyzing(started=ago(20), measurements=3, measured=ago(1)), spec=spec()),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=10,
        observe=lambda p: measurement(p),
        observed=None,
    ),
    Case(
        "a-duration-not-a-multiple-of-the-interval-ends-on-the-duration",
        rollout(analyzing(started=ago(20), measurements=2, measured=ago(10)), spec=spec(durationSeconds=25)),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=5,
    ),
    Case(
        "the-duration-over-and-every-measurement-taken-the-next-wave-starts",
        rollout(analyzing(started=ago(30), measurements=3, measured=ago(10)), spec=spec()),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.ANALYSIS_PASSED, EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (
            wave_rows(p),
            state(p)[:3],
            completed(p),
            p.status.workers,
            told(p)[0],
        ),
        observed=(
            [
                (WaveKind.SPEC, WavePhase.COMPLETED, [CANARY], [CANARY]),
                (WaveKind.SPEC, WavePhase.RUNNING, REST, REST),
            ],
            (AnalysisPhase.PASSED, 3, 0),
            STAMP,
            {},  # the canary's success folded into its wave, as any completed wave's
            (
                EventType.NORMAL,
                EventReason.ANALYSIS_PASSED,
                "wave 1/2: analysis passed: 3 measurements, 0 failed",
            ),
        ),
    ),
    Case(
        "the-duration-over-with-measurements-missing-takes-another",
        rollout(analyzing(started=ago(40), measurements=2, measured=ago(10)), spec=spec()),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=WAKE,
        observe=lambda p: key(p),
        observed="v2/0/2",
    ),
    Case(
        "a-zero-duration-passes-on-its-one-measurement",
        rollout(analyzing(), spec=spec(durationSeconds=0)),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.ANALYSIS_PASSED, EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=answered(0, value(0.0)),
        observe=lambda p: state(p)[:3],
        observed=(AnalysisPhase.PASSED, 1, 0),
    ),
    Case(
        "the-last-waves-analysis-passing-ends-the-rollout-succeeded",
        rollout(
            analyzing(
                started=ago(30),
                measurements=3,
                measured=ago(10),
                index=1,
                pods=REST,
                before=(done(0, [CANARY]),),
            ),
            spec=spec(),
        ),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.ANALYSIS_PASSED, EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
        observe=lambda p: (state(p, 1)[0], p.status.stable_version, p.status.updated_replicas),
        observed=(AnalysisPhase.PASSED, "v2", 4),
    ),
    Case(
        "an-analysis-that-passed-is-not-run-again-on-the-waves-completion",
        rollout(
            progressing(
                wave(
                    0,
                    [CANARY],
                    analysis={
                        "phase": "Passed",
                        "startedAt": EARLIER,
                        "measurements": 3,
                        "completedAt": STAMP,
                    },
                ),
                workers={CANARY: entry("v2", "Updated")},
            ),
            spec=spec(),
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
    ),
    Case(
        "a-drift-wave-is-not-analyzed",
        rollout(
            progressing(
                done(0, [CANARY]),
                done(1, REST[:2]),
                {**wave(2, REST[2:]), "kind": "Drift", "specIndex": None},
                workers={REST[2]: entry("v2", "Updated")},
            ),
            spec=spec(),
        ),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
    ),
    Case(
        "a-wave-over-the-failure-budget-fails-without-an-analysis",
        rollout(
            progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Failed", "ChecksumMismatch")}),
            spec=spec(),
        ),
        State.ADVANCE,
        Phase.ROLLED_BACK,  # the canary kept its old weights: nobody to call back
        events=[EventReason.WORKER_FAILED, EventReason.ROLLBACK_STARTED, EventReason.ROLLED_BACK],
        observe=lambda p: p.status.waves[0].analysis,
        observed=None,
    ),
    Case(
        "the-skip-analysis-annotation-naming-the-wave-and-version-skips-it",
        rollout(analyzing(), spec=spec(), annotations={SKIP_ANALYSIS_ANNOTATION: "0@v2"}),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.ANALYSIS_SKIPPED, EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (state(p)[:3], wave_rows(p)[0][1], analysis_message(p), told(p)[0]),
        observed=(
            (AnalysisPhase.SKIPPED, 0, 0),
            WavePhase.COMPLETED,
            "skipped (rollout.ckpt.dev/skip-analysis)",
            (
                EventType.NORMAL,
                EventReason.ANALYSIS_SKIPPED,
                "wave 1/2: analysis skipped (rollout.ckpt.dev/skip-analysis)",
            ),
        ),
    ),
    *(
        Case(
            f"a-skip-analysis-of-{value_!r}-skips-nothing",
            rollout(analyzing(), spec=spec(), annotations={SKIP_ANALYSIS_ANNOTATION: value_}),
            State.ADVANCE,
            Phase.PROGRESSING,
            wake=WAKE,
            observe=lambda p: (state(p)[0], key(p)),
            observed=(AnalysisPhase.RUNNING, "v2/0/0"),
        )
        # Left from v1's rollout; another wave; no version (a bare index is promote's form only).
        for value_ in ("0@v1", "1@v2", "0", "")
    ),
    Case(
        "promote-does-not-skip-an-analysis",
        rollout(
            analyzing(),
            spec={**spec(), "strategy": {**spec()["strategy"], "pauseAfterWave": [0]}},
            annotations={PROMOTE_ANNOTATION: "0@v2"},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=WAKE,
        observe=lambda p: (wave_rows(p)[0][1], state(p)[0]),
        observed=(WavePhase.ANALYZING, AnalysisPhase.RUNNING),
    ),
    Case(
        "a-passed-analysis-then-holds-at-its-pause-after-wave",
        rollout(
            analyzing(started=ago(30), measurements=3, measured=ago(10)),
            spec={**spec(), "strategy": {**spec()["strategy"], "pauseAfterWave": [0]}},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.ANALYSIS_PASSED, EventReason.WAVE_COMPLETED, EventReason.PAUSED],
    ),
    Case(
        "spec-paused-goes-on-measuring-and-keeps-the-pause-message",
        rollout(analyzing(), spec={**spec(), "paused": True}),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.PAUSED],
        observe=lambda p: (key(p), p.status.message),
        observed=("v2/0/0", "paused during wave 1/2: spec.paused is true"),
    ),
    Case(
        "spec-paused-does-not-hold-a-failing-analysis",
        rollout(
            analyzing(phase="Paused", pausedAt=ago(5), message="paused during wave 1/2: spec.paused is true"),
            spec={**spec(), "paused": True},
        ),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ANALYSIS_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=answered(0, value(0.9)),
        observe=lambda p: (p.status.paused_at, p.status.paused_seconds),
        observed=(None, 5),
    ),
    Case(
        "analysis-removed-from-the-spec-mid-analysis-lets-the-wave-complete",
        rollout(analyzing()),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.ANALYSIS_SKIPPED, EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (state(p)[0], analysis_message(p)),
        observed=(AnalysisPhase.SKIPPED, "spec.strategy.analysis was removed"),
    ),
    Case(
        "an-abort-during-the-analysis-rolls-back",
        rollout(analyzing(), spec=spec(), annotations={ABORT_ANNOTATION: "v2"}),
        State.ABORT,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
    ),
    Case(
        "the-progress-deadline-runs-through-an-analysis",
        rollout(
            analyzing(started=ago(10), measurements=1, measured=ago(1), startedAt=ago(1801)), spec=spec()
        ),
        State.DEADLINE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
    ),
    Case(
        "a-skipped-wave-whose-member-lost-its-entry-runs-again-to-learn-its-outcome",
        rollout(
            progressing(
                wave(0, [CANARY], phase="Analyzing", analysis={"phase": "Running", "startedAt": STAMP})
            ),
            spec=spec(),
            annotations={SKIP_ANALYSIS_ANNOTATION: "0@v2"},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[CANARY],
        events=[EventReason.ANALYSIS_SKIPPED],
        wake=TUNING.pull_every_s,
        observe=lambda p: (wave_rows(p)[0][1], state(p)[0]),
        observed=(WavePhase.RUNNING, AnalysisPhase.SKIPPED),  # and is not analyzed again
    ),
    Case(
        "answers-to-a-query-list-since-edited-are-dropped-and-the-measurement-taken-again",
        rollout(analyzing(), spec=spec(queries=[ANALYSIS["queries"][0], LATENCY])),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=WAKE,
        memory=answered(0, value(0.9)),
        observe=lambda p: (state(p)[:3], key(p)),
        observed=((AnalysisPhase.RUNNING, 0, 0), "v2/0/0"),
    ),
    Case(
        "an-analyzing-wave-whose-analysis-status-was-lost-starts-it-over",
        rollout(
            progressing(
                wave(0, [CANARY], phase="Analyzing", updated=1), workers={CANARY: entry("v2", "Updated")}
            ),
            spec=spec(),
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=WAKE,
        observe=lambda p: (
            state(p),
            p.status.waves[0].analysis and p.status.waves[0].analysis.started_at,
            key(p),
        ),
        observed=((AnalysisPhase.RUNNING, 0, 0, None), STAMP, "v2/0/0"),
    ),
    *FAILURES,
]

test_decide, test_every_step_comes_to_rest = table_tests(CASES)
