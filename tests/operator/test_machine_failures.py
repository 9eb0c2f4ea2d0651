"""decide(), worker failures and budgets: timeouts, the failure budget (counts, percents, a shrunk
fleet), which failure the message names, Halt (ending a pause), announcing each failure once;
and the progress deadline.
One row per situation, with the plan it must produce."""

from __future__ import annotations

import pytest
from machine_kit import (
    CANARY,
    DIGEST,
    EARLIER,
    NOW,
    ORDER,
    PODS,
    REST,
    STAMP,
    TUNING,
    Case,
    called_long_ago,
    called_now,
    condition,
    done,
    entry,
    progressing,
    rollout,
    table_tests,
    wave,
    wave_rows,
    worker_row,
)

from ckpt_api.vocabulary import (
    ConditionType,
    EventReason,
    Phase,
    RolloutReason,
    WavePhase,
    WorkerPhase,
    WorkerReason,
)
from ckpt_rollout.domain.drive import failure_entry
from ckpt_rollout.domain.machine import State, deadline_remaining, decide
from ckpt_rollout.domain.plan import Draft
from ckpt_rollout.domain.world import Memory, Tuning, rfc3339

ONE_OF_REST_FAILED = {
    REST[0]: entry("v2", "Failed", "ChecksumMismatch"),
    REST[1]: entry("v2", "Updated"),
    REST[2]: entry("v2", "Updated"),
}

