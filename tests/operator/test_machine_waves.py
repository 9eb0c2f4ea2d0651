"""decide(), waves: calls, relay peers, pushes and pulls, busy and lost agents, big pulled waves,
counters, drift and catch-up waves, success and what follows it.
One row per situation, with the plan it must produce."""

from __future__ import annotations

from typing import Any

from machine_kit import (
    BIG,
    BIG_ORDER,
    CANARY,
    DEADLINE_WAKE,
    DIGEST,
    EARLIER,
    NOW,
    ORDER,
    PODS,
    REST,
    STAMP,
    TUNING,
    Case,
    called_now,
    canary_done,
    condition,
    done,
    entry,
    ip,
    progressing,
    relays,
    reports,
    rollout,
    sources,
    table_tests,
    url,
    wave,
    wave_rows,
    written,
)

from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import (
    ConditionType,
    EventReason,
    Phase,
    RolloutReason,
    WaveKind,
    WavePhase,
    WorkerPhase,
)
from ckpt_rollout.domain.machine import State, decide
from ckpt_rollout.domain.mergepatch import merge_diff
from ckpt_rollout.domain.plan import Draft, Rollout
from ckpt_rollout.domain.world import Memory, Tuning


def succeeded(late: dict[str, Any]) -> Rollout:
    """v2 succeeded in two waves; ``late``: worker entries written after that."""
    return rollout(progressing(done(0, [CANARY]), done(1, REST), phase="Succeeded", workers=late))


