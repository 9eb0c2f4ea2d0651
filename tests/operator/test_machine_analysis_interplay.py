"""decide(), an analysis meeting the rest of the machine: skipped only by the skip-analysis
annotation naming the wave and version (never by promote), measured through spec.paused, cut
short by an abort or the progress deadline, ended when the spec drops it.
One row per situation, with the plan it must produce."""

from __future__ import annotations

from analysis_kit import (
    WAKE,
    ago,
    analysis_message,
    analyzing,
    answered,
    key,
    spec,
    state,
    told,
    value,
)
from machine_kit import (
    CANARY,
    REST,
    STAMP,
    TUNING,
    Case,
    progressing,
    rollout,
    table_tests,
    wave,
    wave_rows,
)

from ckpt_api.vocabulary import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    SKIP_ANALYSIS_ANNOTATION,
    AnalysisPhase,
    EventReason,
    EventType,
    Phase,
    WavePhase,
)
from ckpt_rollout.domain.machine import State

CASES = [
    Case(
        "the-skip-analysis-annotation-naming-the-wave-and-version-skips-it",
        rollout(analyzing(), spec=spec(), annotations={SKIP_ANALYSIS_ANNOTATION: "0@v2"}),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.ANALYSIS_SKIPPED, EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (state(p)[:3], wave_rows(p)[0][1], analysis_message(p), told(p)[0]),
        observed=(
            (AnalysisPhase.SKIPPED, 0, 0),
            WavePhase.COMPLETED,
            "skipped (rollout.ckpt.dev/skip-analysis)",
            (
                EventType.NORMAL,
                EventReason.ANALYSIS_SKIPPED,
                "wave 1/2: analysis skipped (rollout.ckpt.dev/skip-analysis)",
            ),
        ),
    ),
    *(
        Case(
            f"a-skip-analysis-of-{value_!r}-skips-nothing",
            rollout(analyzing(), spec=spec(), annotations={SKIP_ANALYSIS_ANNOTATION: value_}),
            State.ADVANCE,
            Phase.PROGRESSING,
            wake=WAKE,
            observe=lambda p: (state(p)[0], key(p)),
            observed=(AnalysisPhase.RUNNING, "v2/0/0"),
        )
        # Left from v1's rollout; another wave; no version (a bare index is promote's form only).
        for value_ in ("0@v1", "1@v2", "0", "")
    ),
    Case(
        "promote-does-not-skip-an-analysis",
        rollout(
            analyzing(),
            spec={**spec(), "strategy": {**spec()["strategy"], "pauseAfterWave": [0]}},
            annotations={PROMOTE_ANNOTATION: "0@v2"},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=WAKE,
        observe=lambda p: (wave_rows(p)[0][1], state(p)[0]),
        observed=(WavePhase.ANALYZING, AnalysisPhase.RUNNING),
    ),
    Case(
        "a-passed-analysis-then-holds-at-its-pause-after-wave",
        rollout(
            analyzing(started=ago(30), measurements=3, measured=ago(10)),
            spec={**spec(), "strategy": {**spec()["strategy"], "pauseAfterWave": [0]}},
        ),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.ANALYSIS_PASSED, EventReason.WAVE_COMPLETED, EventReason.PAUSED],
    ),
    Case(
        "spec-paused-goes-on-measuring-and-keeps-the-pause-message",
        rollout(analyzing(), spec={**spec(), "paused": True}),
        State.ADVANCE,
        Phase.PAUSED,
        events=[EventReason.PAUSED],
        observe=lambda p: (key(p), p.status.message),
        observed=("v2/0/0", "paused during wave 1/2: spec.paused is true"),
    ),
    Case(
        "spec-paused-does-not-hold-a-failing-analysis",
        rollout(
            analyzing(phase="Paused", pausedAt=ago(5), message="paused during wave 1/2: spec.paused is true"),
            spec={**spec(), "paused": True},
        ),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ANALYSIS_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=answered(0, value(0.9)),
        observe=lambda p: (p.status.paused_at, p.status.paused_seconds),
        observed=(None, 5),
    ),
    Case(
        "analysis-removed-from-the-spec-mid-analysis-lets-the-wave-complete",
        rollout(analyzing()),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.ANALYSIS_SKIPPED, EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (state(p)[0], analysis_message(p)),
        observed=(AnalysisPhase.SKIPPED, "spec.strategy.analysis was removed"),
    ),
    Case(
        "an-abort-during-the-analysis-rolls-back",
        rollout(analyzing(), spec=spec(), annotations={ABORT_ANNOTATION: "v2"}),
        State.ABORT,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
    ),
    Case(
        "the-progress-deadline-runs-through-an-analysis",
        rollout(
            analyzing(started=ago(10), measurements=1, measured=ago(1), startedAt=ago(1801)), spec=spec()
        ),
        State.DEADLINE,
        Phase.ROLLING_BACK,
        calls=[CANARY],
        events=[EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
    ),
    Case(
        "a-skipped-wave-whose-member-lost-its-entry-runs-again-to-learn-its-outcome",
        rollout(
            progressing(
                wave(0, [CANARY], phase="Analyzing", analysis={"phase": "Running", "startedAt": STAMP})
            ),
            spec=spec(),
            annotations={SKIP_ANALYSIS_ANNOTATION: "0@v2"},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        pulls=[CANARY],
        events=[EventReason.ANALYSIS_SKIPPED],
        wake=TUNING.pull_every_s,
        observe=lambda p: (wave_rows(p)[0][1], state(p)[0]),
        observed=(WavePhase.RUNNING, AnalysisPhase.SKIPPED),  # and is not analyzed again
    ),
]

test_decide, test_every_step_comes_to_rest = table_tests(CASES)
