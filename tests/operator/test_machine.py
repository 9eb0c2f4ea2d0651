"""decide(): the reconcile machine, one step at a time, from a status to a Plan. Each row is a
situation a rollout meets (every state and transition), with the plan it must produce."""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
    EventType,
    Phase,
    RolloutReason,
    WaveKind,
    WavePhase,
    WorkerPhase,
    WorkerReason,
    WorkerResult,
)
from ckpt_e2e.testdata import valid_spec, valid_spec_defaults
from ckpt_rollout import machine
from ckpt_rollout.drive import failure_entry
from ckpt_rollout.machine import State, classify, deadline_remaining, decide
from ckpt_rollout.mergepatch import apply_merge_patch
from ckpt_rollout.plan import Draft, Measure, Meta, Plan, Rollout
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
BIG_ORDER = rollout_order(BIG, "u-1/v2")
DIGEST = "sha256:" + "ab" * 32
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


def _ip(pod: str, pods: list[str] = PODS) -> str:
    """The IP of ``pod`` in a rollout of ``pods``, as _rollout numbers them."""
    return f"10.0.0.{pods.index(pod) + 1}"


def _url(pod: str, pods: list[str] = PODS) -> str:
    return f"http://{_ip(pod, pods)}:8089"


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
    tuning: Tuning = field(default_factory=Tuning)
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


def _worker(plan: Plan, pod: str) -> tuple[object, ...]:
    w = plan.status.workers[pod]
    return w.phase, w.reason, w.message, w.wave, w.last_transition_time


def _peers(plan: Plan) -> set[str | None]:
    """Where the calls have their agents fetch the bytes from (None: the source)."""
    return {c.request.source.peer if c.request.source else None for c in plan.calls}


