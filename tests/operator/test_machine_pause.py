"""decide(), pauses: pauseAfterWave (for promote or a duration), promote, spec.paused mid-wave and
between waves, and the paused time the deadline does not count.
One row per situation, with the plan it must produce."""

from __future__ import annotations

import pytest
from machine_kit import (
    CANARY,
    EARLIER,
    NOW,
    REST,
    STAMP,
    TUNING,
    Case,
    assert_comes_to_rest,
    assert_decides,
    condition,
    done,
    entry,
    ids,
    progressing,
    rollout,
    wave,
    wave_rows,
)

from ckpt_api.vocabulary import (
    PROMOTE_ANNOTATION,
    ConditionType,
    EventReason,
    Phase,
    RolloutReason,
    WavePhase,
)
from ckpt_rollout.machine import State
from ckpt_rollout.world import rfc3339

CASES = [
    Case(
        "pause-after-a-wave-waits-for-promote",
        rollout(
            progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Updated")}),
            spec={"strategy": {"pauseAfterWave": [0], "waves": [1, 2, "100%"]}},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.WAVE_COMPLETED, EventReason.PAUSED],
        observe=lambda p: (p.status.paused_at, condition(p, ConditionType.PAUSED)),
        observed=(STAMP, ("True", RolloutReason.ROLLOUT_PAUSED)),
    ),
    Case(
        "a-timed-pause-wakes-when-it-ends",
        rollout(
            progressing(done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 20)),
            spec={"strategy": {"pauseAfterWave": [0], "pauseDurationSeconds": 30}},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        wake=10,
    ),
    Case(
        "promote-resumes-with-the-paused-time-counted",
        rollout(
            progressing(done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 20), pausedSeconds=5),
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
        rollout(
            progressing(done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 20)),
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
        rollout(
            progressing(done(0, [CANARY]), phase="Paused", pausedAt=EARLIER),
            spec={"strategy": {"pauseAfterWave": [0]}},
        ),
        State.ADVANCE,
        Phase.PAUSED,  # and no timer: only the promote annotation, a change to the CR, ends it
    ),
    *(
        Case(
            f"a-malformed-promote-{value}-is-ignored",
            rollout(
                progressing(done(0, [CANARY]), phase="Paused", pausedAt=EARLIER),
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
        rollout(
            progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Updated")}),
            spec={"strategy": {"pauseAfterWave": [0], "pauseDurationSeconds": 30}},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.WAVE_COMPLETED, EventReason.PAUSED],
        wake=30,
    ),
    Case(
        "a-timed-pause-with-a-second-left-waits-that-second",
        rollout(
            progressing(done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 29)),
            spec={"strategy": {"pauseAfterWave": [0], "pauseDurationSeconds": 30}},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        wake=1,
    ),
    Case(
        "a-timed-pause-that-has-run-its-time-resumes",
        rollout(
            progressing(done(0, [CANARY]), phase="Paused", pausedAt=rfc3339(NOW.wall - 30)),
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
        rollout(progressing(wave(0, [CANARY], called=[])), spec={"paused": True}),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.PAUSED],
    ),
    Case(
        "spec-paused-between-waves-holds-the-next",
        rollout(progressing(done(0, [CANARY])), spec={"paused": True}),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.PAUSED],
    ),
    Case(
        "spec-paused-before-the-first-wave-holds-it",
        rollout(progressing(), spec={"paused": True}),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.PAUSED],
    ),
    Case(
        "unpausing-a-running-wave-resumes-its-calls",
        rollout(progressing(wave(0, [CANARY], called=[]), phase="Paused", pausedAt=rfc3339(NOW.wall - 20))),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.RESUMED],
        wake=TUNING.pull_after_s,
        observe=lambda p: condition(p, ConditionType.PAUSED),
        observed=("False", RolloutReason.ROLLOUT_RESUMED),
    ),
    Case(
        "a-wave-that-ends-while-spec-paused-completes-and-the-rollout-stays-paused",
        rollout(
            progressing(
                wave(0, [CANARY]),
                phase="Paused",
                pausedAt=EARLIER,
                workers={CANARY: entry("v2", "Updated")},
            ),
            spec={"paused": True},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.WAVE_COMPLETED],  # and no second Paused: the message says where
        observe=lambda p: (wave_rows(p)[0][1], p.status.paused_at, condition(p, ConditionType.PAUSED)),
        observed=(WavePhase.COMPLETED, EARLIER, ("True", RolloutReason.ROLLOUT_PAUSED)),
    ),
]


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_decide(case: Case) -> None:
    assert_decides(case)


@pytest.mark.parametrize("case", CASES, ids=ids(CASES))
def test_every_step_comes_to_rest(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    assert_comes_to_rest(case, monkeypatch)
