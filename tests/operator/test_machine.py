"""decide(): the reconcile machine, one step at a time, from a status to a Plan. Each row is a
situation a rollout meets (every state and transition), with the plan it must produce."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.status import CheckpointRolloutStatus, WorkerStatus
from ckpt_api.vocabulary import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    ConditionType,
    EventReason,
    Phase,
    RolloutReason,
    WaveKind,
    WavePhase,
    WorkerPhase,
    WorkerReason,
)
from ckpt_e2e.testdata import valid_spec, valid_spec_defaults
from ckpt_rollout.machine import State, classify, decide
from ckpt_rollout.mergepatch import apply_merge_patch
from ckpt_rollout.plan import Draft, Meta, Plan, Rollout
from ckpt_rollout.planning import rollout_order
from ckpt_rollout.world import Memory, Now, Peer, Pod, Tuning, rfc3339

NOW = Now(wall=1_800_000_000.0, mono=10_000.0)
STAMP = NOW.stamp
EARLIER = rfc3339(NOW.wall - 60)
TUNING = Tuning()
PODS = [f"p{i}" for i in range(4)]
ORDER = rollout_order(PODS, "u-1/v2")  # the machine's wave order for this rollout
CANARY, REST = ORDER[0], sorted(ORDER[1:])
BIG = [f"b{i:02d}" for i in range(12)]  # more than Tuning.push_max_wave: a pulled wave
DEADLINE_WAKE = 1800 + 1  # a rollout started now looks again when its deadline has passed


def _rollout(
    status: dict[str, Any] | None = None,
    *,
    spec: dict[str, Any] | None = None,
    pods: list[str] = PODS,
    annotations: dict[str, str] | None = None,
    peers: tuple[Peer, ...] = (),
) -> Rollout:
    wire = apply_merge_patch(valid_spec_defaults(), {**valid_spec(), "version": "v2"})
    wire = apply_merge_patch(wire, spec or {})
    return Rollout(
        meta=Meta("rl", "fleet", "u-1", 3, "t1", annotations or {}),
        spec=CheckpointRolloutSpec.model_validate(wire),
        status=CheckpointRolloutStatus.model_validate(status or {}),
        pods={n: Pod(n, f"10.0.0.{i + 1}", {"app": "rollout-worker"}) for i, n in enumerate(pods)},
        peers=peers,
    )


def _progressing(*waves: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "phase": "Progressing",
        "targetVersion": "v2",
        "previousVersion": "v1",
        "startedAt": EARLIER,
        "waves": list(waves),
        **more,
    }


def _wave(index: int, pods: list[str], *, called: list[str] | None = None, **more: Any) -> dict[str, Any]:
    wave = {"index": index, "kind": "Spec", "specIndex": index, "target": len(pods), "pods": pods}
    return {**wave, "called": pods if called is None else called, "startedAt": EARLIER, **more}


def _done(index: int, pods: list[str]) -> dict[str, Any]:
    return _wave(index, pods, phase="Completed", updated=len(pods), completedAt=EARLIER)


def _entry(version: str, phase: str, reason: str = "Loaded") -> dict[str, Any]:
    return {"version": version, "phase": phase, "reason": reason, "message": f"{reason} {version}"}


def _called_long_ago(*pods: str) -> Memory:
    return Memory(call_times=dict.fromkeys(pods, NOW.mono - 10_000))


def _called_now(*pods: str, **more: Any) -> Memory:
    return Memory(call_times=dict.fromkeys(pods, NOW.mono), **more)


@dataclass(frozen=True)
class Case:
    id: str
    rollout: Rollout
    state: State
    phase: Phase | None
    calls: list[str] = field(default_factory=list)
    pulls: list[str] = field(default_factory=list)
    events: list[EventReason] = field(default_factory=list)
    wake: float | None = None
    memory: Memory = field(default_factory=Memory)
    probe: str | None = None
    # Anything else the row is about: observe(plan) must equal observed.
    observe: Callable[[Plan], object] = lambda plan: None
    observed: object = None


def _waves(plan: Plan) -> list[tuple[WaveKind, WavePhase, list[str], list[str]]]:
    return [(w.kind, w.phase, w.pods, w.called) for w in plan.status.waves]


def _reports(plan: Plan) -> set[bool]:
    """Whether the calls ask their agents to write status.workers."""
    return {bool(c.request.rollout and c.request.rollout.report) for c in plan.calls}


def _condition(plan: Plan, type_: ConditionType) -> tuple[str, str]:
    cond = next(c for c in plan.status.conditions if c.type == type_)
    return cond.status, cond.reason


CASES = [
    Case(
        "first-rollout-asks-the-canary-what-it-serves",
        _rollout(),
        State.START,
        Phase.PROGRESSING,
        events=[EventReason.ROLLOUT_STARTED],
        probe=CANARY,
        wake=DEADLINE_WAKE,
        observe=lambda p: (_waves(p), p.reset_memory, p.status.previous_version),
        observed=([], True, None),
    ),
    Case(
        "the-probed-version-is-previous-and-the-canary-is-called",
        _rollout({"phase": "Progressing", "targetVersion": "v2", "startedAt": EARLIER}),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,  # a push wakes the loop sooner; this is the pull fallback
        memory=Memory(probed=(CANARY, "v1")),
        observe=lambda p: (_waves(p), p.status.previous_version, _reports(p)),
        observed=([(WaveKind.SPEC, WavePhase.RUNNING, [CANARY], [CANARY])], "v1", {True}),
    ),
    Case(
        "a-new-version-with-a-known-stable-one-calls-the-canary-in-the-same-step",
        _rollout({"phase": "Succeeded", "targetVersion": "v1", "stableVersion": "v1"}),
        State.START,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.ROLLOUT_STARTED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: p.status.previous_version,
        observed="v1",
    ),
    Case(
        "a-pushed-success-completes-the-canary-and-starts-the-rest",
        _rollout(_progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Updated")})),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        # The success is folded into the wave's counter.
        observe=lambda p: (
            p.status.workers,
            p.status.waves[0].updated,
            p.status.updated_replicas,
            p.status.wave_progress,
        ),
        observed=({}, 1, 1, "1/2"),
    ),
    Case(
        "the-relay-sends-later-waves-to-the-updated-peer",
        _rollout(_progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Updated")})),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: {c.request.source.peer for c in p.calls if c.request.source},
        observed={f"http://10.0.0.{PODS.index(CANARY) + 1}:8089"},
    ),
    Case(
        "waiting-for-a-push-looks-again-when-the-pull-is-due",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_after_s - 1,
        memory=Memory(call_times={CANARY: NOW.mono - 1}),
    ),
    Case(
        "a-push-overdue-is-pulled",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[CANARY],
        wake=TUNING.pull_every_s,
        memory=Memory(call_times={CANARY: NOW.mono - 6}),
    ),
    Case(
        "after-a-restart-a-called-pod-is-pulled-at-once-and-its-clock-starts",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[CANARY],
        wake=TUNING.pull_every_s,
        observe=lambda p: p.first_seen,
        observed=[CANARY],
    ),
    Case(
        "an-agent-that-lost-the-call-is-called-again",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        wake=TUNING.pull_after_s,
        memory=_called_now(CANARY, lost={CANARY}),
    ),
    Case(
        "a-busy-agent-is-called-again-once-its-retry-is-due",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        wake=TUNING.pull_after_s,
        memory=_called_now(CANARY, busy_until={CANARY: NOW.mono - 0.1}),
    ),
    Case(
        "a-busy-agent-waits-for-its-retry",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=0.5,
        memory=_called_now(CANARY, busy_until={CANARY: NOW.mono + 0.5}),
    ),
    Case(
        "a-worker-past-its-timeout-fails-and-the-rollout-rolls-back",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],  # it may have loaded v2 after all: it is rolled back too
        events=[EventReason.WORKER_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=_called_long_ago(CANARY),
        # The rollback's call asks for v1, with no pin (the digest pins spec.version).
        observe=lambda p: (
            p.status.workers[CANARY].reason,
            p.status.rollback and p.status.rollback.version,
            [(c.request.version, c.request.source and c.request.source.manifest_digest) for c in p.calls],
        ),
        observed=(WorkerReason.WORKER_TIMEOUT, "v1", [("v1", None)]),
    ),
    Case(
        "a-failure-over-budget-with-halt-fails",
        _rollout(
            _progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Failed", "ChecksumMismatch")}),
            spec={"failurePolicy": {"onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.WORKER_FAILED, EventReason.ROLLOUT_FAILED],
        observe=lambda p: (
            _condition(p, ConditionType.FAILED),
            p.status.waves[0].phase,
            p.status.failed_replicas,
        ),
        observed=(("True", "ChecksumMismatch"), WavePhase.FAILED, 1),
    ),
    Case(
        "a-failure-within-budget-goes-on",
        _rollout(
            _progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Failed", "ChecksumMismatch")}),
            spec={"failurePolicy": {"maxFailures": 1}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WORKER_FAILED, EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: sorted(p.status.workers),  # failures stay listed
        observed=[CANARY],
    ),
    Case(
        "a-failure-already-announced-is-not-evented-again",
        _rollout(
            _progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Failed", "ChecksumMismatch")}),
            spec={"failurePolicy": {"onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.ROLLOUT_FAILED],
        memory=Memory(announced={f"{CANARY}/v2"}),
    ),
    Case(
        "pause-after-a-wave-waits-for-promote",
        _rollout(
            _progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Updated")}),
            spec={"strategy": {"pauseAfterWave": [0], "waves": [1, 2, "100%"]}},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.WAVE_COMPLETED, EventReason.PAUSED],
        observe=lambda p: (p.status.paused_at, _condition(p, ConditionType.PAUSED)),
        observed=(STAMP, ("True", RolloutReason.ROLLOUT_PAUSED)),
    ),
    Case(
        "a-timed-pause-wakes-when-it-ends",
        _rollout(
            _progressing(_done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 20)),
            spec={"strategy": {"pauseAfterWave": [0], "pauseDurationSeconds": 30}},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        wake=10,
    ),
    Case(
        "promote-resumes-with-the-paused-time-counted",
        _rollout(
            _progressing(
                _done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 20), pausedSeconds=5
            ),
            spec={"strategy": {"pauseAfterWave": [0]}},
            annotations={PROMOTE_ANNOTATION: "0"},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.RESUMED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (p.status.paused_seconds, p.status.paused_at),
        observed=(25, None),
    ),
    Case(
        "spec-paused-holds-the-calls-of-a-running-wave",
        _rollout(_progressing(_wave(0, [CANARY], called=[])), spec={"paused": True}),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.PAUSED],
    ),
    Case(
        "a-big-wave-is-pulled-and-called-at-once",
        _rollout(_progressing(), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=BIG,
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_first_s,
        observe=_reports,
        observed={False},  # the agents are asked not to write status.workers
    ),
    *(
        Case(
            f"a-wave-of-{size}-is-{'pulled' if pulled else 'pushed'}",
            _rollout(_progressing(), pods=BIG[:size], spec={"strategy": {"waves": ["100%"]}}),
            State.ADVANCE,
            Phase.PROGRESSING,
            calls=BIG[:size],
            events=[EventReason.WAVE_STARTED],
            wake=TUNING.pull_first_s if pulled else TUNING.pull_after_s,
            observe=_reports,
            observed={not pulled},
        )
        for size, pulled in ((TUNING.push_max_wave, False), (TUNING.push_max_wave + 1, True))
    ),
    Case(
        "a-pulled-wave-is-pulled-in-rounds-not-pod-by-pod",
        _rollout(_progressing(_wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=BIG,  # half are due; the rest would be within the interval
        wake=TUNING.pull_first_s,
        memory=Memory(call_times={n: NOW.mono - (0.3 if i % 2 else 0.1) for i, n in enumerate(BIG)}),
    ),
    Case(
        "a-pulled-wave-with-none-due-waits-for-the-first",
        _rollout(_progressing(_wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=0.05,
        memory=Memory(call_times={n: NOW.mono - (0.2 if i % 2 else 0.1) for i, n in enumerate(BIG)}),
    ),
    Case(
        "pulled-outcomes-heard-complete-the-wave-without-being-written-first",
        _rollout(_progressing(_wave(0, PODS)), spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
        memory=Memory(
            call_times=dict.fromkeys(PODS, NOW.mono),
            heard={n: WorkerStatus(version="v2", phase=WorkerPhase.UPDATED) for n in PODS},
        ),
        observe=lambda p: (p.status.workers, sorted(p.consumed), p.status.stable_version, p.status.message),
        observed=({}, PODS, "v2", "v2 is live on 4 pods"),
    ),
    Case(
        "a-heard-outcome-never-overwrites-the-agents-own-report-of-that-load",
        _rollout(_progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Updated")})),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=Memory(heard={CANARY: WorkerStatus(version="v2", phase=WorkerPhase.FAILED, reason="X")}),
        observe=lambda p: p.status.waves[0].updated,
        observed=1,
    ),
    Case(
        "a-member-that-disappeared-counts-as-gone",
        _rollout(
            _progressing(_wave(0, [CANARY])),
            pods=[p for p in PODS if p != CANARY],
            spec={"strategy": {"waves": [1, 2, "100%"]}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=ORDER[1:3],  # the canary is replaced in the next wave, not skipped
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=_called_now(CANARY),
        observe=lambda p: p.status.waves[0].gone,
        observed=1,
    ),
    Case(
        "pods-that-joined-during-the-rollout-get-a-drift-wave",
        _rollout(_progressing(_done(0, [CANARY]), _done(1, REST[:2]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[REST[2]],
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: _waves(p)[-1][:2],
        observed=(WaveKind.DRIFT, WavePhase.RUNNING),
    ),
    Case(
        "the-last-wave-done-succeeds",
        _rollout(_progressing(_done(0, [CANARY]), _done(1, REST))),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.ROLLOUT_COMPLETED],
        observe=lambda p: (_condition(p, ConditionType.READY), p.status.completed_at),
        observed=(("True", RolloutReason.ROLLOUT_COMPLETED), STAMP),
    ),
    Case(
        "a-finished-rollout-plans-nothing-and-sets-no-timer",
        _rollout(_progressing(_done(0, [CANARY]), _done(1, REST), phase="Succeeded")),
        State.DONE,
        Phase.SUCCEEDED,
    ),
    Case(
        "a-pod-after-success-is-brought-to-the-stable-version",
        _rollout(_progressing(_done(0, [CANARY]), _done(1, REST[:2]), phase="Succeeded")),
        State.DONE,
        Phase.PROGRESSING,
        calls=[REST[2]],
        events=[EventReason.DRIFT_CORRECTION, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
    ),
    Case(
        "a-new-version-mid-rollout-supersedes-and-catches-up-the-called-pods-first",
        _rollout(_progressing(_done(0, [CANARY]), _wave(1, REST), targetVersion="v1b")),
        State.START,
        Phase.PROGRESSING,
        calls=sorted(PODS),
        events=[EventReason.SUPERSEDED, EventReason.ROLLOUT_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (_waves(p)[0][:2], p.status.superseded_version, p.status.workers),
        observed=((WaveKind.CATCH_UP, WavePhase.RUNNING), "v1b", {}),
    ),
    Case(
        "retry-after-a-rollback-rolls-the-same-version-out-again",
        _rollout(
            _progressing(_done(0, [CANARY]), phase="RolledBack", stableVersion="v1"),
            annotations={RETRY_ANNOTATION: "t1"},
        ),
        State.RETRY,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.ROLLOUT_STARTED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (p.status.retried, p.status.previous_version, p.events[0].message.split(":")[0]),
        observed=("t1", "v1", "retrying after RolledBack"),
    ),
    Case(
        "a-retry-already-acted-on-is-not-repeated",
        _rollout(
            _progressing(_done(0, [CANARY]), phase="RolledBack", retried="t1"),
            annotations={RETRY_ANNOTATION: "t1"},
        ),
        State.DONE,
        Phase.ROLLED_BACK,
    ),
    Case(
        "retry-is-ignored-while-the-rollout-is-live",
        _rollout(_progressing(_wave(0, [CANARY])), annotations={RETRY_ANNOTATION: "t1"}),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_after_s,
        memory=_called_now(CANARY),
    ),
    Case(
        "abort-rolls-the-called-pods-back",
        _rollout(_progressing(_done(0, [CANARY]), _wave(1, REST)), annotations={ABORT_ANNOTATION: "v2"}),
        State.ABORT,
        Phase.ROLLING_BACK,
        calls=sorted(PODS),
        events=[EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (
            p.status.rollback and (p.status.rollback.reason, p.status.rollback.called),
            {c.request.version for c in p.calls},
        ),
        observed=((RolloutReason.ABORTED, sorted(PODS)), {"v1"}),
    ),
    Case(
        "abort-with-no-previous-version-fails-saying-so",
        _rollout(
            {**_progressing(_wave(0, [CANARY])), "previousVersion": None},
            annotations={ABORT_ANNOTATION: "v2"},
        ),
        State.ABORT,
        Phase.FAILED,
        events=[EventReason.ROLLOUT_FAILED],
        observe=lambda p: p.status.message,
        observed="aborted by user; no previous version is known, so nothing can be rolled back",
    ),
    Case(
        "a-rollback-done-is-rolled-back",
        _rollout(
            _progressing(
                _wave(0, [CANARY]),
                phase="RollingBack",
                rollback={"version": "v1", "reason": "Aborted", "pods": [CANARY], "called": [CANARY]},
                workers={CANARY: _entry("v1", "Updated")},
            )
        ),
        State.ROLLING_BACK,
        Phase.ROLLED_BACK,
        events=[EventReason.ROLLED_BACK],
        observe=lambda p: (
            p.status.rollback and p.status.rollback.phase,
            _condition(p, ConditionType.STALLED),
        ),
        observed=(WavePhase.COMPLETED, ("True", RolloutReason.ABORTED)),
    ),
    Case(
        "a-rollback-that-fails-is-reported",
        _rollout(
            _progressing(
                _wave(0, [CANARY]),
                phase="RollingBack",
                rollback={"version": "v1", "reason": "Aborted", "pods": [CANARY], "called": [CANARY]},
                workers={CANARY: _entry("v1", "Failed", "AgentUnreachable")},
            )
        ),
        State.ROLLING_BACK,
        Phase.FAILED,
        events=[EventReason.WORKER_FAILED, EventReason.ROLLBACK_FAILED],
        observe=lambda p: _condition(p, ConditionType.FAILED),
        observed=("True", RolloutReason.ROLLBACK_FAILED),
    ),
    Case(
        "the-progress-deadline-fails-the-rollout",
        _rollout(
            _progressing(_wave(0, [CANARY]), startedAt=rfc3339(NOW.wall - 100)),
            spec={
                "timeouts": {"progressDeadlineSeconds": 90, "workerSeconds": 60},
                "failurePolicy": {"onFailure": "Halt"},
            },
        ),
        State.DEADLINE,
        Phase.FAILED,
        events=[EventReason.ROLLOUT_FAILED],
        observe=lambda p: _condition(p, ConditionType.FAILED),
        observed=("True", RolloutReason.PROGRESS_DEADLINE_EXCEEDED),
    ),
    Case(
        "no-matching-pod-waits-for-one",
        _rollout(pods=[]),
        State.START,
        Phase.PENDING,
        events=[EventReason.ROLLOUT_STARTED],
        observe=lambda p: _condition(p, ConditionType.PROGRESSING),
        observed=("True", RolloutReason.NO_WORKERS),
    ),
    Case(
        "an-older-overlapping-rollout-stalls-this-one",
        _rollout(peers=(Peer("older", "t0", {"matchLabels": {"app": "rollout-worker"}}),)),
        State.CONFLICT,
        Phase.PENDING,
        events=[EventReason.SELECTOR_CONFLICT],
        wake=TUNING.idle_poll_s,
        observe=lambda p: (_condition(p, ConditionType.STALLED), _condition(p, ConditionType.PROGRESSING)[0]),
        observed=(("True", RolloutReason.SELECTOR_CONFLICT), "False"),
    ),
    Case(
        "a-newer-or-disjoint-rollout-is-no-conflict",
        _rollout(
            peers=(
                Peer("newer", "t9", {"matchLabels": {"app": "rollout-worker"}}),
                Peer("other", "t0", {"matchLabels": {"app": "other"}}),
            )
        ),
        State.START,
        Phase.PROGRESSING,
        events=[EventReason.ROLLOUT_STARTED],
        probe=CANARY,
        wake=DEADLINE_WAKE,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case) -> None:
    assert classify(Draft(case.rollout, case.memory, TUNING, NOW)) is case.state
    plan = decide(case.rollout, case.memory, TUNING, NOW)
    assert plan.status.phase is case.phase
    assert sorted(c.pod for c in plan.calls) == sorted(case.calls)
    assert [p.pod for p in plan.pulls] == case.pulls
    assert [e.reason for e in plan.events] == case.events
    assert (plan.probe.pod if plan.probe else None) == case.probe
    assert plan.wake_after == (None if case.wake is None else pytest.approx(case.wake))
    # Intent first: every pod called is recorded as called in the status to be written.
    recorded = {p for w in plan.status.waves for p in w.called}
    recorded |= set(plan.status.rollback.called) if plan.status.rollback else set()
    assert {c.pod for c in plan.calls} <= recorded
    assert case.observe(plan) == case.observed


def test_decide_is_pure() -> None:
    """Deciding twice from the same inputs gives the same plan and changes no input."""
    rollout = CASES[3].rollout
    before = (rollout.status.model_dump(), Memory().__dict__)
    memory = Memory()
    first, second = decide(rollout, memory, TUNING, NOW), decide(rollout, memory, TUNING, NOW)
    assert first.status == second.status
    assert first.calls == second.calls
    assert (rollout.status.model_dump(), memory.__dict__) == before


def test_the_deadline_excludes_paused_time_and_sets_a_timer() -> None:
    rollout = _rollout(
        _progressing(_wave(0, [CANARY]), startedAt=rfc3339(NOW.wall - 100), pausedSeconds=50),
        spec={"timeouts": {"progressDeadlineSeconds": 90, "workerSeconds": 60}},
    )
    slow_pulls = Tuning(pull_after_s=1000)
    plan = decide(rollout, _called_now(CANARY), slow_pulls, NOW)
    assert plan.status.phase is Phase.PROGRESSING
    assert plan.wake_after == pytest.approx(41)  # 40 s left, looked at a second after
