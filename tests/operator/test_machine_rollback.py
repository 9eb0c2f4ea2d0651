"""decide(), abort and rollback: who is rolled back, to what, and how a rollback ends.
One row per situation, with the plan it must produce."""

from __future__ import annotations

from machine_kit import (
    BIG,
    CANARY,
    EARLIER,
    NOW,
    PODS,
    REST,
    STAMP,
    TUNING,
    Case,
    called_now,
    condition,
    done,
    entry,
    progressing,
    rollout,
    table_tests,
    wave,
)

from ckpt_api.vocabulary import (
    ABORT_ANNOTATION,
    ConditionType,
    EventReason,
    Phase,
    RolloutReason,
    WavePhase,
)
from ckpt_rollout.domain.machine import State
from ckpt_rollout.domain.world import Memory, rfc3339

HOUR_AGO = rfc3339(NOW.wall - 3600)

CASES = [
    Case(
        "abort-rolls-the-called-pods-back",
        rollout(progressing(done(0, [CANARY]), wave(1, REST)), annotations={ABORT_ANNOTATION: "v2"}),
        State.ABORT,
        Phase.ROLLING_BACK,
        cancels=[(p, "v2") for p in REST],
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
        "aborting-a-paused-rollout-ends-its-pause",
        rollout(
            progressing(done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 20), pausedSeconds=5),
            spec={"strategy": {"pauseAfterWave": [0]}},
            annotations={ABORT_ANNOTATION: "v2"},
        ),
        State.ABORT,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (p.status.paused_at, p.status.paused_seconds, condition(p, ConditionType.PAUSED)),
        observed=(None, 25, ("False", RolloutReason.ABORTED)),
    ),
    Case(
        "abort-with-no-previous-version-fails-saying-so",
        rollout(
            {**progressing(wave(0, [CANARY])), "previousVersion": None},
            annotations={ABORT_ANNOTATION: "v2"},
        ),
        State.ABORT,
        Phase.FAILED,
        cancels=[(CANARY, "v2")],
        events=[EventReason.ROLLOUT_FAILED],
        observe=lambda p: (p.status.completed_at, condition(p, ConditionType.FAILED)),
        observed=(STAMP, ("True", RolloutReason.ABORTED)),
    ),
    Case(
        "the-clis-abort-names-the-rollout-by-its-start",
        rollout(
            progressing(done(0, [CANARY]), wave(1, REST)), annotations={ABORT_ANNOTATION: f"{EARLIER}@v2"}
        ),
        State.ABORT,
        Phase.ROLLING_BACK,
        cancels=[(p, "v2") for p in REST],
        calls=sorted(PODS),
        events=[EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
    ),
    *(
        Case(
            id_,
            rollout(
                progressing(done(0, [CANARY]), wave(1, REST), abortAtStart=at_start),
                annotations={ABORT_ANNOTATION: value},
            ),
            State.ADVANCE,
            Phase.PROGRESSING,
            wake=TUNING.pull_after_s,
            memory=called_now(*REST),
        )
        for id_, value, at_start in [
            ("an-abort-of-an-earlier-rollout-of-the-version-aborts-nothing", f"{HOUR_AGO}@v2", None),
            ("an-abort-naming-another-version-aborts-nothing", f"{EARLIER}@v1", None),
            ("a-bare-abort-found-at-the-start-aborts-nothing", "v2", "v2"),
        ]
    ),
    Case(
        "a-version-rolled-out-again-after-its-abort-starts-afresh",
        rollout(
            {
                "phase": "RolledBack",
                "targetVersion": "v3",
                "previousVersion": "v1",
                "startedAt": HOUR_AGO,
                "waves": [done(0, [CANARY])],
                "rollback": {"version": "v1", "reason": "Aborted", "pods": [CANARY], "phase": "Completed"},
            },
            annotations={ABORT_ANNOTATION: "v2"},  # v2 was aborted before v3
        ),
        State.START,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.ROLLOUT_STARTED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (p.status.abort_at_start, p.status.rollback),
        observed=("v2", None),
    ),
    Case(
        "a-rollback-done-is-rolled-back",
        rollout(
            progressing(
                wave(0, [CANARY]),
                phase="RollingBack",
                rollback={"version": "v1", "reason": "Aborted", "pods": [CANARY], "called": [CANARY]},
                workers={CANARY: entry("v1", "Updated")},
            )
        ),
        State.ROLLING_BACK,
        Phase.ROLLED_BACK,
        events=[EventReason.ROLLED_BACK],
        observe=lambda p: (
            p.status.rollback and (p.status.rollback.phase, p.status.rollback.completed_at),
            p.status.completed_at,
            condition(p, ConditionType.STALLED),
        ),
        observed=((WavePhase.COMPLETED, STAMP), STAMP, ("True", RolloutReason.ABORTED)),
    ),
    Case(
        "a-rollback-that-fails-is-reported",
        rollout(
            progressing(
                wave(0, [CANARY]),
                phase="RollingBack",
                rollback={"version": "v1", "reason": "Aborted", "pods": [CANARY], "called": [CANARY]},
                workers={CANARY: entry("v1", "Failed", "AgentUnreachable")},
            )
        ),
        State.ROLLING_BACK,
        Phase.FAILED,
        events=[EventReason.WORKER_FAILED, EventReason.ROLLBACK_FAILED],
        observe=lambda p: condition(p, ConditionType.FAILED),
        observed=("True", RolloutReason.ROLLBACK_FAILED),
    ),
    Case(
        "a-rollback-failing-on-many-workers-names-the-first-ten",
        rollout(
            progressing(
                wave(0, BIG),
                phase="RollingBack",
                rollback={"version": "v1", "reason": "Aborted", "pods": BIG, "called": BIG},
                workers={n: entry("v1", "Failed", "AgentUnreachable") for n in BIG},
            ),
            pods=BIG,
            spec={"strategy": {"waves": ["100%"]}},
        ),
        State.ROLLING_BACK,
        Phase.FAILED,
        events=[EventReason.ROLLBACK_FAILED],
        memory=Memory(announced={f"{n}/v1" for n in BIG}),
    ),
]


test_decide, test_every_step_comes_to_rest = table_tests(CASES)