CASES = [
    Case(
        "first-rollout-asks-the-canary-what-it-serves",
        _rollout(),
        State.START,
        Phase.PROGRESSING,
        events=[EventReason.ROLLOUT_STARTED],
        probe=CANARY,
        wake=DEADLINE_WAKE,
        observe=lambda p: (_waves(p), p.reset_memory, p.status.previous_version, p.probe and p.probe.port),
        observed=([], True, None, 8089),
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
        "a-canary-already-serving-the-new-version-leaves-no-previous-version",
        _rollout({"phase": "Progressing", "targetVersion": "v2", "startedAt": EARLIER}),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=Memory(probed=(CANARY, "v2")),
        observe=lambda p: p.status.previous_version,
        observed=None,  # rolling back to the version being rolled out would undo nothing
    ),
    Case(
        "a-new-version-with-a-known-stable-one-calls-the-canary-in-the-same-step",
        _rollout({"phase": "Succeeded", "targetVersion": "v1", "stableVersion": "v1"}),
        State.START,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.ROLLOUT_STARTED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (p.status.previous_version, p.status.superseded_version),
        observed=("v1", None),  # nothing was in flight: nothing superseded
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
        "every-call-of-the-spec-version-carries-its-digest-and-checksum-flag-relayed-or-not",
        _rollout(
            _progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Updated")}),
            spec={"source": {"manifestDigest": DIGEST}, "verifyChecksum": True},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (
            {(c.port, c.request.version, c.request.verify_checksum) for c in p.calls},
            {c.request.source and c.request.source.manifest_digest for c in p.calls},
            _peers(p),
        ),
        observed=({(8089, "v2", True)}, {DIGEST}, {_url(CANARY)}),
    ),
    Case(
        "without-peer-relay-later-waves-load-from-the-source",
        _rollout(
            _progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Updated")}),
            spec={"strategy": {"peerRelay": False}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=_peers,
        observed={None},
    ),
    Case(
        "a-pod-whose-load-failed-is-no-relay-peer",
        _rollout(
            _progressing(
                _wave(0, ORDER[:2]),
                workers={
                    ORDER[0]: _entry("v2", "Updated"),
                    ORDER[1]: _entry("v2", "Failed", "ChecksumMismatch"),
                },
            ),
            spec={"strategy": {"waves": [2, "100%"]}, "failurePolicy": {"maxFailures": 1}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=ORDER[2:],
        events=[EventReason.WORKER_FAILED, EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=_peers,
        observed={_url(ORDER[0])},
    ),
    Case(
        "a-member-back-after-being-gone-is-called-and-the-called-stay-recorded",
        _rollout(
            _progressing(_wave(0, ORDER[:2], called=ORDER[:1])), spec={"strategy": {"waves": [2, "100%"]}}
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[ORDER[1]],
        wake=TUNING.pull_after_s,
        memory=_called_now(ORDER[0]),
        observe=lambda p: _waves(p)[0][3],
        observed=ORDER[:2],
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
        observe=lambda p: [(x.ip, x.port, x.version, x.wave) for x in p.pulls],
        observed=[(_ip(CANARY), 8089, "v2", 0)],
    ),
    Case(
        "a-pushed-wave-once-pulled-is-pulled-again-pull-every-s-later",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_every_s - 1,
        memory=Memory(call_times={CANARY: NOW.mono - 10}, last_pull={CANARY: NOW.mono - 1}),
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
        "a-busy-agent-is-called-again-the-moment-its-retry-is-due",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        wake=TUNING.pull_after_s,
        memory=_called_now(CANARY, busy_until={CANARY: NOW.mono}),
    ),
    Case(
        "a-lost-call-is-made-again-and-the-next-member-is-still-pulled",
        _rollout(_progressing(_wave(0, ORDER[:2])), spec={"strategy": {"waves": [2, "100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[ORDER[0]],
        pulls=[ORDER[1]],
        wake=TUNING.pull_every_s,
        memory=Memory(call_times={ORDER[0]: NOW.mono, ORDER[1]: NOW.mono - 6}, lost={ORDER[0]}),
    ),
    Case(
        "a-busy-member-waits-and-the-next-member-is-still-pulled",
        _rollout(_progressing(_wave(0, ORDER[:2])), spec={"strategy": {"waves": [2, "100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[ORDER[1]],
        wake=0.5,
        memory=Memory(
            call_times={ORDER[0]: NOW.mono, ORDER[1]: NOW.mono - 6}, busy_until={ORDER[0]: NOW.mono + 0.5}
        ),
    ),
    Case(
        "a-worker-past-its-timeout-fails-and-the-rollout-rolls-back",
        _rollout(_progressing(_wave(0, [CANARY])), spec={"source": {"manifestDigest": DIGEST}}),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],  # it may have loaded v2 after all: it is rolled back too
        events=[EventReason.WORKER_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=_called_long_ago(CANARY),
        # The rollback's call asks for v1, with no pin (the digest pins spec.version).
        observe=lambda p: (
            _worker(p, CANARY),
            p.status.rollback and p.status.rollback.version,
            [(c.request.version, c.request.source and c.request.source.manifest_digest) for c in p.calls],
        ),
        observed=(
            (WorkerPhase.FAILED, WorkerReason.WORKER_TIMEOUT, "no outcome within 600s", 0, STAMP),
            "v1",
            [("v1", None)],
        ),
    ),
    Case(
        "a-worker-at-its-timeout-is-not-yet-failed",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[CANARY],
        wake=0,
        memory=Memory(call_times={CANARY: NOW.mono - 600}),
    ),
    Case(
        "a-worker-about-to-time-out-is-looked-at-when-it-does",
        _rollout(_progressing(_wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=1,  # before its next pull is due
        memory=Memory(call_times={CANARY: NOW.mono - 599}, last_pull={CANARY: NOW.mono}),
    ),
    Case(
        "a-member-timed-out-fails-and-the-next-is-still-watched",
        _rollout(
            _progressing(_wave(0, ORDER[:2])),
            spec={"strategy": {"waves": [2, "100%"]}, "failurePolicy": {"maxFailures": 1}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        events=[EventReason.WORKER_FAILED],
        wake=TUNING.pull_after_s,
        memory=Memory(call_times={ORDER[0]: NOW.mono - 10_000, ORDER[1]: NOW.mono}),
        observe=lambda p: sorted(p.status.workers),
        observed=[ORDER[0]],
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
            (p.status.waves[0].phase, p.status.waves[0].failed, p.status.waves[0].completed_at),
            p.status.completed_at,
            p.status.failed_replicas,
        ),
        observed=(("True", "ChecksumMismatch"), (WavePhase.FAILED, 1, STAMP), STAMP, 1),
    ),
    Case(
        "a-failure-is-written-as-such-even-with-a-retry-token-never-acted-on",
        _rollout(
            _progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Failed", "ChecksumMismatch")}),
            spec={"failurePolicy": {"onFailure": "Halt"}},
            annotations={RETRY_ANNOTATION: "t1"},  # set while it ran, when a retry is ignored
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.WORKER_FAILED, EventReason.ROLLOUT_FAILED],
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
        observe=lambda p: (
            sorted(p.status.workers),  # failures stay listed
            [(w.phase, w.updated, w.failed, w.gone, w.completed_at) for w in p.status.waves[:1]],
        ),
        observed=([CANARY], [(WavePhase.COMPLETED, 0, 1, 0, STAMP)]),
    ),
    Case(
        "a-percent-failure-budget-is-a-share-of-the-fleet",
        _rollout(
            _progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Failed", "ChecksumMismatch")}),
            spec={"failurePolicy": {"maxFailures": "50%"}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WORKER_FAILED, EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
    ),
    Case(
        "a-fleet-shrunk-below-its-failure-budget-fails-when-the-next-wave-ends",
        _rollout(
            _progressing(
                _wave(0, [CANARY], phase="Completed", failed=1, completedAt=EARLIER),
                _wave(1, REST),
                workers={
                    CANARY: _entry("v2", "Failed", "ChecksumMismatch"),
                    REST[0]: _entry("v2", "Updated"),
                    REST[1]: _entry("v2", "Updated"),
                },
            ),
            pods=[CANARY, *REST[:2]],  # 25% of 4 pods tolerated the canary's failure; of 3, none
            spec={"failurePolicy": {"maxFailures": "25%", "onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.ROLLOUT_FAILED],
        observe=lambda p: (_waves(p)[1][1], p.status.waves[1].failed, _condition(p, ConditionType.FAILED)),
        observed=(WavePhase.FAILED, 0, ("True", RolloutReason.WORKER_FAILED)),
    ),
    Case(
        "each-new-failure-in-a-wave-is-announced-once",
        _rollout(
            _progressing(
                _wave(0, PODS),
                workers={
                    PODS[1]: _entry("v2", "Failed", "ChecksumMismatch"),
                    PODS[2]: _entry("v2", "Failed", "ChecksumMismatch"),
                    PODS[3]: {"version": "v2", "phase": "Failed", "reason": "LoadFailed"},
                },
            ),
            spec={"strategy": {"waves": ["100%"]}, "failurePolicy": {"maxFailures": 3}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        events=[EventReason.WORKER_FAILED, EventReason.WORKER_FAILED],  # not PODS[1]'s again
        wake=TUNING.pull_after_s,
        memory=_called_now(PODS[0], announced={f"{PODS[1]}/v2"}),
    ),
    Case(
        "a-long-failure-message-is-cut-to-fit-an-event",
        _rollout(
            _progressing(
                _wave(0, [CANARY]),
                workers={
                    CANARY: {
                        "version": "v2",
                        "phase": "Failed",
                        "reason": "LoadFailed",
                        "message": "x" * 2000,
                    }
                },
            ),
            spec={"failurePolicy": {"onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.WORKER_FAILED, EventReason.ROLLOUT_FAILED],
        observe=lambda p: p.events[0].message,
        observed=f"{CANARY}: LoadFailed: {'x' * 2000}"[:1000],
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
        "promote-after-a-first-pause-counts-that-pause-alone",
        _rollout(
            _progressing(_done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 20)),
            spec={"strategy": {"pauseAfterWave": [0]}},
            annotations={PROMOTE_ANNOTATION: "0"},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.RESUMED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: p.status.paused_seconds,
        observed=20,
    ),
    Case(
        "a-pause-for-promote-holds-until-promoted",
        _rollout(
            _progressing(_done(0, [CANARY]), phase="Paused", pausedAt=EARLIER),
            spec={"strategy": {"pauseAfterWave": [0]}},
        ),
        State.ADVANCE,
        Phase.PAUSED,  # and no timer: only the promote annotation, a change to the CR, ends it
    ),
    *(
        Case(
            f"a-malformed-promote-{value}-is-ignored",
            _rollout(
                _progressing(_done(0, [CANARY]), phase="Paused", pausedAt=EARLIER),
                spec={"strategy": {"pauseAfterWave": [0]}},
                annotations={PROMOTE_ANNOTATION: value},
            ),
            State.ADVANCE,
            Phase.PAUSED,
        )
        # "--1" and "²" pass str.isdigit() after lstrip("-") yet int() refuses them.
        for value in ("1-", "X0", "wave-1", "--1", "\u00b2", "")
    ),
    Case(
        "a-timed-pause-begins-after-its-wave-and-wakes-when-it-ends",
        _rollout(
            _progressing(_wave(0, [CANARY]), workers={CANARY: _entry("v2", "Updated")}),
            spec={"strategy": {"pauseAfterWave": [0], "pauseDurationSeconds": 30}},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.WAVE_COMPLETED, EventReason.PAUSED],
        wake=30,
    ),
    Case(
        "a-timed-pause-with-a-second-left-waits-that-second",
        _rollout(
            _progressing(_done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 29)),
            spec={"strategy": {"pauseAfterWave": [0], "pauseDurationSeconds": 30}},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        wake=1,
    ),
    Case(
        "a-timed-pause-that-has-run-its-time-resumes",
        _rollout(
            _progressing(_done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 30)),
            spec={"strategy": {"pauseAfterWave": [0], "pauseDurationSeconds": 30}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.RESUMED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (p.status.paused_seconds, p.status.paused_at),
        observed=(30, None),
    ),
    Case(
        "spec-paused-holds-the-calls-of-a-running-wave",
        _rollout(_progressing(_wave(0, [CANARY], called=[])), spec={"paused": True}),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.PAUSED],
    ),
    Case(
        "spec-paused-between-waves-holds-the-next",
        _rollout(_progressing(_done(0, [CANARY])), spec={"paused": True}),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.PAUSED],
    ),
    Case(
        "unpausing-a-running-wave-resumes-its-calls",
        _rollout(
            _progressing(_wave(0, [CANARY], called=[]), phase="Paused", pausedAt=rfc3339(NOW.wall - 20))
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.RESUMED],
        wake=TUNING.pull_after_s,
        observe=lambda p: _condition(p, ConditionType.PAUSED),
        observed=("False", RolloutReason.ROLLOUT_RESUMED),
    ),
    Case(
        "a-wave-that-ends-while-spec-paused-completes-and-the-rollout-stays-paused",
        _rollout(
            _progressing(
                _wave(0, [CANARY]),
                phase="Paused",
                pausedAt=EARLIER,
                workers={CANARY: _entry("v2", "Updated")},
            ),
            spec={"paused": True},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.WAVE_COMPLETED],
        observe=lambda p: (_waves(p)[0][1], p.status.paused_at),
        observed=(WavePhase.COMPLETED, EARLIER),
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
    *(
        Case(
            f"a-wave-of-{size}-is-announced-with-{'its-first-five-members' if size > 5 else 'every-member'}",
            _rollout(_progressing(), pods=BIG, spec={"strategy": {"waves": [size, "100%"]}}),
            State.ADVANCE,
            Phase.PROGRESSING,
            calls=BIG_ORDER[:size],
            events=[EventReason.WAVE_STARTED],
            wake=TUNING.pull_after_s,
        )
        for size in (5, 6)
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
        "a-pulled-round-takes-every-member-due-within-its-interval",
        _rollout(_progressing(_wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=BIG,  # BIG[0] is due now; the rest exactly one interval later
        wake=TUNING.pull_first_s,
        memory=Memory(call_times={**dict.fromkeys(BIG, NOW.mono), BIG[0]: NOW.mono - TUNING.pull_first_s}),
    ),
    Case(
        "a-pulled-wave-is-pulled-every-half-of-the-time-waited",
        _rollout(_progressing(_wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=0.5,  # called 4 s ago: every 2 s, and the last pull was 1.5 s ago
        memory=Memory(
            call_times=dict.fromkeys(BIG, NOW.mono - 4), last_pull=dict.fromkeys(BIG, NOW.mono - 1.5)
        ),
    ),
    Case(
        "a-big-wave-is-pulled-no-faster-than-pull-rate-allows",
        _rollout(_progressing(_wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=1,  # 12 pods at 2 pulls a second: each every 6 s, and the last pull was 5 s ago
        memory=Memory(
            call_times=dict.fromkeys(BIG, NOW.mono - 10), last_pull=dict.fromkeys(BIG, NOW.mono - 5)
        ),
        tuning=Tuning(pull_rate=2.0),
    ),
    Case(
        "mid-wave-counters-count-the-loads-already-reported",
        _rollout(
            _progressing(
                _done(0, [BIG[0]]),
                _wave(1, BIG[1:5]),
                workers={
                    BIG[1]: _entry("v2", "Updated"),
                    BIG[2]: _entry("v2", "Updated"),
                    BIG[3]: _entry("v2", "Failed", "ChecksumMismatch"),
                    BIG[4]: _entry("v1", "Updated"),  # the version before: still loading v2
                },
            ),
            pods=BIG[:6],
            spec={"failurePolicy": {"maxFailures": 1}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_after_s,
        memory=_called_now(BIG[4], announced={f"{BIG[3]}/v2"}),
        observe=lambda p: (
            p.status.updated_replicas,
            p.status.failed_replicas,
            p.status.replicas,
            p.status.current_wave,
            p.status.total_waves,
            p.status.wave_progress,
            p.status.observed_generation,
        ),
        observed=(3, 1, 6, 1, 2, "1/2", 3),
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
        "a-drift-wave-done-succeeds-again",
        _rollout(
            _progressing(
                _done(0, [CANARY]),
                _done(1, REST[:2]),
                {**_wave(2, [REST[2]]), "kind": "Drift", "specIndex": None},
                workers={REST[2]: _entry("v2", "Updated")},
            )
        ),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
    ),
    Case(
        "after-the-catch-up-the-spec-waves-start-from-the-first-which-it-may-already-cover",
        _rollout(
            _progressing(
                {**_wave(0, [CANARY]), "kind": "CatchUp", "specIndex": None},
                supersededVersion="v1b",
                workers={CANARY: _entry("v2", "Updated")},
            )
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[
            EventReason.WAVE_COMPLETED,
            EventReason.WAVE_STARTED,
            EventReason.WAVE_COMPLETED,
            EventReason.WAVE_STARTED,
        ],
        wake=TUNING.pull_after_s,
        observe=lambda p: [(w.kind, w.spec_index, w.phase, w.pods) for w in p.status.waves],
        observed=[
            (WaveKind.CATCH_UP, None, WavePhase.COMPLETED, [CANARY]),
            (WaveKind.SPEC, 0, WavePhase.COMPLETED, []),  # the canary already counts toward it
            (WaveKind.SPEC, 1, WavePhase.RUNNING, ORDER[1:]),
        ],
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
        _rollout(
            _progressing(_done(0, [CANARY]), _done(1, REST[:2]), phase="Succeeded", completedAt=EARLIER)
        ),
        State.DONE,
        Phase.PROGRESSING,
        calls=[REST[2]],
        events=[EventReason.DRIFT_CORRECTION, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (
            p.status.completed_at,
            [(w.index, w.kind, w.target, w.pods, w.started_at) for w in p.status.waves[2:]],
        ),
        observed=(None, [(2, WaveKind.DRIFT, 1, [REST[2]], STAMP)]),
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
        "a-supersede-catches-up-only-the-called-pods-still-here-and-restarts-the-clocks",
        _rollout(
            _progressing(
                _done(0, [CANARY]),
                _wave(1, REST, called=REST[:2]),
                targetVersion="v1b",
                phase="Paused",
                pausedAt=EARLIER,
                pausedSeconds=7,
                workers={REST[1]: _entry("v1b", "Loading")},
            ),
            pods=[CANARY, REST[1], REST[2]],  # REST[0], called, has gone
        ),
        State.START,
        Phase.PROGRESSING,
        calls=sorted([CANARY, REST[1]]),
        events=[EventReason.SUPERSEDED, EventReason.ROLLOUT_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (
            [(w.index, w.kind, w.target, w.pods, w.started_at) for w in p.status.waves],
            (p.status.started_at, p.status.paused_at, p.status.paused_seconds, p.status.workers),
        ),
        observed=([(0, WaveKind.CATCH_UP, 2, sorted([CANARY, REST[1]]), STAMP)], (STAMP, None, 0.0, {})),
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
        "a-retry-starts-over-from-a-clean-status",
        _rollout(
            _progressing(
                _done(0, [CANARY]),
                phase="RolledBack",
                stableVersion="v1",
                completedAt=EARLIER,
                retried="t0",
                rollback={"version": "v1", "reason": "WorkerTimeout", "pods": [CANARY], "phase": "Completed"},
                workers={CANARY: _entry("v2", "Failed", "WorkerTimeout")},
            ),
            annotations={RETRY_ANNOTATION: "t1"},
        ),
        State.RETRY,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.ROLLOUT_STARTED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (
            p.status.rollback,
            p.status.completed_at,
            p.status.workers,
            p.status.superseded_version,
            p.status.started_at,
        ),
        observed=(None, None, {}, None, STAMP),
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
            p.status.rollback
            and (
                p.status.rollback.version,
                p.status.rollback.reason,
                p.status.rollback.pods,
                p.status.rollback.called,
                p.status.rollback.started_at,
            ),
            {c.request.version for c in p.calls},
        ),
        observed=(("v1", RolloutReason.ABORTED, sorted(PODS), sorted(PODS), STAMP), {"v1"}),
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
        observe=lambda p: (p.status.completed_at, _condition(p, ConditionType.FAILED)),
        observed=(STAMP, ("True", RolloutReason.ABORTED)),
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
            p.status.rollback and (p.status.rollback.phase, p.status.rollback.completed_at),
            p.status.completed_at,
            _condition(p, ConditionType.STALLED),
        ),
        observed=((WavePhase.COMPLETED, STAMP), STAMP, ("True", RolloutReason.ABORTED)),
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
        "a-rollback-failing-on-many-workers-names-the-first-ten",
        _rollout(
            _progressing(
                _wave(0, BIG),
                phase="RollingBack",
                rollback={"version": "v1", "reason": "Aborted", "pods": BIG, "called": BIG},
                workers={n: _entry("v1", "Failed", "AgentUnreachable") for n in BIG},
            ),
            pods=BIG,
            spec={"strategy": {"waves": ["100%"]}},
        ),
        State.ROLLING_BACK,
        Phase.FAILED,
        events=[EventReason.ROLLBACK_FAILED],
        memory=Memory(announced={f"{n}/v1" for n in BIG}),
    ),
    Case(
        "a-rollback-end-is-written-as-such-even-with-a-retry-token-never-acted-on",
        _rollout(
            _progressing(
                _wave(0, [CANARY]),
                phase="RollingBack",
                rollback={"version": "v1", "reason": "Aborted", "pods": [CANARY], "called": [CANARY]},
                workers={CANARY: _entry("v1", "Updated")},
            ),
            annotations={RETRY_ANNOTATION: "t1"},
        ),
        State.ROLLING_BACK,
        Phase.ROLLED_BACK,
        events=[EventReason.ROLLED_BACK],
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
        "at-its-deadline-a-rollout-is-not-yet-failed",
        _rollout(_progressing(_wave(0, [CANARY]), startedAt=rfc3339(NOW.wall - 1800))),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=1,  # a second later it is
        memory=_called_now(CANARY),
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
        "the-older-overlapping-rollout-is-found-past-itself-and-newer-and-unreadable-peers",
        _rollout(
            peers=(
                Peer("fleet", "t1", {"matchLabels": {"app": "rollout-worker"}}),  # this CR itself
                Peer("newer", "t9", {"matchLabels": {"app": "rollout-worker"}}),
                Peer("broken", "t0", {"matchExpressions": [{"key": "app", "operator": "Near"}]}),
                Peer("older", "t0", {"matchLabels": {"app": "rollout-worker"}}),
            )
        ),
        State.CONFLICT,
        Phase.PENDING,
        events=[EventReason.SELECTOR_CONFLICT],
        wake=TUNING.idle_poll_s,
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


N, W = EventType.NORMAL, EventType.WARNING
R = EventReason
UPDATED, FAILED, ROLLED_BACK = WorkerResult.UPDATED, WorkerResult.FAILED, WorkerResult.ROLLED_BACK
SECONDS = Measure.WAVE_SECONDS


def _wave_of(pods: list[str]) -> str:
    """How a wave's start event lists its members."""
    return ", ".join(pods[:5]) + (", ..." if len(pods) > 5 else "")


@dataclass(frozen=True)
class Told:
    """What a step tells: its events (type, reason, message) for kubectl describe, the
    status.message, the reason of the conditions it writes (None: it writes none; every
    condition carries status.message), and its metrics (measure, value, label)."""

    events: list[tuple[EventType, EventReason, str]]
    message: str | None
    reason: str | None
    metrics: Sequence[tuple[Measure, float, str]] = ()


_STARTED = "rolling out v2 to 4 pods in 2 waves"
_WAVE_2 = f"wave 2/2: 3 pods: {_wave_of(ORDER[1:])}"
_CANARY_FAILED = f"{CANARY}: ChecksumMismatch: ChecksumMismatch v2"
_OVER_BUDGET = f"wave 1: worker {CANARY} failed (ChecksumMismatch: ChecksumMismatch v2); 1 failed > budget 0"
_TIMED_OUT = (
    f"wave 1: worker {CANARY} failed (WorkerTimeout: no outcome within 600s); 1 failed > budget 0; "
    "rolling 1 workers back to v1"
)
_CONFLICT = "selector overlaps CheckpointRollout older (older); no pod is driven by two rollouts"
_NEXT_WAVE = [(N, R.WAVE_STARTED, _WAVE_2)]
_CANARY_DONE = [(Measure.WORKERS, 1, UPDATED), (SECONDS, 60, "")]

# Keyed by CASES id: user-facing text is part of the contract.
TOLD: dict[str, Told] = {
    "first-rollout-asks-the-canary-what-it-serves": Told(
        [(N, R.ROLLOUT_STARTED, _STARTED)], _STARTED, RolloutReason.ROLLOUT_STARTED
    ),
    "the-probed-version-is-previous-and-the-canary-is-called": Told(
        [(N, R.WAVE_STARTED, f"wave 1/2: 1 pods: {CANARY}")], "wave 1/2: 1 pods", RolloutReason.WAVE_STARTED
    ),
    "a-pushed-success-completes-the-canary-and-starts-the-rest": Told(
        [(N, R.WAVE_COMPLETED, "wave 1/2 completed: 1 updated"), *_NEXT_WAVE],
        "wave 2/2: 3 pods",
        RolloutReason.WAVE_STARTED,
        _CANARY_DONE,
    ),
    "a-worker-past-its-timeout-fails-and-the-rollout-rolls-back": Told(
        [
            (W, R.WORKER_FAILED, f"{CANARY}: WorkerTimeout: no outcome within 600s"),
            (W, R.ROLLBACK_STARTED, _TIMED_OUT),
        ],
        _TIMED_OUT,
        WorkerReason.WORKER_TIMEOUT,
        [(Measure.WORKERS, 1, FAILED)],
    ),
    "a-member-timed-out-fails-and-the-next-is-still-watched": Told(
        [(W, R.WORKER_FAILED, f"{ORDER[0]}: WorkerTimeout: no outcome within 600s")],
        None,
        None,
        [(Measure.WORKERS, 1, FAILED)],
    ),
    "a-failure-over-budget-with-halt-fails": Told(
        [(W, R.WORKER_FAILED, _CANARY_FAILED), (W, R.ROLLOUT_FAILED, _OVER_BUDGET)],
        _OVER_BUDGET,
        "ChecksumMismatch",
        [(Measure.WORKERS, 1, FAILED), (Measure.ROLLOUT_SECONDS, 60, Phase.FAILED)],
    ),
    "a-failure-within-budget-goes-on": Told(
        [
            (W, R.WORKER_FAILED, _CANARY_FAILED),
            (N, R.WAVE_COMPLETED, "wave 1/2 completed: 0 updated, 1 failed (within budget 1)"),
            *_NEXT_WAVE,
        ],
        "wave 2/2: 3 pods",
        RolloutReason.WAVE_STARTED,
        [(Measure.WORKERS, 1, FAILED), (Measure.WORKERS, 0, UPDATED), (SECONDS, 60, "")],
    ),
    "a-percent-failure-budget-is-a-share-of-the-fleet": Told(
        [
            (W, R.WORKER_FAILED, _CANARY_FAILED),
            (N, R.WAVE_COMPLETED, "wave 1/2 completed: 0 updated, 1 failed (within budget 2)"),
            *_NEXT_WAVE,
        ],
        "wave 2/2: 3 pods",
        RolloutReason.WAVE_STARTED,
        [(Measure.WORKERS, 1, FAILED), (Measure.WORKERS, 0, UPDATED), (SECONDS, 60, "")],
    ),
    # No failure of its own to name: the one the shrunk budget no longer covers was earlier.
    "a-fleet-shrunk-below-its-failure-budget-fails-when-the-next-wave-ends": Told(
        [(W, R.ROLLOUT_FAILED, "wave 2: worker ? failed (WorkerFailed: ); 1 failed > budget 0")],
        "wave 2: worker ? failed (WorkerFailed: ); 1 failed > budget 0",
        RolloutReason.WORKER_FAILED,
        [(Measure.ROLLOUT_SECONDS, 60, Phase.FAILED)],
    ),
    "each-new-failure-in-a-wave-is-announced-once": Told(
        [
            (W, R.WORKER_FAILED, f"{PODS[2]}: ChecksumMismatch: ChecksumMismatch v2"),
            (W, R.WORKER_FAILED, f"{PODS[3]}: LoadFailed: "),
        ],
        None,
        None,
        [(Measure.WORKERS, 1, FAILED), (Measure.WORKERS, 1, FAILED)],
    ),
    "pause-after-a-wave-waits-for-promote": Told(
        [
            (N, R.WAVE_COMPLETED, "wave 1/3 completed: 1 updated"),
            (N, R.PAUSED, "paused after wave 1 for promote"),
        ],
        "paused after wave 1 for promote",
        RolloutReason.ROLLOUT_PAUSED,
        _CANARY_DONE,
    ),
    "a-timed-pause-begins-after-its-wave-and-wakes-when-it-ends": Told(
        [
            (N, R.WAVE_COMPLETED, "wave 1/2 completed: 1 updated"),
            (N, R.PAUSED, "paused after wave 1 for 30s"),
        ],
        "paused after wave 1 for 30s",
        RolloutReason.ROLLOUT_PAUSED,
        _CANARY_DONE,
    ),
    "a-timed-pause-that-has-run-its-time-resumes": Told(
        [(N, R.RESUMED, "resumed after 30s paused"), *_NEXT_WAVE],
        "wave 2/2: 3 pods",
        RolloutReason.WAVE_STARTED,
    ),
    "promote-resumes-with-the-paused-time-counted": Told(
        [(N, R.RESUMED, "resumed after 25s paused"), *_NEXT_WAVE],
        "wave 2/2: 3 pods",
        RolloutReason.WAVE_STARTED,
    ),
    "unpausing-a-running-wave-resumes-its-calls": Told(
        [(N, R.RESUMED, "resumed after 20s paused")],
        "resumed after 20s paused",
        RolloutReason.ROLLOUT_RESUMED,
    ),
    "spec-paused-holds-the-calls-of-a-running-wave": Told(
        [(N, R.PAUSED, "spec.paused is true")], "spec.paused is true", RolloutReason.ROLLOUT_PAUSED
    ),
    "spec-paused-between-waves-holds-the-next": Told(
        [(N, R.PAUSED, "spec.paused is true")], "spec.paused is true", RolloutReason.ROLLOUT_PAUSED
    ),
    # Already paused: no new pause verdict, so the wave's own news stays the message.
    "a-wave-that-ends-while-spec-paused-completes-and-the-rollout-stays-paused": Told(
        [(N, R.WAVE_COMPLETED, "wave 1/2 completed: 1 updated")],
        "wave 1/2 completed: 1 updated",
        None,
        _CANARY_DONE,
    ),
    "a-wave-of-5-is-announced-with-every-member": Told(
        [(N, R.WAVE_STARTED, f"wave 1/2: 5 pods: {', '.join(BIG_ORDER[:5])}")],
        "wave 1/2: 5 pods",
        RolloutReason.WAVE_STARTED,
    ),
    "a-wave-of-6-is-announced-with-its-first-five-members": Told(
        [(N, R.WAVE_STARTED, f"wave 1/2: 6 pods: {', '.join(BIG_ORDER[:5])}, ...")],
        "wave 1/2: 6 pods",
        RolloutReason.WAVE_STARTED,
    ),
    "pulled-outcomes-heard-complete-the-wave-without-being-written-first": Told(
        [
            (N, R.WAVE_COMPLETED, "wave 1/1 completed: 4 updated"),
            (N, R.ROLLOUT_COMPLETED, "v2 is live on 4 pods"),
        ],
        "v2 is live on 4 pods",
        RolloutReason.ROLLOUT_COMPLETED,
        [(Measure.WORKERS, 4, UPDATED), (SECONDS, 60, ""), (Measure.ROLLOUT_SECONDS, 60, Phase.SUCCEEDED)],
    ),
    "pods-that-joined-during-the-rollout-get-a-drift-wave": Told(
        [(N, R.WAVE_STARTED, "1 pods joined during the rollout: bringing them to v2")],
        "1 pods joined during the rollout: bringing them to v2",
        RolloutReason.WAVE_STARTED,
    ),
    "a-drift-wave-done-succeeds-again": Told(
        [
            (N, R.WAVE_COMPLETED, "Drift wave completed: 1 updated"),
            (N, R.ROLLOUT_COMPLETED, "v2 is live on 4 pods"),
        ],
        "v2 is live on 4 pods",
        RolloutReason.ROLLOUT_COMPLETED,
        [*_CANARY_DONE, (Measure.ROLLOUT_SECONDS, 60, Phase.SUCCEEDED)],
    ),
    "after-the-catch-up-the-spec-waves-start-from-the-first-which-it-may-already-cover": Told(
        [
            (N, R.WAVE_COMPLETED, "CatchUp wave completed: 1 updated"),
            (N, R.WAVE_STARTED, "wave 1/2: 0 pods: "),
            (N, R.WAVE_COMPLETED, "wave 1/2 completed: 0 updated"),
            *_NEXT_WAVE,
        ],
        "wave 2/2: 3 pods",
        RolloutReason.WAVE_STARTED,
        [*_CANARY_DONE, (Measure.WORKERS, 0, UPDATED), (SECONDS, 0, "")],
    ),
    "the-last-wave-done-succeeds": Told(
        [(N, R.ROLLOUT_COMPLETED, "v2 is live on 4 pods")],
        "v2 is live on 4 pods",
        RolloutReason.ROLLOUT_COMPLETED,
        [(Measure.ROLLOUT_SECONDS, 60, Phase.SUCCEEDED)],
    ),
    "a-pod-after-success-is-brought-to-the-stable-version": Told(
        [
            (N, R.DRIFT_CORRECTION, "1 new pods: bringing them to v2"),
            (N, R.WAVE_STARTED, "1 pods appeared after the rollout: bringing them to v2"),
        ],
        "1 pods appeared after the rollout: bringing them to v2",
        RolloutReason.WAVE_STARTED,
    ),
    "a-new-version-mid-rollout-supersedes-and-catches-up-the-called-pods-first": Told(
        [
            (N, R.SUPERSEDED, f"v1b superseded by v2; {_STARTED}"),
            (N, R.ROLLOUT_STARTED, f"v1b superseded by v2; {_STARTED}"),
        ],
        f"v1b superseded by v2; {_STARTED}",
        RolloutReason.ROLLOUT_STARTED,
    ),
    "retry-after-a-rollback-rolls-the-same-version-out-again": Told(
        [
            (N, R.ROLLOUT_STARTED, f"retrying after RolledBack: {_STARTED}"),
            (N, R.WAVE_STARTED, f"wave 1/2: 1 pods: {CANARY}"),
        ],
        "wave 1/2: 1 pods",
        RolloutReason.WAVE_STARTED,
    ),
    "abort-rolls-the-called-pods-back": Told(
        [(W, R.ROLLBACK_STARTED, "aborted by user; rolling 4 workers back to v1")],
        "aborted by user; rolling 4 workers back to v1",
        RolloutReason.ABORTED,
    ),
    "abort-with-no-previous-version-fails-saying-so": Told(
        [
            (
                W,
                R.ROLLOUT_FAILED,
                "aborted by user; no previous version is known, so nothing can be rolled back",
            )
        ],
        "aborted by user; no previous version is known, so nothing can be rolled back",
        RolloutReason.ABORTED,
    ),
    "a-rollback-done-is-rolled-back": Told(
        [(W, R.ROLLED_BACK, "rolled 1 workers back to v1 (Aborted)")],
        "rolled 1 workers back to v1 (Aborted)",
        RolloutReason.ABORTED,
        [(Measure.WORKERS, 1, ROLLED_BACK), (Measure.ROLLOUT_SECONDS, 60, Phase.ROLLED_BACK)],
    ),
    "a-rollback-that-fails-is-reported": Told(
        [
            (W, R.WORKER_FAILED, f"{CANARY}: AgentUnreachable: AgentUnreachable v1"),
            (W, R.ROLLBACK_FAILED, f"rollback to v1 failed on 1 workers: {CANARY}"),
        ],
        f"rollback to v1 failed on 1 workers: {CANARY}",
        RolloutReason.ROLLBACK_FAILED,
        [
            (Measure.WORKERS, 1, FAILED),
            (Measure.WORKERS, 0, ROLLED_BACK),
            (Measure.ROLLOUT_SECONDS, 60, Phase.FAILED),
        ],
    ),
    "a-rollback-failing-on-many-workers-names-the-first-ten": Told(
        [(W, R.ROLLBACK_FAILED, f"rollback to v1 failed on 12 workers: {', '.join(BIG[:10])}")],
        f"rollback to v1 failed on 12 workers: {', '.join(BIG[:10])}",
        RolloutReason.ROLLBACK_FAILED,
        [(Measure.WORKERS, 0, ROLLED_BACK), (Measure.ROLLOUT_SECONDS, 60, Phase.FAILED)],
    ),
    "the-progress-deadline-fails-the-rollout": Told(
        [(W, R.ROLLOUT_FAILED, "no completion within 90s (paused time excluded)")],
        "no completion within 90s (paused time excluded)",
        RolloutReason.PROGRESS_DEADLINE_EXCEEDED,
        [(Measure.ROLLOUT_SECONDS, 100, Phase.FAILED)],
    ),
    "no-matching-pod-waits-for-one": Told(
        [(N, R.ROLLOUT_STARTED, "rolling out v2 to 0 pods in 2 waves")],
        "no Running pod with an IP matches the selector",
        RolloutReason.NO_WORKERS,
    ),
    "an-older-overlapping-rollout-stalls-this-one": Told(
        [(W, R.SELECTOR_CONFLICT, _CONFLICT)], _CONFLICT, RolloutReason.SELECTOR_CONFLICT
    ),
    "the-older-overlapping-rollout-is-found-past-itself-and-newer-and-unreadable-peers": Told(
        [(W, R.SELECTOR_CONFLICT, _CONFLICT)], _CONFLICT, RolloutReason.SELECTOR_CONFLICT
    ),
    "a-supersede-catches-up-only-the-called-pods-still-here-and-restarts-the-clocks": Told(
        [
            (N, R.SUPERSEDED, "v1b superseded by v2; rolling out v2 to 3 pods in 2 waves"),
            (N, R.ROLLOUT_STARTED, "v1b superseded by v2; rolling out v2 to 3 pods in 2 waves"),
        ],
        "v1b superseded by v2; rolling out v2 to 3 pods in 2 waves",
        RolloutReason.ROLLOUT_STARTED,
    ),
}
CASES_BY_ID = {c.id: c for c in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_decide(case: Case) -> None:
    assert classify(Draft(case.rollout, case.memory, TUNING, NOW)) is case.state
    plan = decide(case.rollout, case.memory, case.tuning, NOW)
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
    rollout = CASES_BY_ID["a-pushed-success-completes-the-canary-and-starts-the-rest"].rollout
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


@pytest.mark.parametrize("case_id", TOLD)
def test_what_a_step_tells(case_id: str) -> None:
    case, told = CASES_BY_ID[case_id], TOLD[case_id]
    plan = decide(case.rollout, case.memory, case.tuning, NOW)
    assert [(e.type, e.reason, e.message) for e in plan.events] == told.events
    assert plan.status.message == told.message
    conditions = plan.status.conditions
    if told.reason is None:
        assert conditions == []
    else:
        assert {(c.reason, c.message) for c in conditions if c.type == ConditionType.READY} == {
            (told.reason, told.message)
        }
        assert {(c.message, c.observed_generation) for c in conditions} == {(told.message, 3)}
    assert [(m.measure, m.value, m.label) for m in plan.metrics] == list(told.metrics)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_every_step_comes_to_rest(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step chains transitions while they plan no I/O and ends on one that says stop, never
    on the chain's bound (there it would stop short, mid-chain, waiting for nothing)."""
    goes_on: list[bool] = []

    def recorded(transition: Callable[[Draft], bool]) -> Callable[[Draft], bool]:
        def run(d: Draft) -> bool:
            goes_on.append(transition(d))
            return goes_on[-1]

        return run

    for state, transition in list(machine.TRANSITIONS.items()):
        monkeypatch.setitem(machine.TRANSITIONS, state, recorded(transition))
    decide(case.rollout, case.memory, case.tuning, NOW)
    assert goes_on[-1] is False
    assert len(goes_on) < machine._MAX_TRANSITIONS


@pytest.mark.parametrize(
    ("paused_seconds", "paused_ago", "remaining"),
    [
        (None, None, 1700),  # started 100 s ago, 1800 s allowed
        (15, None, 1715),  # paused before
        (None, 10, 1710),  # paused now, for 10 s so far
        (15, 10, 1725),  # both
    ],
)
def test_the_deadline_counts_no_paused_time(
    paused_seconds: float | None, paused_ago: float | None, remaining: float
) -> None:
    status = _progressing(
        startedAt=rfc3339(NOW.wall - 100),
        pausedSeconds=paused_seconds,
        pausedAt=None if paused_ago is None else rfc3339(NOW.wall - paused_ago),
    )
    assert deadline_remaining(Draft(_rollout(status), Memory(), TUNING, NOW)) == remaining


def test_a_failure_entry_is_stamped_and_keeps_1000_characters_of_message() -> None:
    entry = failure_entry("v2", 1, WorkerReason.AGENT_UNREACHABLE, "x" * 1500, STAMP)
    assert (
        entry.version,
        entry.phase,
        entry.reason,
        entry.message,
        entry.last_transition_time,
        entry.wave,
    ) == (
        "v2",
        WorkerPhase.FAILED,
        WorkerReason.AGENT_UNREACHABLE,
        "x" * 1000,
        STAMP,
        1,
    )


def test_removing_worker_entries_ignores_those_not_there() -> None:
    d = Draft(_rollout(_progressing(workers={CANARY: _entry("v2", "Failed")})), Memory(), TUNING, NOW)
    d.set_workers({"gone": None, CANARY: None})
    assert d.status.workers == {}
