"""decide(), members that leave mid-wave (deleted, evicted, rescheduled): a departed member is
gone, never failed, whatever its agent said while it shut down; a spec wave gives its place to a
pod no wave has taken; a wave that brought nobody to a version no wave has proven never completes.
One row per situation, with the plan it must produce."""

from __future__ import annotations

from typing import Any

from machine_kit import (
    CANARY,
    DEADLINE_WAKE,
    NOW,
    ORDER,
    REST,
    TUNING,
    Case,
    called_now,
    done,
    entry,
    progressing,
    rollout,
    table_tests,
    wave,
    wave_rows,
)

from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import EventReason, Phase, WaveKind, WavePhase, WorkerPhase
from ckpt_rollout.domain.machine import State
from ckpt_rollout.domain.plan import Plan
from ckpt_rollout.domain.world import Memory

JOINED = "p9"  # a pod that came after the rollout planned its waves (a Deployment's replacement)
SHUTDOWN = {
    "version": "v2",
    "phase": "Failed",
    "reason": "Cancelled",
    "message": "load cancelled: the agent is shutting down",
}


def without(*gone: str, joined: tuple[str, ...] = ()) -> list[str]:
    """The fleet with ``gone`` deleted and ``joined`` added."""
    return [*(p for p in ORDER if p not in gone), *joined]


def membership(plan: Plan, index: int = 0) -> tuple[list[str], list[str], list[str]]:
    w = plan.status.waves[index]
    return w.pods, w.called, w.replaced


def said(plan: Plan) -> tuple[str | None, list[str]]:
    return plan.status.message, [e.message for e in plan.events]


def counts(plan: Plan, index: int) -> tuple[WavePhase, int, int, int]:
    w = plan.status.waves[index]
    return w.phase, w.updated, w.failed, w.gone


def catch_up(pods: list[str]) -> dict[str, Any]:
    return {**wave(0, pods), "kind": "CatchUp", "specIndex": None}


_REPLACES = f"wave 1/2: {ORDER[1]} replaces {CANARY} (gone before loading v2)"