CASES = [
    Case(
        "a-worker-past-its-timeout-fails-and-the-rollout-rolls-back",
        rollout(progressing(wave(0, [CANARY])), spec={"source": {"manifestDigest": DIGEST}}),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        cancels=[(CANARY, "v2")],
        calls=[CANARY],  # it may have loaded v2 after all: it is rolled back too
        events=[EventReason.WORKER_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=called_long_ago(CANARY),
        # The rollback's call asks for v1, with no pin (the digest pins spec.version).
        observe=lambda p: (
            worker_row(p, CANARY),
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
        rollout(progressing(wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[CANARY],
        wake=0,
        memory=Memory(call_times={CANARY: NOW.mono - 600}),
    ),
    Case(
        "a-worker-about-to-time-out-is-looked-at-when-it-does",
        rollout(progressing(wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=1,  # before its next pull is due
        memory=Memory(call_times={CANARY: NOW.mono - 599}, last_pull={CANARY: NOW.mono}),
    ),
    Case(
        "a-member-timed-out-fails-and-the-next-is-still-watched",
        rollout(
            progressing(wave(0, ORDER[:2])),
            spec={"strategy": {"waves": [2, "100%"]}, "failurePolicy": {"maxFailures": 1}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        cancels=[(CANARY, "v2")],
        events=[EventReason.WORKER_FAILED],
        wake=TUNING.pull_after_s,
        memory=Memory(call_times={ORDER[0]: NOW.mono - 10_000, ORDER[1]: NOW.mono}),
        observe=lambda p: sorted(p.status.workers),
        observed=[ORDER[0]],
    ),
    Case(
        "a-failure-over-budget-with-halt-fails",
        rollout(
            progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Failed", "ChecksumMismatch")}),
            spec={"failurePolicy": {"onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.WORKER_FAILED, EventReason.ROLLOUT_FAILED],
        observe=lambda p: (
            condition(p, ConditionType.FAILED),
            (p.status.waves[0].phase, p.status.waves[0].failed, p.status.waves[0].completed_at),
            p.status.completed_at,
            p.status.failed_replicas,
        ),
        observed=(("True", "ChecksumMismatch"), (WavePhase.FAILED, 1, STAMP), STAMP, 1),
    ),
    # (A canary that failed within the budget is followed by another: test_machine_departures.)
    Case(
        "a-failure-within-budget-goes-on",
        rollout(
            progressing(done(0, [CANARY]), wave(1, REST), workers=ONE_OF_REST_FAILED),
            spec={"failurePolicy": {"maxFailures": 1}},
        ),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.WORKER_FAILED, EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
        observe=lambda p: (
            sorted(p.status.workers),  # failures stay listed
            [(w.phase, w.updated, w.failed, w.gone, w.completed_at) for w in p.status.waves[1:]],
        ),
        observed=([REST[0]], [(WavePhase.COMPLETED, 2, 1, 0, STAMP)]),
    ),
    Case(
        "a-percent-failure-budget-is-a-share-of-the-fleet",
        rollout(
            progressing(done(0, [CANARY]), wave(1, REST), workers=ONE_OF_REST_FAILED),
            spec={"failurePolicy": {"maxFailures": "50%"}},
        ),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.WORKER_FAILED, EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
    ),
    Case(
        "a-fleet-shrunk-below-its-failure-budget-fails-when-the-next-wave-ends",
        rollout(
            progressing(
                wave(0, [CANARY], phase="Completed", failed=1, completedAt=EARLIER),
                wave(1, REST),
                workers={
                    CANARY: entry("v2", "Failed", "ChecksumMismatch"),
                    REST[0]: entry("v2", "Updated"),
                    REST[1]: entry("v2", "Updated"),
                },
            ),
            pods=[CANARY, *REST[:2]],  # 25% of 4 pods tolerated the canary's failure; of 3, none
            spec={"failurePolicy": {"maxFailures": "25%", "onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.ROLLOUT_FAILED],
        observe=lambda p: (wave_rows(p)[1][1], p.status.waves[1].failed, condition(p, ConditionType.FAILED)),
        observed=(WavePhase.FAILED, 0, ("True", "ChecksumMismatch")),  # the earlier failure's reason
    ),
    Case(
        "an-over-budget-failure-is-named-by-its-own-wave-not-an-earlier-one",
        rollout(
            progressing(
                wave(0, [CANARY], phase="Completed", failed=1, completedAt=EARLIER),
                wave(1, REST),
                workers={
                    CANARY: entry("v2", "Failed", "ChecksumMismatch"),
                    REST[0]: entry("v2", "Updated"),
                    REST[1]: entry("v2", "Failed", "LoadFailed"),
                    REST[2]: entry("v2", "Updated"),
                },
            ),
            spec={"failurePolicy": {"maxFailures": 1, "onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.WORKER_FAILED, EventReason.ROLLOUT_FAILED],
        memory=Memory(announced={f"{CANARY}/v2"}),
        observe=lambda p: condition(p, ConditionType.FAILED),
        observed=("True", "LoadFailed"),
    ),
    Case(
        "an-over-budget-failure-without-a-message-is-named-by-its-reason",
        rollout(
            progressing(
                wave(0, [CANARY]),
                workers={CANARY: {"version": "v2", "phase": "Failed", "reason": "LoadFailed"}},
            ),
            spec={"failurePolicy": {"onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.WORKER_FAILED, EventReason.ROLLOUT_FAILED],
    ),
    Case(
        "a-failure-over-budget-while-spec-paused-ends-the-pause",
        rollout(
            progressing(
                wave(0, [CANARY]),
                phase="Paused",
                pausedAt=rfc3339(NOW.wall - 20),
                workers={CANARY: entry("v2", "Failed", "ChecksumMismatch")},
            ),
            spec={"paused": True, "failurePolicy": {"onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.WORKER_FAILED, EventReason.ROLLOUT_FAILED],
        observe=lambda p: (p.status.paused_at, p.status.paused_seconds),
        observed=(None, 20),
    ),
    Case(
        "each-new-failure-in-a-wave-is-announced-once",
        rollout(
            progressing(
                wave(0, PODS),
                workers={
                    PODS[1]: entry("v2", "Failed", "ChecksumMismatch"),
                    PODS[2]: entry("v2", "Failed", "ChecksumMismatch"),
                    PODS[3]: {"version": "v2", "phase": "Failed", "reason": "LoadFailed"},
                },
            ),
            spec={"strategy": {"waves": ["100%"]}, "failurePolicy": {"maxFailures": 3}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        events=[EventReason.WORKER_FAILED, EventReason.WORKER_FAILED],  # not PODS[1]'s again
        wake=TUNING.pull_after_s,
        memory=called_now(PODS[0], announced={f"{PODS[1]}/v2"}),
    ),
    Case(
        "a-long-failure-message-is-cut-to-fit-an-event",
        rollout(
            progressing(
                wave(0, [CANARY]),
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
        rollout(
            progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Failed", "ChecksumMismatch")}),
            spec={"failurePolicy": {"onFailure": "Halt"}},
        ),
        State.ADVANCE,
        Phase.FAILED,
        events=[EventReason.ROLLOUT_FAILED],
        memory=Memory(announced={f"{CANARY}/v2"}),
    ),
    Case(
        "the-progress-deadline-fails-the-rollout",
        rollout(
            progressing(wave(0, [CANARY]), startedAt=rfc3339(NOW.wall - 100)),
            spec={
                "timeouts": {"progressDeadlineSeconds": 90, "workerSeconds": 60},
                "failurePolicy": {"onFailure": "Halt"},
            },
        ),
        State.DEADLINE,
        Phase.FAILED,
        cancels=[(CANARY, "v2")],
        events=[EventReason.ROLLOUT_FAILED],
        observe=lambda p: condition(p, ConditionType.FAILED),
        observed=("True", RolloutReason.PROGRESS_DEADLINE_EXCEEDED),
    ),
    Case(
        "at-its-deadline-a-rollout-is-not-yet-failed",
        rollout(progressing(wave(0, [CANARY]), startedAt=rfc3339(NOW.wall - 1800))),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=1,  # a second later it is
        memory=called_now(CANARY),
    ),
]


test_decide, test_every_step_comes_to_rest = table_tests(CASES)


def test_the_deadline_excludes_paused_time_and_sets_a_timer() -> None:
    given = rollout(
        progressing(wave(0, [CANARY]), startedAt=rfc3339(NOW.wall - 100), pausedSeconds=50),
        spec={"timeouts": {"progressDeadlineSeconds": 90, "workerSeconds": 60}},
    )
    slow_pulls = Tuning(pull_after_s=1000)
    plan = decide(given, called_now(CANARY), slow_pulls, NOW)
    assert plan.status.phase is Phase.PROGRESSING
    assert plan.wake_after == pytest.approx(41)  # 40 s left, looked at a second after


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
    status = progressing(
        startedAt=rfc3339(NOW.wall - 100),
        pausedSeconds=paused_seconds,
        pausedAt=None if paused_ago is None else rfc3339(NOW.wall - paused_ago),
    )
    assert deadline_remaining(Draft(rollout(status), Memory(), TUNING, NOW)) == remaining


def test_a_failure_entry_is_stamped_and_its_message_cut_like_every_entry() -> None:
    failed = failure_entry("v2", 1, WorkerReason.AGENT_UNREACHABLE, "x" * 1500, STAMP)
    assert (
        failed.version,
        failed.phase,
        failed.reason,
        failed.message,
        failed.last_transition_time,
        failed.wave,
    ) == (
        "v2",
        WorkerPhase.FAILED,
        WorkerReason.AGENT_UNREACHABLE,
        "x" * 1021 + "...",
        STAMP,
        1,
    )