# An agent's queued report can land after the operator pulled that load and moved on.
LATE_REPORTS = [
    *(
        Case(
            f"after-success-a-late-{phase.lower()}-report-of-the-target-is-folded",
            succeeded({REST[0]: entry("v2", phase)}),
            State.DONE,
            Phase.SUCCEEDED,
            observe=lambda p: (p.status.workers, p.status.updated_replicas),
            observed=({}, len(PODS)),
        )
        for phase in ("Loading", "Updated")
    ),
    Case(
        "after-success-a-failure-stays-listed",
        succeeded({REST[0]: entry("v2", "Failed", "LoadFailed")}),
        State.DONE,
        Phase.SUCCEEDED,
        observe=lambda p: list(p.status.workers),
        observed=[REST[0]],
    ),
    Case(
        "after-success-another-versions-entry-stays-listed",
        succeeded({REST[0]: entry("v1", "Loading"), REST[1]: entry("v1", "Updated")}),
        State.DONE,
        Phase.SUCCEEDED,
        observe=lambda p: sorted(p.status.workers),
        observed=sorted(REST[:2]),
    ),
    Case(
        "mid-rollout-a-late-report-of-a-completed-wave-is-folded-and-the-running-waves-stay",
        rollout(
            progressing(
                done(0, [CANARY]),
                wave(1, REST),
                workers={CANARY: entry("v2", "Loading"), REST[0]: entry("v2", "Loading")},
            )
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        memory=called_now(*REST),
        wake=TUNING.pull_after_s,
        observe=lambda p: list(p.status.workers),
        observed=[REST[0]],
    ),
]

CASES = [
    Case(
        "a-pushed-success-completes-the-canary-and-starts-the-rest",
        rollout(progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Updated")})),
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
        "with-no-previous-version-known-yet-the-next-wave-first-probes-its-first-member",
        rollout(
            progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Updated")}, previousVersion=None)
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        events=[EventReason.WAVE_COMPLETED],
        probe=ORDER[1],  # the canary served v2 already: the next member may know the version before
        wake=DEADLINE_WAKE - 60,
        observe=lambda p: (wave_rows(p)[0][1], len(p.status.waves)),
        observed=(WavePhase.COMPLETED, 1),
    ),
    # Chains (relayFanout 1): the canary feeds the first member, the source the second, the
    # first (serving while it loads) the third.
    canary_done(
        "the-relay-sends-later-waves-to-the-updated-peer",
        relays,
        {ORDER[1]: (url(CANARY), True), ORDER[2]: (None, None), ORDER[3]: (url(ORDER[1]), None)},
    ),
    # The canary feeds two, the source one: no member needs to serve while it loads.
    canary_done(
        "a-wider-relay-fanout-makes-trees",
        relays,
        {ORDER[1]: (url(CANARY), None), ORDER[2]: (url(CANARY), None), ORDER[3]: (None, None)},
        spec={"strategy": {"waves": [1, "100%"], "relayFanout": 2}},
    ),
    canary_done(
        "without-peer-relay-every-call-reads-the-source",
        relays,
        dict.fromkeys(ORDER[1:], (None, None)),
        spec={"strategy": {"waves": [1, "100%"], "peerRelay": False}},
    ),
    canary_done(
        "with-agent-tls-the-peer-handed-out-is-https",
        sources,
        {None, *(url(pod).replace("http:", "https:") for pod in (CANARY, ORDER[1]))},
        tuning=Tuning(agent_tls=True),
    ),
    canary_done(
        "every-call-of-the-spec-version-carries-its-digest-and-checksum-flag-relayed-or-not",
        lambda p: (
            {(c.port, c.request.version, c.request.verify_checksum) for c in p.calls},
            {c.request.source and c.request.source.manifest_digest for c in p.calls},
            sources(p),
        ),
        ({(8089, "v2", True)}, {DIGEST}, {url(CANARY), None, url(ORDER[1])}),
        spec={"source": {"manifestDigest": DIGEST}, "verifyChecksum": True},
    ),
    Case(
        "without-peer-relay-later-waves-load-from-the-source",
        rollout(
            progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Updated")}),
            spec={"strategy": {"peerRelay": False}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=sources,
        observed={None},
    ),
    Case(
        "a-pod-whose-load-failed-is-no-relay-peer",
        rollout(
            progressing(
                wave(0, ORDER[:2]),
                workers={
                    ORDER[0]: entry("v2", "Updated"),
                    ORDER[1]: entry("v2", "Failed", "ChecksumMismatch"),
                },
            ),
            spec={"strategy": {"waves": [2, "100%"]}, "failurePolicy": {"maxFailures": 1}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=ORDER[2:],
        events=[EventReason.WORKER_FAILED, EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=relays,
        observed={ORDER[2]: (url(ORDER[0]), None), ORDER[3]: (None, None)},
    ),
    Case(
        "a-member-back-after-being-gone-is-called-and-the-called-stay-recorded",
        rollout(progressing(wave(0, ORDER[:2], called=ORDER[:1])), spec={"strategy": {"waves": [2, "100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[ORDER[1]],
        wake=TUNING.pull_after_s,
        memory=called_now(ORDER[0]),
        observe=lambda p: wave_rows(p)[0][3],
        observed=ORDER[:2],
    ),
    Case(
        "waiting-for-a-push-looks-again-when-the-pull-is-due",
        rollout(progressing(wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_after_s - 1,
        memory=Memory(call_times={CANARY: NOW.mono - 1}),
    ),
    Case(
        "a-push-overdue-is-pulled",
        rollout(progressing(wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[CANARY],
        wake=TUNING.pull_every_s,
        memory=Memory(call_times={CANARY: NOW.mono - 6}),
        observe=lambda p: [(x.ip, x.port, x.version, x.wave) for x in p.pulls],
        observed=[(ip(CANARY), 8089, "v2", 0)],
    ),
    Case(
        "a-pushed-wave-once-pulled-is-pulled-again-pull-every-s-later",
        rollout(progressing(wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_every_s - 1,
        memory=Memory(call_times={CANARY: NOW.mono - 10}, last_pull={CANARY: NOW.mono - 1}),
    ),
    Case(
        "after-a-restart-a-called-pod-is-pulled-at-once-and-its-clock-starts",
        rollout(progressing(wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[CANARY],
        wake=TUNING.pull_every_s,
        observe=lambda p: p.first_seen,
        observed=[CANARY],
    ),
    Case(
        "an-agent-that-lost-the-call-is-called-again",
        rollout(progressing(wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        wake=TUNING.pull_after_s,
        memory=called_now(CANARY, lost={CANARY}),
    ),
    Case(
        "a-busy-agent-is-called-again-once-its-retry-is-due",
        rollout(progressing(wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        wake=TUNING.pull_after_s,
        memory=called_now(CANARY, busy_until={CANARY: NOW.mono - 0.1}),
    ),
    Case(
        "a-busy-agent-waits-for-its-retry",
        rollout(progressing(wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=0.5,
        memory=called_now(CANARY, busy_until={CANARY: NOW.mono + 0.5}),
    ),
    Case(
        "a-busy-agent-is-called-again-the-moment-its-retry-is-due",
        rollout(progressing(wave(0, [CANARY]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        wake=TUNING.pull_after_s,
        memory=called_now(CANARY, busy_until={CANARY: NOW.mono}),
    ),
    Case(
        "a-lost-call-is-made-again-and-the-next-member-is-still-pulled",
        rollout(progressing(wave(0, ORDER[:2])), spec={"strategy": {"waves": [2, "100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[ORDER[0]],
        pulls=[ORDER[1]],
        wake=TUNING.pull_every_s,
        memory=Memory(call_times={ORDER[0]: NOW.mono, ORDER[1]: NOW.mono - 6}, lost={ORDER[0]}),
    ),
    Case(
        "a-busy-member-waits-and-the-next-member-is-still-pulled",
        rollout(progressing(wave(0, ORDER[:2])), spec={"strategy": {"waves": [2, "100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[ORDER[1]],
        wake=0.5,
        memory=Memory(
            call_times={ORDER[0]: NOW.mono, ORDER[1]: NOW.mono - 6}, busy_until={ORDER[0]: NOW.mono + 0.5}
        ),
    ),
    Case(
        "a-big-wave-is-pulled-and-called-at-once",
        rollout(progressing(), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=BIG,
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_first_s,
        observe=reports,
        observed={False},  # the agents are asked not to write status.workers
    ),
    *(
        Case(
            f"a-wave-of-{size}-is-{'pulled' if pulled else 'pushed'}",
            rollout(progressing(), pods=BIG[:size], spec={"strategy": {"waves": ["100%"]}}),
            State.ADVANCE,
            Phase.PROGRESSING,
            calls=BIG[:size],
            events=[EventReason.WAVE_STARTED],
            wake=TUNING.pull_first_s if pulled else TUNING.pull_after_s,
            observe=reports,
            observed={not pulled},
        )
        for size, pulled in ((TUNING.push_max_wave, False), (TUNING.push_max_wave + 1, True))
    ),
    *(
        Case(
            f"a-wave-of-{size}-is-announced-with-{'its-first-five-members' if size > 5 else 'every-member'}",
            rollout(progressing(), pods=BIG, spec={"strategy": {"waves": [size, "100%"]}}),
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
        rollout(progressing(wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=BIG,  # half are due; the rest would be within the interval
        wake=TUNING.pull_first_s,
        memory=Memory(call_times={n: NOW.mono - (0.3 if i % 2 else 0.1) for i, n in enumerate(BIG)}),
    ),
    Case(
        "a-pulled-wave-with-none-due-waits-for-the-first",
        rollout(progressing(wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=0.05,
        memory=Memory(call_times={n: NOW.mono - (0.2 if i % 2 else 0.1) for i, n in enumerate(BIG)}),
    ),
    Case(
        "a-pulled-round-takes-every-member-due-within-its-interval",
        rollout(progressing(wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=BIG,  # BIG[0] is due now; the rest exactly one interval later
        wake=TUNING.pull_first_s,
        memory=Memory(call_times={**dict.fromkeys(BIG, NOW.mono), BIG[0]: NOW.mono - TUNING.pull_first_s}),
    ),
    Case(
        "a-pulled-wave-is-pulled-every-half-of-the-time-waited",
        rollout(progressing(wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=0.5,  # called 4 s ago: every 2 s, and the last pull was 1.5 s ago
        memory=Memory(
            call_times=dict.fromkeys(BIG, NOW.mono - 4), last_pull=dict.fromkeys(BIG, NOW.mono - 1.5)
        ),
    ),
    Case(
        "a-big-wave-is-pulled-no-faster-than-pull-rate-allows",
        rollout(progressing(wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}}),
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
        rollout(
            progressing(
                done(0, [BIG[0]]),
                wave(1, BIG[1:5]),
                workers={
                    BIG[1]: entry("v2", "Updated"),
                    BIG[2]: entry("v2", "Updated"),
                    BIG[3]: entry("v2", "Failed", "ChecksumMismatch"),
                    BIG[4]: entry("v1", "Updated"),  # the version before: still loading v2
                },
            ),
            pods=BIG[:6],
            spec={"failurePolicy": {"maxFailures": 1}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_after_s,
        memory=called_now(BIG[4], announced={f"{BIG[3]}/v2"}),
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
        rollout(progressing(wave(0, PODS)), spec={"strategy": {"waves": ["100%"]}}),
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
        rollout(progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Updated")})),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=Memory(heard={CANARY: WorkerStatus(version="v2", phase=WorkerPhase.FAILED, reason="X")}),
        observe=lambda p: p.status.waves[0].updated,
        observed=1,
    ),
    # Members that disappear: test_machine_departures.
    Case(
        "a-member-gone-from-a-completed-wave-is-made-up-for-in-the-next",
        rollout(
            progressing(done(0, [CANARY])),
            pods=[p for p in PODS if p != CANARY],
            spec={"strategy": {"waves": [1, 2, "100%"]}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=ORDER[1:3],  # 2 pods on v2 after wave 2, the canary no longer among them
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
    ),
    Case(
        "pods-that-joined-during-the-rollout-get-a-drift-wave",
        rollout(progressing(done(0, [CANARY]), done(1, REST[:2]))),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[REST[2]],
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: wave_rows(p)[-1][:2],
        observed=(WaveKind.DRIFT, WavePhase.RUNNING),
    ),
    Case(
        "a-drift-wave-done-succeeds-again",
        rollout(
            progressing(
                done(0, [CANARY]),
                done(1, REST[:2]),
                {**wave(2, [REST[2]]), "kind": "Drift", "specIndex": None},
                workers={REST[2]: entry("v2", "Updated")},
            )
        ),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
    ),
    Case(
        "after-the-catch-up-the-spec-waves-start-from-the-first-which-it-may-already-cover",
        rollout(
            progressing(
                {**wave(0, [CANARY]), "kind": "CatchUp", "specIndex": None},
                supersededVersion="v1b",
                workers={CANARY: entry("v2", "Updated")},
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
        rollout(progressing(done(0, [CANARY]), done(1, REST))),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.ROLLOUT_COMPLETED],
        observe=lambda p: (condition(p, ConditionType.READY), p.status.completed_at),
        observed=(("True", RolloutReason.ROLLOUT_COMPLETED), STAMP),
    ),
    Case(
        "a-finished-rollout-plans-nothing-and-sets-no-timer",
        rollout(progressing(done(0, [CANARY]), done(1, REST), phase="Succeeded")),
        State.DONE,
        Phase.SUCCEEDED,
    ),
    Case(
        "a-pod-after-success-is-brought-to-the-stable-version",
        rollout(progressing(done(0, [CANARY]), done(1, REST[:2]), phase="Succeeded", completedAt=EARLIER)),
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
    *LATE_REPORTS,
]
CASES_BY_ID = {c.id: c for c in CASES}


test_decide, test_every_step_comes_to_rest = table_tests(CASES)


def test_decide_is_pure() -> None:
    """Deciding twice from the same inputs gives the same plan and changes no input."""
    given = CASES_BY_ID["a-pushed-success-completes-the-canary-and-starts-the-rest"].rollout
    before = (given.status.model_dump(), Memory().__dict__)
    memory = Memory()
    first, second = decide(given, memory, TUNING, NOW), decide(given, memory, TUNING, NOW)
    assert first.status == second.status
    assert first.calls == second.calls
    assert (given.status.model_dump(), memory.__dict__) == before


def test_a_late_report_folded_away_is_not_written_again() -> None:
    """The fold's own status write wakes no further write: the step after it changes nothing."""
    first = decide(
        CASES_BY_ID["after-success-a-late-loading-report-of-the-target-is-folded"].rollout,
        Memory(),
        TUNING,
        NOW,
    )
    after = rollout(written(first))
    second = decide(after, Memory(), TUNING, NOW)
    assert merge_diff(after.status.to_wire(), second.status.to_wire()) == {}
    assert (second.calls, second.pulls, second.events, second.wake_after) == ([], [], [], None)


def test_removing_worker_entries_ignores_those_not_there() -> None:
    d = Draft(rollout(progressing(workers={CANARY: entry("v2", "Failed")})), Memory(), TUNING, NOW)
    d.set_workers({"gone": None, CANARY: None})
    assert d.status.workers == {}


def test_every_call_bounds_the_agents_load_by_the_worker_timeout() -> None:
    """The agent stops moving bytes when the operator would give the worker up (#32 item 5), on
    a wave's call and a rollback's alike."""
    due = rollout(progressing(wave(0, [CANARY], called=[])), spec={"timeouts": {"workerSeconds": 90}})
    (call,) = decide(due, Memory(), TUNING, NOW).calls
    assert call.request.deadline_seconds == 90
    assert call.request.to_wire()["deadline_seconds"] == 90