CASES = [
    Case(
        "a-canary-gone-before-loading-gives-its-place-to-the-next-pod",
        rollout(progressing(wave(0, [CANARY])), pods=without(CANARY)),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[ORDER[1]],
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=called_now(CANARY),
        observe=lambda p: (membership(p), said(p), counts(p, 0)),
        observed=(
            ([ORDER[1]], [CANARY, ORDER[1]], [CANARY]),
            (_REPLACES, [_REPLACES]),
            (WavePhase.RUNNING, 0, 0, 0),
        ),
    ),
    Case(
        "a-canary-deleted-while-its-agent-reported-the-load-cancelled-is-replaced-not-failed",
        rollout(progressing(wave(0, [CANARY]), workers={CANARY: SHUTDOWN}), pods=without(CANARY)),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[ORDER[1]],
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=called_now(CANARY),
        # What it said while it shut down goes with it.
        observe=lambda p: (membership(p), p.status.workers, p.status.failed_replicas),
        observed=(([ORDER[1]], [CANARY, ORDER[1]], [CANARY]), {}, 0),
    ),
    Case(
        "a-load-cancelled-on-a-pod-still-selected-is-pulled-not-failed",
        rollout(progressing(wave(0, [CANARY]), workers={CANARY: SHUTDOWN})),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[CANARY],
        wake=TUNING.pull_every_s,
        memory=Memory(call_times={CANARY: NOW.mono - TUNING.pull_after_s - 1}),
        observe=lambda p: (p.status.failed_replicas, wave_rows(p)[0][1]),
        observed=(0, WavePhase.RUNNING),
    ),
    Case(
        "a-restarted-agents-pulled-success-replaces-the-load-it-cancelled",
        rollout(progressing(wave(0, [CANARY]), workers={CANARY: SHUTDOWN})),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=called_now(CANARY, heard={CANARY: WorkerStatus(version="v2", phase=WorkerPhase.UPDATED)}),
        observe=lambda p: counts(p, 0),
        observed=(WavePhase.COMPLETED, 1, 0, 0),
    ),
    Case(
        "a-canary-gone-with-no-pod-left-waits-for-one-to-take-its-place",
        rollout(progressing(wave(0, [CANARY]), workers={CANARY: SHUTDOWN}), pods=[]),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=DEADLINE_WAKE - 60,
        memory=called_now(CANARY),
        observe=lambda p: (counts(p, 0), len(p.status.waves), p.status.message),
        observed=(
            (WavePhase.RUNNING, 0, 0, 0),
            1,
            f"wave 1/2: no pod has loaded v2 yet; waiting for a pod to take the place of {CANARY} (gone)",
        ),
    ),
    Case(
        "a-failed-canary-within-the-budget-is-followed-by-another-canary",
        rollout(
            progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Failed", "ChecksumMismatch")}),
            spec={"failurePolicy": {"maxFailures": 1}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[ORDER[1]],
        events=[EventReason.WORKER_FAILED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (membership(p), list(p.status.workers), p.status.message),
        observed=(
            ([CANARY, ORDER[1]], [CANARY, ORDER[1]], []),
            [CANARY],  # the failure stays listed
            f"wave 1/2: no pod has loaded v2 yet ({CANARY} failed); {ORDER[1]} tries it",
        ),
    ),
    Case(
        "a-failed-canary-with-no-other-pod-to-try-fails-the-rollout",
        rollout(
            progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Failed", "ChecksumMismatch")}),
            pods=[CANARY],
            spec={"failurePolicy": {"maxFailures": 1, "onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.WORKER_FAILED, EventReason.ROLLOUT_FAILED],
        observe=lambda p: (counts(p, 0), p.status.message),
        observed=(
            (WavePhase.FAILED, 0, 1, 0),
            f"wave 1/2: no pod loaded v2 ({CANARY} failed) and no other pod is left to try it",
        ),
    ),
    Case(
        "a-later-member-gone-gives-its-place-to-a-pod-that-joined",
        rollout(progressing(done(0, [CANARY]), wave(1, REST)), pods=without(REST[0], joined=(JOINED,))),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[JOINED],
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=called_now(*REST),
        observe=lambda p: membership(p, 1),
        observed=([JOINED, *REST[1:]], [*REST, JOINED], [REST[0]]),
    ),
    Case(
        "a-later-member-that-failed-as-its-pod-left-is-gone-not-failed",
        rollout(
            progressing(
                done(0, [CANARY]),
                wave(1, REST),
                workers={REST[0]: entry("v2", "Failed", "ChecksumMismatch")},
            ),
            pods=without(REST[0]),
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_after_s,
        memory=called_now(*REST),
        observe=lambda p: (p.status.failed_replicas, counts(p, 1)),
        observed=(0, (WavePhase.RUNNING, 0, 0, 0)),
    ),
    Case(
        "a-wave-short-of-a-member-with-no-pod-left-completes-saying-so",
        rollout(
            progressing(
                done(0, [CANARY]),
                wave(1, REST),
                workers={REST[0]: SHUTDOWN, REST[1]: entry("v2", "Updated"), REST[2]: entry("v2", "Updated")},
            ),
            pods=without(REST[0]),
        ),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
        observe=lambda p: (counts(p, 1), p.status.workers, p.events[0].message),
        observed=(
            (WavePhase.COMPLETED, 2, 0, 1),
            {},
            "wave 2/2 completed: 2 updated, 1 gone with no pod left to take their place",
        ),
    ),
    Case(
        "a-wave-counts-the-members-it-replaced-as-gone",
        rollout(
            progressing(
                done(0, [CANARY]),
                wave(1, [JOINED, *REST[1:]], called=[*REST, JOINED], replaced=[REST[0]]),
                workers={p: entry("v2", "Updated") for p in [JOINED, *REST[1:]]},
            ),
            pods=without(REST[0], joined=(JOINED,)),
        ),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
        observe=lambda p: (counts(p, 1), p.status.updated_replicas),
        observed=((WavePhase.COMPLETED, 3, 0, 1), 4),
    ),
    Case(
        "a-replaced-members-late-report-goes-with-it",
        rollout(
            progressing(
                done(0, [CANARY]),
                wave(1, [JOINED, *REST[1:]], called=[*REST, JOINED], replaced=[REST[0]]),
                workers={REST[0]: SHUTDOWN},
            ),
            pods=without(REST[0], joined=(JOINED,)),
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_after_s,
        memory=called_now(JOINED, *REST[1:]),
        observe=lambda p: p.status.workers,
        observed={},
    ),
    *(
        Case(
            f"after-success-a-departed-members-{what}",
            rollout(
                progressing(done(0, [CANARY]), done(1, REST), phase="Succeeded", workers={REST[0]: said_}),
                pods=without(REST[0]),
            ),
            State.DONE,
            Phase.SUCCEEDED,
            observe=lambda p: list(p.status.workers),
            observed=kept,
        )
        for what, said_, kept in [
            ("report-as-it-shut-down-goes-with-it", SHUTDOWN, []),
            (
                "failure-reported-before-it-left-stays-listed",
                entry("v2", "Failed", "ChecksumMismatch"),
                [REST[0]],
            ),
        ]
    ),
    Case(
        "once-a-wave-proved-the-version-a-later-wave-whose-members-all-left-completes",
        rollout(progressing(done(0, [CANARY]), wave(1, REST)), pods=[CANARY]),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
        memory=called_now(*REST),
        observe=lambda p: counts(p, 1),
        observed=(WavePhase.COMPLETED, 0, 0, 3),
    ),
    Case(
        "a-catch-up-wave-does-not-replace-its-departed-members",
        rollout(
            progressing(catch_up([CANARY]), supersededVersion="v1b"),
            pods=without(CANARY),
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[ORDER[1]],
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=called_now(CANARY),
        observe=lambda p: [(kind, phase, pods) for kind, phase, pods, _ in wave_rows(p)],
        observed=[
            (WaveKind.CATCH_UP, WavePhase.COMPLETED, [CANARY]),
            (WaveKind.SPEC, WavePhase.RUNNING, [ORDER[1]]),
        ],
    ),
    Case(
        "with-no-pod-left-at-all-empty-spec-waves-pass-through",
        rollout(progressing(catch_up([CANARY]), supersededVersion="v1b"), pods=[]),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[
            EventReason.WAVE_COMPLETED,
            EventReason.WAVE_STARTED,
            EventReason.WAVE_COMPLETED,
            EventReason.WAVE_STARTED,
            EventReason.WAVE_COMPLETED,
            EventReason.ROLLOUT_COMPLETED,
        ],
        memory=called_now(CANARY),
        observe=lambda p: [(w.pods, w.updated) for w in p.status.waves],
        observed=[([CANARY], 0), ([], 0), ([], 0)],
    ),
]


test_decide, test_every_step_comes_to_rest = table_tests(CASES)
