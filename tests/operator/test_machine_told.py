"""What a decide() step tells people: its events (for kubectl describe), status.message and
the conditions' reason and message, and its metrics, for the rows of the decide() tables that
say something. User-facing text is part of the contract."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pytest
from machine_kit import BIG, BIG_ORDER, CANARY, NOW, ORDER, PODS, REST
from test_machine_failures import CASES as FAILURE_CASES
from test_machine_pause import CASES as PAUSE_CASES
from test_machine_rollback import CASES as ROLLBACK_CASES
from test_machine_start import CASES as START_CASES
from test_machine_waves import CASES as WAVE_CASES

from ckpt_api.vocabulary import (
    ConditionType,
    EventReason,
    EventType,
    Phase,
    RolloutReason,
    WorkerReason,
    WorkerResult,
)
from ckpt_rollout.domain.machine import decide
from ckpt_rollout.domain.plan import Measure
from ckpt_rollout.domain.wording import counted

CASES_BY_ID = {c.id: c for c in (*START_CASES, *WAVE_CASES, *PAUSE_CASES, *FAILURE_CASES, *ROLLBACK_CASES)}
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
_OVER_BUDGET = (
    f"wave 1/2: worker {CANARY} failed (ChecksumMismatch: ChecksumMismatch v2); 1 failed > budget 0"
)
# Rollbacks in these rows return to v1, whose manifest digest no status records.
_UNPINNED = ", unpinned: no manifest digest of v1 is recorded"
_TIMED_OUT = (
    f"wave 1/2: worker {CANARY} failed (WorkerTimeout: no outcome within 600s); 1 failed > budget 0; "
    f"rolling 1 worker back to v1{_UNPINNED}"
)
_SHRUNK = (
    f"wave 2/2: worker {CANARY} failed in an earlier wave (ChecksumMismatch: ChecksumMismatch v2); "
    "1 failed > budget 0"
)
_OWN_WAVE = f"wave 2/2: worker {REST[1]} failed (LoadFailed: LoadFailed v2); 2 failed > budget 1"
_NOT_RETRIED = "retry t1 ignored: phase is {}; only a Failed or RolledBack rollout is retried"
_PAUSED_DURING = "paused during wave 1/2: spec.paused is true"
_PAUSED_AFTER = "paused after wave 1/2: spec.paused is true"
_CONFLICT = "selector overlaps CheckpointRollout older (older); no pod is driven by two rollouts"
_NEXT_WAVE = [(N, R.WAVE_STARTED, _WAVE_2)]
_CANARY_DONE = [(Measure.WORKERS, 1, UPDATED), (SECONDS, 60, "")]
_ONE_OF_REST_FAILED = [
    (Measure.WORKERS, 1, FAILED),
    (Measure.WORKERS, 2, UPDATED),
    (SECONDS, 60, ""),
    (Measure.ROLLOUT_SECONDS, 60, Phase.SUCCEEDED),
]


# Keyed by the id of a row of the decide() tables.
TOLD: dict[str, Told] = {
    "first-rollout-asks-the-canary-what-it-serves": Told(
        [(N, R.ROLLOUT_STARTED, _STARTED)], _STARTED, RolloutReason.ROLLOUT_STARTED
    ),
    "the-probed-version-is-previous-and-the-canary-is-called": Told(
        [(N, R.WAVE_STARTED, f"wave 1/2: 1 pod: {CANARY}")], "wave 1/2: 1 pod", RolloutReason.WAVE_STARTED
    ),
    "a-pushed-success-completes-the-canary-and-starts-the-rest": Told(
        [(N, R.WAVE_COMPLETED, "wave 1/2 completed: 1 updated"), *_NEXT_WAVE],
        "wave 2/2: 3 pods",
        RolloutReason.WAVE_STARTED,
        _CANARY_DONE,
    ),
    # The probe goes out before the next wave starts: the status tells the last news meanwhile.
    "with-no-previous-version-known-yet-the-next-wave-first-probes-its-first-member": Told(
        [(N, R.WAVE_COMPLETED, "wave 1/2 completed: 1 updated")],
        "wave 1/2 completed: 1 updated",
        None,
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
            (W, R.WORKER_FAILED, f"{REST[0]}: ChecksumMismatch: ChecksumMismatch v2"),
            (N, R.WAVE_COMPLETED, "wave 2/2 completed: 2 updated, 1 failed (within budget 1)"),
            (N, R.ROLLOUT_COMPLETED, "v2 is live on 3 pods"),
        ],
        "v2 is live on 3 pods",
        RolloutReason.ROLLOUT_COMPLETED,
        _ONE_OF_REST_FAILED,
    ),
    "a-percent-failure-budget-is-a-share-of-the-fleet": Told(
        [
            (W, R.WORKER_FAILED, f"{REST[0]}: ChecksumMismatch: ChecksumMismatch v2"),
            (N, R.WAVE_COMPLETED, "wave 2/2 completed: 2 updated, 1 failed (within budget 2)"),
            (N, R.ROLLOUT_COMPLETED, "v2 is live on 3 pods"),
        ],
        "v2 is live on 3 pods",
        RolloutReason.ROLLOUT_COMPLETED,
        _ONE_OF_REST_FAILED,
    ),
    # No failure of its own to name: the one the shrunk budget no longer covers was earlier.
    "a-fleet-shrunk-below-its-failure-budget-fails-when-the-next-wave-ends": Told(
        [(W, R.ROLLOUT_FAILED, _SHRUNK)],
        _SHRUNK,
        "ChecksumMismatch",
        [(Measure.ROLLOUT_SECONDS, 60, Phase.FAILED)],
    ),
    "an-over-budget-failure-is-named-by-its-own-wave-not-an-earlier-one": Told(
        [
            (W, R.WORKER_FAILED, f"{REST[1]}: LoadFailed: LoadFailed v2"),
            (W, R.ROLLOUT_FAILED, _OWN_WAVE),
        ],
        _OWN_WAVE,
        "LoadFailed",
        [(Measure.WORKERS, 1, FAILED), (Measure.ROLLOUT_SECONDS, 60, Phase.FAILED)],
    ),
    "an-over-budget-failure-without-a-message-is-named-by-its-reason": Told(
        [
            (W, R.WORKER_FAILED, f"{CANARY}: LoadFailed: "),
            (W, R.ROLLOUT_FAILED, f"wave 1/2: worker {CANARY} failed (LoadFailed); 1 failed > budget 0"),
        ],
        f"wave 1/2: worker {CANARY} failed (LoadFailed); 1 failed > budget 0",
        "LoadFailed",
        [(Measure.WORKERS, 1, FAILED), (Measure.ROLLOUT_SECONDS, 60, Phase.FAILED)],
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
            (N, R.PAUSED, "paused after wave 1/3 for promote"),
        ],
        "paused after wave 1/3 for promote",
        RolloutReason.ROLLOUT_PAUSED,
        _CANARY_DONE,
    ),
    "a-timed-pause-begins-after-its-wave-and-wakes-when-it-ends": Told(
        [
            (N, R.WAVE_COMPLETED, "wave 1/2 completed: 1 updated"),
            (N, R.PAUSED, "paused after wave 1/2 for 30s"),
        ],
        "paused after wave 1/2 for 30s",
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
        [(N, R.PAUSED, _PAUSED_DURING)], _PAUSED_DURING, RolloutReason.ROLLOUT_PAUSED
    ),
    "spec-paused-between-waves-holds-the-next": Told(
        [(N, R.PAUSED, _PAUSED_AFTER)], _PAUSED_AFTER, RolloutReason.ROLLOUT_PAUSED
    ),
    "spec-paused-before-the-first-wave-holds-it": Told(
        [(N, R.PAUSED, "paused before wave 1/2: spec.paused is true")],
        "paused before wave 1/2: spec.paused is true",
        RolloutReason.ROLLOUT_PAUSED,
    ),
    # Paused already (no second Paused event), but the message says where it now holds.
    "a-wave-that-ends-while-spec-paused-completes-and-the-rollout-stays-paused": Told(
        [(N, R.WAVE_COMPLETED, "wave 1/2 completed: 1 updated")],
        _PAUSED_AFTER,
        RolloutReason.ROLLOUT_PAUSED,
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
        [(N, R.WAVE_STARTED, "bringing v2 to 1 pod that joined during the rollout")],
        "bringing v2 to 1 pod that joined during the rollout",
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
            (N, R.WAVE_STARTED, "wave 1/2: 0 pods"),
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
            (N, R.DRIFT_CORRECTION, "bringing v2 to 1 new pod"),
            (N, R.WAVE_STARTED, "bringing v2 to 1 pod that appeared after the rollout"),
        ],
        "bringing v2 to 1 pod that appeared after the rollout",
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
            (N, R.WAVE_STARTED, f"wave 1/2: 1 pod: {CANARY}"),
        ],
        "wave 1/2: 1 pod",
        RolloutReason.WAVE_STARTED,
    ),
    # A retry is seen (status.retried) but not acted on, and the rest of the step goes on.
    "retry-is-ignored-while-the-rollout-is-live": Told(
        [(W, R.RETRY_IGNORED, _NOT_RETRIED.format("Progressing"))], None, None
    ),
    "a-retry-on-a-rollout-not-yet-started-is-ignored-and-it-starts": Told(
        [(W, R.RETRY_IGNORED, _NOT_RETRIED.format("Pending")), (N, R.ROLLOUT_STARTED, _STARTED)],
        _STARTED,
        RolloutReason.ROLLOUT_STARTED,
    ),
    "a-retry-that-comes-with-a-new-version-is-ignored-and-the-new-version-starts": Told(
        [
            (
                W,
                R.RETRY_IGNORED,
                "retry t1 ignored: spec.version is now v2, which rolls out as a new version",
            ),
            (N, R.ROLLOUT_STARTED, _STARTED),
            (N, R.WAVE_STARTED, f"wave 1/2: 1 pod: {CANARY}"),
        ],
        "wave 1/2: 1 pod",
        RolloutReason.WAVE_STARTED,
    ),
    "a-retry-set-while-rolling-back-is-ignored-and-the-rollback-ends": Told(
        [
            (W, R.RETRY_IGNORED, _NOT_RETRIED.format("RollingBack")),
            (W, R.ROLLED_BACK, "rolled 1 worker back to v1 (Aborted)"),
        ],
        "rolled 1 worker back to v1 (Aborted)",
        RolloutReason.ABORTED,
        [(Measure.WORKERS, 1, ROLLED_BACK), (Measure.ROLLOUT_SECONDS, 60, Phase.ROLLED_BACK)],
    ),
    "abort-rolls-the-called-pods-back": Told(
        [(W, R.ROLLBACK_STARTED, f"aborted by user; rolling 4 workers back to v1{_UNPINNED}")],
        f"aborted by user; rolling 4 workers back to v1{_UNPINNED}",
        RolloutReason.ABORTED,
    ),
    "aborting-a-paused-rollout-ends-its-pause": Told(
        [(W, R.ROLLBACK_STARTED, f"aborted by user; rolling 1 worker back to v1{_UNPINNED}")],
        f"aborted by user; rolling 1 worker back to v1{_UNPINNED}",
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
        [(W, R.ROLLED_BACK, "rolled 1 worker back to v1 (Aborted)")],
        "rolled 1 worker back to v1 (Aborted)",
        RolloutReason.ABORTED,
        [(Measure.WORKERS, 1, ROLLED_BACK), (Measure.ROLLOUT_SECONDS, 60, Phase.ROLLED_BACK)],
    ),
    "a-rollback-that-fails-is-reported": Told(
        [
            (W, R.WORKER_FAILED, f"{CANARY}: AgentUnreachable: AgentUnreachable v1"),
            (W, R.ROLLBACK_FAILED, f"rollback to v1 failed on 1 worker: {CANARY}"),
        ],
        f"rollback to v1 failed on 1 worker: {CANARY}",
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


@pytest.mark.parametrize(
    ("n", "noun", "said"),
    [(0, "pod", "0 pods"), (1, "pod", "1 pod"), (2, "pod", "2 pods"), (1, "wave", "1 wave")],
)
def test_counts_are_singular_for_exactly_one(n: int, noun: str, said: str) -> None:
    assert counted(n, noun) == said
