"""The Analyzing state of a spec wave (spec.strategy.analysis), between "its workers settled"
and "it completed". Pure; the machine calls ``begin`` when a wave's workers settle and ``step``
while the wave is Analyzing, and acts on the ``Ending`` it gets back (fail the rollout, or
complete the wave the way every wave completes).

Measurements are due every intervalSeconds from the last one (status holds the counts and
times, so a restarted operator resumes the count); the executor takes one and the next step
folds it in. spec.paused does not hold the analysis: it measures pods that serve whether or not
the rollout is paused, and a pause must not hide a failing one; the progress deadline (paused
time excluded) keeps running. promote never ends an analysis; only the skip-analysis
annotation naming the wave and version does.
"""

from dataclasses import dataclass

from ckpt_api.status import AnalysisStatus, WaveStatus
from ckpt_api.vocabulary import (
    SKIP_ANALYSIS_ANNOTATION,
    AnalysisPhase,
    EventReason,
    EventType,
    Phase,
    RolloutReason,
    WavePhase,
)
from ckpt_rollout.domain.analysis import allowed_prometheus, judge, prometheus_refusal, render
from ckpt_rollout.domain.conditions import Verdict
from ckpt_rollout.domain.plan import Draft, Measurement, wave_name
from ckpt_rollout.domain.wording import counted
from ckpt_rollout.domain.world import parse_time


@dataclass(frozen=True)
class Ending:
    """How an analysis ended. ``failure``: the wave is marked Failed and the rollout must fail
    with this message; None (passed or skipped): the wave is Running again, to complete at once."""

    failure: str | None


