"""A worker the rollout waits on that makes no progress is shown with its cause while it lasts
(ckpt_rollout.domain.stalls): in status.message, one Warning event per pod and cause, and for a
called member its status.workers entry; what the rollout decides does not change."""

from __future__ import annotations

import dataclasses

from machine_kit import (
    CANARY,
    EARLIER,
    NOW,
    STAMP,
    TUNING,
    called_long_ago,
    called_now,
    done,
    entry,
    progressing,
    rollout,
    wave,
    written,
)

from ckpt_api.vocabulary import EventReason, Phase, WorkerPhase
from ckpt_rollout.controller.executor import remember
from ckpt_rollout.domain.machine import decide
from ckpt_rollout.domain.mergepatch import merge_diff
from ckpt_rollout.domain.plan import Plan, Rollout
from ckpt_rollout.domain.troubles import STALL_GRACE_S, Trouble
from ckpt_rollout.domain.world import Memory

AUTH = Trouble("AuthUnavailable", "the agent cannot check the operator's token (calling again): unavailable")
PULL = Trouble("ImagePullBackOff", "container agent: the image cannot be pulled")
CANARY_WAVE = progressing(wave(0, [CANARY]), message="wave 1/2: 1 pod")


def _waiting_on_the_canary(trouble: Trouble = AUTH) -> Memory:
    # The call was answered with the trouble: it is made again once busy_until has passed.
    return called_now(CANARY, troubles={CANARY: trouble}, busy_until={CANARY: NOW.mono + 1})


def _warnings(plan: Plan) -> list[str]:
    return [e.message for e in plan.events if e.reason is EventReason.WORKER_STALLED]


def test_a_member_whose_agent_cannot_check_the_token_is_shown_waiting_with_the_cause() -> None:
    memory = _waiting_on_the_canary()
    plan = decide(rollout(CANARY_WAVE), memory, TUNING, NOW)
    line = f"{CANARY}: AuthUnavailable: {AUTH.message}"
    assert plan.status.message == f"wave 1/2: 1 pod; waiting on {line}"
    assert _warnings(plan) == [line]
    canary = plan.status.workers[CANARY]
    assert (canary.version, canary.phase, canary.reason, canary.message, canary.wave) == (
        "v2",
        WorkerPhase.PENDING,
        "AuthUnavailable",
        AUTH.message,
        0,
    )
    # Still waiting: no failure, no call before busy_until, the wave still runs.
    assert (plan.status.phase, plan.calls, plan.status.failed_replicas) == (Phase.PROGRESSING, [], 0)


def test_the_next_steps_write_nothing_new_and_warn_once() -> None:
    memory = _waiting_on_the_canary()
    first = decide(rollout(CANARY_WAVE), memory, TUNING, NOW)
    remember(memory, first, NOW.mono)
    after = rollout(written(first))
    second = decide(after, memory, TUNING, NOW)
    assert merge_diff(after.status.to_wire(), second.status.to_wire()) == {}
    assert _warnings(second) == []


def test_once_the_trouble_passes_the_message_and_the_entry_are_as_before() -> None:
    memory = _waiting_on_the_canary()
    first = decide(rollout(CANARY_WAVE), memory, TUNING, NOW)
    remember(memory, first, NOW.mono)
    memory.troubles.clear()  # the call went through
    second = decide(rollout(written(first)), memory, TUNING, NOW)
    assert second.status.message == "wave 1/2: 1 pod"
    assert CANARY not in second.status.workers


