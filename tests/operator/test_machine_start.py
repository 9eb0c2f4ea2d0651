"""decide(), a new spec.version starts (a first rollout probes its canary), supersedes one in flight
and catches its called pods up; retry, and a retry asked for when there is nothing to retry
(ignored, never kept for later); an older overlapping CR stalls this one; no worker waits.
One row per situation, with the plan it must produce."""

from __future__ import annotations

from machine_kit import (
    CANARY,
    DEADLINE_WAKE,
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
    reports,
    rollout,
    table_tests,
    wave,
    wave_rows,
    written,
)

from ckpt_api.vocabulary import (
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    ConditionType,
    EventReason,
    Phase,
    RolloutReason,
    WaveKind,
    WavePhase,
)
from ckpt_rollout.domain.machine import State, decide
from ckpt_rollout.domain.world import Memory, Peer

CASES = [
    Case(
        "first-rollout-asks-the-canary-what-it-serves",
        rollout(),
        State.START,
        Phase.PROGRESSING,
        events=[EventReason.ROLLOUT_STARTED],
        probe=CANARY,
        wake=DEADLINE_WAKE,
        observe=lambda p: (wave_rows(p), p.reset_memory, p.status.previous_version, p.probe and p.probe.port),
        observed=([], True, None, 8089),
    ),
    Case(
        "the-probed-version-is-previous-and-the-canary-is-called",
        rollout({"phase": "Progressing", "targetVersion": "v2", "startedAt": EARLIER}),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,  # a push wakes the loop sooner; this is the pull fallback
        memory=Memory(probed=(CANARY, "v1")),
        observe=lambda p: (wave_rows(p), p.status.previous_version, reports(p)),
        observed=([(WaveKind.SPEC, WavePhase.RUNNING, [CANARY], [CANARY])], "v1", {True}),
    ),
    Case(
        "a-canary-already-serving-the-new-version-leaves-no-previous-version",
        rollout({"phase": "Progressing", "targetVersion": "v2", "startedAt": EARLIER}),
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
        rollout({"phase": "Succeeded", "targetVersion": "v1", "stableVersion": "v1"}),
        State.START,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.ROLLOUT_STARTED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (p.status.previous_version, p.status.superseded_version),
        observed=("v1", None),  # nothing was in flight: nothing superseded
    ),
    Case(
        # A bare index found at the start promoted an earlier version: it promotes none of this one.
        "a-new-version-records-the-promote-annotation-it-finds",
        rollout(
            {"phase": "Succeeded", "targetVersion": "v1", "stableVersion": "v1", "promoteAtStart": "1"},
            annotations={PROMOTE_ANNOTATION: "0"},
        ),
        State.START,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.ROLLOUT_STARTED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: p.status.promote_at_start,
        observed="0",
    ),
    Case(
        "a-new-version-with-no-promote-annotation-records-none",
        rollout(progressing(done(0, [CANARY]), targetVersion="v1b", promoteAtStart="0")),
        State.START,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.SUPERSEDED, EventReason.ROLLOUT_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: p.status.promote_at_start,
        observed=None,
    ),
    Case(
        "a-new-version-mid-rollout-supersedes-and-catches-up-the-called-pods-first",
        rollout(progressing(done(0, [CANARY]), wave(1, REST), targetVersion="v1b")),
        State.START,
        Phase.PROGRESSING,
        cancels=[(p, "v1b") for p in REST],
        calls=sorted(PODS),
        events=[EventReason.SUPERSEDED, EventReason.ROLLOUT_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (wave_rows(p)[0][:2], p.status.superseded_version, p.status.workers),
        observed=((WaveKind.CATCH_UP, WavePhase.RUNNING), "v1b", {}),
    ),
    Case(
        "a-supersede-catches-up-only-the-called-pods-still-here-and-restarts-the-clocks",
        rollout(
            progressing(
                done(0, [CANARY]),
                wave(1, REST, called=REST[:2]),
                targetVersion="v1b",
                phase="Paused",
                pausedAt=EARLIER,
                pausedSeconds=7,
                workers={REST[1]: entry("v1b", "Loading")},
            ),
            pods=[CANARY, REST[1], REST[2]],  # REST[0], called, has gone
        ),
        State.START,
        Phase.PROGRESSING,
        cancels=[(REST[1], "v1b")],
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
        rollout(
            progressing(done(0, [CANARY]), phase="RolledBack", stableVersion="v1"),
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
        rollout(
            progressing(
                done(0, [CANARY]),
                phase="RolledBack",
                stableVersion="v1",
                completedAt=EARLIER,
                retried="t0",
                rollback={"version": "v1", "reason": "WorkerTimeout", "pods": [CANARY], "phase": "Completed"},
                workers={CANARY: entry("v2", "Failed", "WorkerTimeout")},
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
        rollout(
            progressing(done(0, [CANARY]), phase="RolledBack", retried="t1"),
            annotations={RETRY_ANNOTATION: "t1"},
        ),
        State.DONE,
        Phase.ROLLED_BACK,
    ),
    Case(
        "an-empty-retry-annotation-asks-for-nothing",
        rollout(progressing(done(0, [CANARY]), phase="RolledBack"), annotations={RETRY_ANNOTATION: ""}),
        State.DONE,
        Phase.ROLLED_BACK,
    ),
    Case(
        "retry-is-ignored-while-the-rollout-is-live",
        rollout(progressing(wave(0, [CANARY])), annotations={RETRY_ANNOTATION: "t1"}),
        State.RETRY_IGNORED,
        Phase.PROGRESSING,
        events=[EventReason.RETRY_IGNORED],
        wake=TUNING.pull_after_s,
        memory=called_now(CANARY),
        observe=lambda p: p.status.retried,
        observed="t1",  # seen: it never fires later
    ),
    Case(
        "a-retry-set-while-the-last-wave-ran-is-ignored-before-the-failure-is-written",
        rollout(
            progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Failed", "ChecksumMismatch")}),
            spec={"failurePolicy": {"onFailure": "Halt"}},
            annotations={RETRY_ANNOTATION: "t1"},
        ),
        State.RETRY_IGNORED,
        Phase.FAILED,
        events=[EventReason.RETRY_IGNORED, EventReason.WORKER_FAILED, EventReason.ROLLOUT_FAILED],
        observe=lambda p: p.status.retried,
        observed="t1",
    ),
    Case(
        "a-retry-on-a-rollout-not-yet-started-is-ignored-and-it-starts",
        rollout(annotations={RETRY_ANNOTATION: "t1"}),
        State.RETRY_IGNORED,
        Phase.PROGRESSING,
        events=[EventReason.RETRY_IGNORED, EventReason.ROLLOUT_STARTED],
        probe=CANARY,
        wake=DEADLINE_WAKE,
        observe=lambda p: p.status.retried,
        observed="t1",
    ),
    Case(
        "a-retry-that-comes-with-a-new-version-is-ignored-and-the-new-version-starts",
        rollout(
            {"phase": "Failed", "targetVersion": "v1b", "stableVersion": "v1"},
            annotations={RETRY_ANNOTATION: "t1"},
        ),
        State.RETRY_IGNORED,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.RETRY_IGNORED, EventReason.ROLLOUT_STARTED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (p.status.retried, p.status.target_version),
        observed=("t1", "v2"),
    ),
    Case(
        "a-retry-set-while-rolling-back-is-ignored-and-the-rollback-ends",
        rollout(
            progressing(
                wave(0, [CANARY]),
                phase="RollingBack",
                rollback={"version": "v1", "reason": "Aborted", "pods": [CANARY], "called": [CANARY]},
                workers={CANARY: entry("v1", "Updated")},
            ),
            annotations={RETRY_ANNOTATION: "t1"},
        ),
        State.RETRY_IGNORED,
        Phase.ROLLED_BACK,
        events=[EventReason.RETRY_IGNORED, EventReason.ROLLED_BACK],
        observe=lambda p: p.status.retried,
        observed="t1",
    ),
    Case(
        "no-matching-pod-waits-for-one",
        rollout(pods=[]),
        State.START,
        Phase.PENDING,
        events=[EventReason.ROLLOUT_STARTED],
        observe=lambda p: condition(p, ConditionType.PROGRESSING),
        observed=("True", RolloutReason.NO_WORKERS),
    ),
    Case(
        "an-older-overlapping-rollout-stalls-this-one",
        rollout(peers=(Peer("older", "t0", {"matchLabels": {"app": "rollout-worker"}}),)),
        State.CONFLICT,
        Phase.PENDING,
        events=[EventReason.SELECTOR_CONFLICT],
        wake=TUNING.idle_poll_s,
        observe=lambda p: (condition(p, ConditionType.STALLED), condition(p, ConditionType.PROGRESSING)[0]),
        observed=(("True", RolloutReason.SELECTOR_CONFLICT), "False"),
    ),
    Case(
        "the-older-overlapping-rollout-is-found-past-itself-and-newer-and-unreadable-peers",
        rollout(
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
        rollout(
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


test_decide, test_every_step_comes_to_rest = table_tests(CASES)


def test_a_retry_set_while_the_rollout_runs_does_not_restart_it_when_it_fails_later() -> None:
    """Asked for while nothing had failed, a retry must not fire once the rollout fails."""
    halt, asked = {"failurePolicy": {"onFailure": "Halt"}}, {RETRY_ANNOTATION: "t1"}
    running = rollout(progressing(wave(0, [CANARY])), spec=halt, annotations=asked)
    seen = decide(running, called_now(CANARY), TUNING, NOW)
    assert seen.status.phase is Phase.PROGRESSING
    failing = {**written(seen), "workers": {CANARY: entry("v2", "Failed", "ChecksumMismatch")}}
    failed = decide(rollout(failing, spec=halt, annotations=asked), called_now(CANARY), TUNING, NOW)
    assert failed.status.phase is Phase.FAILED
    after = decide(rollout(written(failed), spec=halt, annotations=asked), Memory(), TUNING, NOW)
    assert (after.status.phase, after.calls, after.events) == (Phase.FAILED, [], [])