def required_measurements(d: Draft) -> int:
    analysis = d.spec.strategy.analysis
    assert analysis is not None  # only asked while there is one
    return max(1, analysis.duration_seconds // analysis.interval_seconds)


def _line(d: Draft, wave: WaveStatus) -> str:
    state = wave.analysis
    assert state is not None  # set with the phase
    return (
        f"{wave_name(d, wave)}: analyzing ({state.measurements}/{required_measurements(d)} "
        f"measurements, {state.failed_measurements} failed)"
    )


def begin(d: Draft, index: int, *, updated: int, failed: int, gone: int) -> None:
    """The wave's workers settled: measure it before it completes. Its workers stay listed
    until then (the success fold is the completion's). The first measurement is due now."""
    d.set_wave(
        index,
        phase=WavePhase.ANALYZING,
        updated=updated,
        failed=failed,
        gone=gone,
        analysis=AnalysisStatus(started_at=d.now.stamp),  # pragma: no mutate (the next step would)
    )
    analysis = d.spec.strategy.analysis
    assert analysis is not None  # only called with one
    wave = d.status.waves[index]
    d.event(
        EventType.NORMAL,
        EventReason.ANALYSIS_STARTED,
        f"{wave_name(d, wave)}: measuring {', '.join(q.name for q in analysis.queries)} "
        f"every {analysis.interval_seconds}s for {analysis.duration_seconds}s",
    )


def step(d: Draft, index: int) -> Ending | None:
    """One step of an Analyzing wave: fold in the measurement taken, end the analysis, or ask
    for the next measurement (None: nothing more to do in this step)."""
    wave = d.status.waves[index]
    analysis = d.spec.strategy.analysis
    state = wave.analysis
    if state is None:  # lost from a status edited by hand: the analysis starts over
        state = AnalysisStatus(started_at=d.now.stamp)
        d.set_wave(index, analysis=state)
    label = wave_name(d, wave)
    if analysis is None:
        return _ended(d, index, state, AnalysisPhase.SKIPPED, "spec.strategy.analysis was removed")
    skip = d.rollout.meta.annotations.get(SKIP_ANALYSIS_ANNOTATION)
    if wave.spec_index is not None and skip == f"{wave.spec_index}@{d.spec.version}":
        return _ended(d, index, state, AnalysisPhase.SKIPPED, f"skipped ({SKIP_ANALYSIS_ANNOTATION})")
    address = analysis.prometheus_address or d.tuning.prometheus_url
    if not address:
        why = (
            "no Prometheus address: set spec.strategy.analysis.prometheusAddress "
            "or the operator's --prometheus-url"
        )
        return _failed(d, index, state, f"{label}: analysis failed: {why}")
    if analysis.prometheus_address:
        allowed = allowed_prometheus(d.tuning.prometheus_url, d.tuning.prometheus_allowed)
        refused = prometheus_refusal(analysis.prometheus_address, allowed)
        if refused is not None:
            return _failed(d, index, state, f"{label}: analysis failed: {refused}")
    key = f"{d.spec.version}/{index}/{state.measurements}"
    measured = d.memory.measured
    # Answers to a query list edited since they were asked are dropped: measured again.
    if measured is not None and measured[0] == key and len(measured[1]) == len(analysis.queries):
        pairs = zip(analysis.queries, measured[1], strict=True)  # pragma: no mutate (equal lengths)
        results = [judge(q.name, answer, q.success_condition) for q, answer in pairs]
        failed = next((r for r in results if not r.passed), None)
        summary = f"query {failed.name} {failed.message}" if failed else "every query passed"
        state = state.model_copy(
            update={
                "measurements": state.measurements + 1,
                "failed_measurements": state.failed_measurements + (failed is not None),
                "results": results,
                "measured_at": d.now.stamp,
                "message": summary[:1024],
            }
        )
        d.set_wave(index, analysis=state)
        if failed is not None and state.failed_measurements > analysis.failure_limit:
            message = (
                f"{label}: analysis failed: query {failed.name} {failed.message}; "
                f"{counted(state.failed_measurements, 'failed measurement')} > failureLimit "
                f"{analysis.failure_limit}"
            )
            return _failed(d, index, state, message)
    started = parse_time(state.started_at) or d.now.wall
    ends = started + analysis.duration_seconds
    if state.measurements >= required_measurements(d) and d.now.wall >= ends:
        message = f"passed: {counted(state.measurements, 'measurement')}, {state.failed_measurements} failed"
        return _ended(d, index, state, AnalysisPhase.PASSED, message)
    if d.status.phase is not Phase.PAUSED:  # a pause keeps its own message
        line = _line(d, d.status.waves[index])
        d.set(Verdict(Phase.PROGRESSING, RolloutReason.ANALYZING, line), message=line)
    last = parse_time(state.measured_at)
    due = started if last is None else last + analysis.interval_seconds
    if state.measurements >= required_measurements(d):
        due = max(due, ends)  # enough measurements: only the duration is left to pass
    if d.now.wall < due:
        d.wake(due - d.now.wall)
        return None
    context = {"namespace": d.rollout.meta.namespace, "rollout": d.rollout.meta.name}
    context |= {"version": d.spec.version, "wave": str(index)}
    d.plan.measurement = Measurement(
        key=key,
        address=address,
        queries=tuple((q.name, render(q.query, context)) for q in analysis.queries),
        timeout_s=d.tuning.prometheus_timeout_s,
    )
    return None


def _failed(d: Draft, index: int, state: AnalysisStatus, message: str) -> Ending:
    done = state.model_copy(
        update={"phase": AnalysisPhase.FAILED, "completed_at": d.now.stamp, "message": message[:1024]}
    )
    d.set_wave(index, phase=WavePhase.FAILED, completed_at=d.now.stamp, analysis=done)
    d.event(EventType.WARNING, EventReason.ANALYSIS_FAILED, message)
    return Ending(failure=message)


def _ended(d: Draft, index: int, state: AnalysisStatus, phase: AnalysisPhase, message: str) -> Ending:
    """Passed or skipped: the wave completes as it would have without an analysis."""
    done = state.model_copy(update={"phase": phase, "completed_at": d.now.stamp, "message": message})
    # Back to Running: driven at once by the machine, its outcomes (all settled) complete it in
    # this step, through the completion every wave takes; recorded, it is not analyzed again.
    d.set_wave(index, phase=WavePhase.RUNNING, analysis=done)
    passed = phase is AnalysisPhase.PASSED
    d.event(
        EventType.NORMAL,
        EventReason.ANALYSIS_PASSED if passed else EventReason.ANALYSIS_SKIPPED,
        f"{wave_name(d, d.status.waves[index])}: analysis {message}",
    )
    return Ending(failure=None)