def test_a_member_whose_outcome_is_known_is_not_shown_waiting() -> None:
    status = progressing(
        wave(0, [CANARY]), message="wave 1/2: 1 pod", workers={CANARY: entry("v2", "Loading", "Loading")}
    )
    memory = _waiting_on_the_canary()
    plan = decide(rollout(status), memory, TUNING, NOW)
    # The agent's own entry stays; the message names the trouble of a later call or pull.
    assert plan.status.workers[CANARY].phase is WorkerPhase.LOADING
    assert "waiting on" in (plan.status.message or "")
    failed = progressing(
        wave(0, [CANARY]), message="m", workers={CANARY: entry("v2", "Failed", "ChecksumMismatch")}
    )
    plan = decide(rollout(failed), _waiting_on_the_canary(), TUNING, NOW)
    assert _warnings(plan) == []
    assert "waiting on" not in (plan.status.message or "")


def _stuck(given: Rollout, **stuck: Trouble) -> Rollout:
    return dataclasses.replace(given, stuck=stuck)


def test_with_no_running_pod_the_pods_that_cannot_start_are_named() -> None:
    plan = decide(_stuck(rollout(pods=[]), **{"w-0": PULL, "w-1": PULL}), Memory(), TUNING, NOW)
    assert plan.status.phase is Phase.PENDING
    assert plan.status.message == (
        "no Running pod with an IP matches the selector; waiting on w-0: ImagePullBackOff: "
        "container agent: the image cannot be pulled (and 1 more pod)"
    )
    assert _warnings(plan) == [f"{p}: ImagePullBackOff: {PULL.message}" for p in ("w-0", "w-1")]
    assert plan.status.workers == {}, "a pod that is not Running has no entry"


def test_a_rollback_shows_its_members_troubles_against_the_rollback_version() -> None:
    status = progressing(
        wave(0, [CANARY]),
        phase="RollingBack",
        message="rolling back",
        rollback={
            "version": "v1",
            "reason": "Aborted",
            "pods": [CANARY],
            "called": [CANARY],
            "startedAt": EARLIER,
        },
    )
    plan = decide(rollout(status), _waiting_on_the_canary(), TUNING, NOW)
    assert plan.status.message == f"rolling back; waiting on {CANARY}: AuthUnavailable: {AUTH.message}"
    canary = plan.status.workers[CANARY]
    assert (canary.version, canary.wave, canary.last_transition_time) == ("v1", 1, STAMP)


def test_a_finished_rollout_shows_none() -> None:
    status = progressing(done(0, [CANARY]), phase="Succeeded", message="v2 is live on 1 pod")
    finished = _stuck(rollout(status, pods=[CANARY]), **{"w-9": PULL})
    plan = decide(finished, _waiting_on_the_canary(), TUNING, NOW)
    assert plan.status.message == "v2 is live on 1 pod"
    assert _warnings(plan) == []


def test_a_trouble_just_met_is_shown_once_it_lasts() -> None:
    """An agent still starting answers nothing for a moment: no news until STALL_GRACE_S."""
    just = dataclasses.replace(AUTH, since=NOW.mono - 1)
    plan = decide(rollout(CANARY_WAVE), _waiting_on_the_canary(just), TUNING, NOW)
    assert (plan.status.message, _warnings(plan), plan.status.workers) == ("wave 1/2: 1 pod", [], {})
    assert plan.wake_after is not None
    assert plan.wake_after <= STALL_GRACE_S - 1
    lasting = dataclasses.replace(AUTH, since=NOW.mono - STALL_GRACE_S)
    plan = decide(rollout(CANARY_WAVE), _waiting_on_the_canary(lasting), TUNING, NOW)
    assert _warnings(plan) == [f"{CANARY}: AuthUnavailable: {AUTH.message}"]


def test_a_worker_that_times_out_says_what_last_held_it_up() -> None:
    memory = called_long_ago(CANARY)
    memory.troubles[CANARY] = AUTH
    plan = decide(rollout(CANARY_WAVE), memory, TUNING, NOW)
    canary = plan.status.workers[CANARY]
    assert (canary.phase, canary.reason) == (WorkerPhase.FAILED, "WorkerTimeout")
    assert canary.message == f"no outcome within 600s (last: AuthUnavailable: {AUTH.message})"
