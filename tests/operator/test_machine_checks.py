"""decide(), spec.checks: the calls of every wave ask the agents for the finite check when the
spec does (relayed calls too), and a rollback never does: it returns to weights that served
already, and no gate may refuse it."""

from __future__ import annotations

from machine_kit import (
    CANARY,
    EARLIER,
    ORDER,
    REST,
    TUNING,
    Case,
    called_long_ago,
    canary_done,
    progressing,
    rollout,
    table_tests,
    wave,
)

from ckpt_api.vocabulary import EventReason, Phase
from ckpt_rollout.domain.machine import State
from ckpt_rollout.domain.plan import Plan
from ckpt_rollout.domain.world import Memory

FINITE = {"checks": {"finite": True}}


def asked(plan: Plan) -> list[tuple[str, bool | None, bool]]:
    """(version, checks.finite (None: no checks sent), relayed) of each call, by pod."""
    return [
        (
            c.request.version,
            c.request.checks.finite if c.request.checks else None,
            bool(c.request.source and c.request.source.peer),
        )
        for c in sorted(plan.calls, key=lambda c: c.pod)
    ]


def _canary(spec: dict[str, object]) -> Case:
    checked = spec.get("checks") is not None
    return Case(
        f"the-canary-call-{'asks' if checked else 'does-not-ask'}-for-the-finite-check",
        rollout({"phase": "Progressing", "targetVersion": "v2", "startedAt": EARLIER}, spec=spec),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=Memory(probed=(CANARY, "v1")),
        observe=asked,
        observed=[("v2", True if checked else None, False)],
    )


CASES = [
    _canary(FINITE),
    _canary({}),
    # The member the source feeds (the second in wave order) is the one not relayed.
    canary_done(
        "relayed-calls-of-a-later-wave-ask-for-it-too",
        asked,
        [("v2", True, pod != ORDER[2]) for pod in REST],
        spec=FINITE,
    ),
    Case(
        "a-rollback-call-never-asks-for-it",
        rollout(progressing(wave(0, [CANARY])), spec=FINITE),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        cancels=[(CANARY, "v2")],
        calls=[CANARY],
        events=[EventReason.WORKER_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=called_long_ago(CANARY),
        observe=asked,
        observed=[("v1", None, False)],
    ),
]

test_decide, test_every_step_comes_to_rest = table_tests(CASES)
