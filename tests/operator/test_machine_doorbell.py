"""decide(), pulled waves with a doorbell: a member whose pod's WeightsReady condition says
Loading is not pulled on the clock; the condition's next change is worth a pull at once; a
condition that never changes leaves the pull schedule as it was.
One row per situation, with the plan it must produce."""

from __future__ import annotations

import dataclasses

from machine_kit import BIG, NOW, TUNING, Case, progressing, rollout, table_tests, wave

from ckpt_api.vocabulary import Phase, WeightsReadyReason
from ckpt_rollout.controller.executor import remember
from ckpt_rollout.domain.machine import State, decide
from ckpt_rollout.domain.plan import Plan, Pull, Rollout
from ckpt_rollout.domain.world import Memory, WeightsSignal

LOADING = WeightsSignal(False, WeightsReadyReason.LOADING, "loading v2")
LOADED = WeightsSignal(True, WeightsReadyReason.LOADED, "serving v2")
STALE = WeightsSignal(True, WeightsReadyReason.LOADED, "serving v1")
RUNG = BIG[3]
EVERY = 2.0  # called 4 s ago: pulled every half of that


def signalled(signals: dict[str, WeightsSignal | None]) -> Rollout:
    """A pulled wave of BIG, every member called, each pod with its WeightsReady condition."""
    base = rollout(progressing(wave(0, BIG)), pods=BIG, spec={"strategy": {"waves": ["100%"]}})
    pods = {n: dataclasses.replace(p, weights=signals.get(n)) for n, p in base.pods.items()}
    return dataclasses.replace(base, pods=pods)


def called(ago: float, **more: object) -> Memory:
    return Memory(call_times=dict.fromkeys(BIG, NOW.mono - ago), **more)  # type: ignore[arg-type]


def row(id_: str, signals: dict[str, WeightsSignal | None], **more: object) -> Case:
    """A step of a pulled wave still loading, its pods' conditions as ``signals`` say."""
    return Case(id_, signalled(signals), State.ADVANCE, Phase.PROGRESSING, **more)  # type: ignore[arg-type]


def listens(plan: Plan) -> bool:
    """Whether a WeightsReady change is worth a look before the plan's wake-up."""
    return plan.doorbell


def asked(signal: WeightsSignal | None) -> dict[str, WeightsSignal | None]:
    return dict.fromkeys(BIG, signal)


CASES = [
    row(
        "members-whose-condition-says-loading-are-not-pulled-on-the-clock",
        dict.fromkeys(BIG, LOADING),
        wake=EVERY,  # looked at again on the schedule, to hear a doorbell
        memory=called(4, asked=asked(None)),
        observe=listens,
        observed=True,
    ),
    *(
        row(
            f"a-member-whose-condition-says-the-load-ended-is-pulled-at-once-alone-{when}",
            {**dict.fromkeys(BIG, LOADING), RUNG: LOADED},
            pulls=[RUNG],
            wake=EVERY,
            memory=memory,
            observe=listens,
            observed=True,  # the others load on
        )
        for when, memory in (
            ("after-its-call", called(4, asked=asked(None))),
            # Its schedule says in 1.9 s; the others, pulled as it, say Loading still.
            (
                "before-its-schedule",
                called(4, asked=asked(LOADING), last_pull=dict.fromkeys(BIG, NOW.mono - 0.1)),
            ),
        )
    ),
    row(
        "a-member-loading-for-pull-loading-s-is-pulled-all-the-same",
        dict.fromkeys(BIG, LOADING),
        pulls=BIG,  # should the write that rings have been lost
        wake=TUNING.pull_every_s,
        memory=called(TUNING.pull_loading_s + 1, asked=asked(None)),
        observe=listens,
        observed=False,
    ),
    row(
        "a-loading-member-is-looked-at-again-when-its-slow-schedule-is-due",
        dict.fromkeys(BIG, LOADING),
        wake=1.0,  # called 29 s ago: pulled every 3 s, but in 1 s all the same
        memory=called(TUNING.pull_loading_s - 1, asked=asked(None)),
        observe=listens,
        observed=True,
    ),
    row(
        "the-slow-schedule-runs-from-the-last-pull",
        dict.fromkeys(BIG, LOADING),
        wake=TUNING.pull_every_s,
        memory=called(
            TUNING.pull_loading_s + 1, asked=asked(None), last_pull=dict.fromkeys(BIG, NOW.mono - 5)
        ),
    ),
    row(
        "an-unchanged-condition-leaves-the-pull-schedule",
        dict.fromkeys(BIG, STALE),  # an agent that does not write it
        wake=0.5,  # called 4 s ago: every 2 s, and the last pull was 1.5 s ago
        memory=called(4, asked=asked(STALE), last_pull=dict.fromkeys(BIG, NOW.mono - 1.5)),
        observe=listens,
        observed=False,
    ),
    row(
        "unasked-members-after-a-restart-are-pulled-at-once",
        dict.fromkeys(BIG, LOADING),
        pulls=BIG,  # whether they saw the call is unknown
        wake=TUNING.pull_first_s,
        observe=listens,
        observed=False,
    ),
]

test_decide, test_every_step_comes_to_rest = table_tests(CASES)


def test_the_conditions_are_noted_as_they_were_when_the_agents_were_asked() -> None:
    given = signalled({BIG[0]: LOADED, BIG[1]: LOADING})
    wave_start = rollout(progressing(), pods=BIG, spec={"strategy": {"waves": ["100%"]}})
    first = decide(wave_start, Memory(), TUNING, NOW)
    assert not first.reset_memory
    memory = Memory(asked={BIG[2]: STALE})
    pulls = [Pull(n, "10.9.9.9", 8089, "v2", 0) for n in (BIG[1], "gone")]
    plan = dataclasses.replace(first, calls=[c for c in first.calls if c.pod == BIG[0]], pulls=pulls)
    remember(memory, plan, NOW.mono, given.pods)
    # Called, pulled, or no longer a pod (nothing known); not asked this step: as it was.
    assert memory.asked == {BIG[0]: LOADED, BIG[1]: LOADING, "gone": None, BIG[2]: STALE}
