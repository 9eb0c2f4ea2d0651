"""decide(), pauses: pauseAfterWave (for promote or a duration), promote, spec.paused mid-wave and
between waves, and the paused time the deadline does not count.
One row per situation, with the plan it must produce."""

from __future__ import annotations

from machine_kit import (
    CANARY,
    EARLIER,
    NOW,
    REST,
    STAMP,
    TUNING,
    Case,
    condition,
    done,
    entry,
    progressing,
    rollout,
    table_tests,
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
from ckpt_rollout.domain.machine import State
from ckpt_rollout.domain.plan import Rollout
from ckpt_rollout.domain.world import rfc3339


def v3_after_its_canary(promote: str, *, at_start: str | None, **status: object) -> Rollout:
    """v3, paused after its canary for promote, the promote annotation now ``promote`` and at
    v3's start ``at_start`` (None: absent)."""
    return rollout(
        progressing(
            done(0, [CANARY]),
            **{
                "phase": "Paused",
                "pausedAt": EARLIER,
                "targetVersion": "v3",
                "previousVersion": "v2",
                "stableVersion": "v2",
                **({"promoteAtStart": at_start} if at_start is not None else {}),
                **status,
            },
        ),
        spec={"version": "v3", "strategy": {"pauseAfterWave": [0]}},
        annotations={PROMOTE_ANNOTATION: promote},
    )


def v3_promoted(id_: str, promote: str, *, at_start: str | None) -> Case:
    return Case(
        id_,
        v3_after_its_canary(promote, at_start=at_start),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.RESUMED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
    )


def v3_held(id_: str, promote: str, *, at_start: str | None) -> Case:
    return Case(id_, v3_after_its_canary(promote, at_start=at_start), State.ADVANCE, Phase.PAUSED)


# The promote annotation outlives the rollout it was written for; the next version pauses after
# the same waves. What `ckpt-rollout promote` writes names the version.
PROMOTE_SCOPE = [
    Case(
        "a-promote-left-from-v2-does-not-let-v3-past-its-canary",
        rollout(
            progressing(
                wave(0, [CANARY]),
                targetVersion="v3",
                previousVersion="v2",
                promoteAtStart="0",
                workers={CANARY: entry("v3", "Updated")},
            ),
            spec={"version": "v3", "strategy": {"pauseAfterWave": [0]}},
            annotations={PROMOTE_ANNOTATION: "0"},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.WAVE_COMPLETED, EventReason.PAUSED],
        observe=lambda p: p.status.message,
        observed="paused after wave 1/2 for promote",
    ),
    v3_held("a-bare-promote-unchanged-since-v3-started-holds-v3", "0", at_start="0"),
    v3_promoted("a-promote-naming-v3-promotes-v3", "0@v3", at_start="0"),
    v3_promoted("a-promote-naming-v3-set-before-v3-started-promotes-v3", "0@v3", at_start="0@v3"),
    v3_held("a-promote-naming-v2-does-not-promote-v3", "0@v2", at_start=None),
    v3_held("a-promote-naming-v2-left-from-v2-does-not-promote-v3", "0@v2", at_start="0@v2"),
    v3_promoted("a-bare-promote-set-during-v3-promotes-v3", "0", at_start=None),
    v3_promoted("a-bare-promote-replacing-v2s-named-one-promotes-v3", "0", at_start="0@v2"),
    *(
        v3_held(f"a-malformed-promote-{value!r}-is-ignored", value, at_start=None)
        # Versions never hold "@" (spec.version's pattern), so a second one names no version.
        for value in ("0@", "@v3", "0@@v3", "0@v3@v4", "0@V3", "0@v3 ", " 0@v3", "\u00b2@v3", "x@v3")
    ),
    Case(
        "a-promote-past-an-earlier-wave-holds-a-later-pause",
        rollout(
            progressing(
                done(0, [CANARY]),
                done(1, REST[:1]),
                phase="Paused",
                pausedAt=EARLIER,
                targetVersion="v3",
                previousVersion="v2",
                message="paused after wave 2/3 for promote",
            ),
            spec={"version": "v3", "strategy": {"pauseAfterWave": [0, 1], "waves": [1, 2, "100%"]}},
            annotations={PROMOTE_ANNOTATION: "0@v3"},
        ),
        State.ADVANCE,
        Phase.PAUSED,
    ),
]

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
    *PROMOTE_SCOPE,
]


test_decide, test_every_step_comes_to_rest = table_tests(CASES)
