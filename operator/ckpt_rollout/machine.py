"""The reconcile machine: ``decide(rollout, memory, tuning, now) -> Plan``. Pure; table-tested.

Each step classifies the CR into a state and runs that state's transition; transitions that
need no I/O chain within the step (a new version starts, its first wave is planned and its
canary called in one status write). All progress lives in the CR status, so a restarted
operator resumes where the last one stopped: wave membership and the pods about to be called
are in the status the executor writes *before* it makes the calls.

States: Conflict (stalled on an older overlapping CR), Start (a new spec.version, possibly
superseding one in flight), Retry (the same version again after Failed or RolledBack, asked for
with the retry annotation), RollingBack, Done (terminal; Succeeded corrects drift), Abort,
Deadline, NoWorkers, Advance (pause/promote, waves, drift waves, finish).
"""

import re
from collections.abc import Callable
from enum import Enum, auto

from ckpt_api.spec import FailureAction, LabelSelector
from ckpt_api.status import RollbackStatus, WaveStatus
from ckpt_api.vocabulary import (
    ABORT_ANNOTATION,
    FAILED_PHASES,
    PROMOTE_ANNOTATION,
    RETRY_ANNOTATION,
    TERMINAL_PHASES,
    EventReason,
    EventType,
    Phase,
    RolloutReason,
    WaveKind,
    WavePhase,
    WorkerPhase,
    WorkerReason,
    WorkerResult,
)
from ckpt_rollout.conditions import Verdict
from ckpt_rollout.drive import Target, drive, fold_heard
from ckpt_rollout.outcomes import Outcome
from ckpt_rollout.plan import Draft, Measure, Plan, Probe, Rollout, derived_counters
from ckpt_rollout.planning import failure_budget, plan_wave
from ckpt_rollout.selectors import selectors_overlap
from ckpt_rollout.world import Memory, Now, Peer, Tuning, parse_time

# Failures after which the worker may still end up on the new version: roll those back too.
_UNCERTAIN_FAILURES = frozenset({WorkerReason.WORKER_TIMEOUT, WorkerReason.AGENT_UNREACHABLE})
_MAX_TRANSITIONS = 8  # a step chains at most this many (each one advances the state)


class State(Enum):
    CONFLICT = auto()
    START = auto()
    RETRY = auto()
    ROLLING_BACK = auto()
    DONE = auto()
    ABORT = auto()
    DEADLINE = auto()
    NO_WORKERS = auto()
    ADVANCE = auto()


def decide(rollout: Rollout, memory: Memory, tuning: Tuning, now: Now) -> Plan:
    d = Draft(rollout, memory, tuning, now)
    fold_heard(d)
    for _ in range(_MAX_TRANSITIONS):
        if not TRANSITIONS[classify(d)](d):
            break
    if d.status.phase is Phase.PROGRESSING and (remaining := deadline_remaining(d)) is not None:
        d.wake(remaining + 1)  # the deadline passes even if nothing else happens
    return d.finish()


def classify(d: Draft) -> State:
    status, spec = d.status, d.spec
    if conflicting_peer(d) is not None:
        return State.CONFLICT
    if status.target_version != spec.version:
        return State.START
    if status.phase is Phase.ROLLING_BACK:
        return State.ROLLING_BACK
    retry = d.rollout.meta.annotations.get(RETRY_ANNOTATION)
    if status.phase in FAILED_PHASES and retry and retry != status.retried:
        return State.RETRY
    if status.phase in TERMINAL_PHASES:
        return State.DONE
    if d.rollout.meta.annotations.get(ABORT_ANNOTATION) == spec.version:
        return State.ABORT
    if deadline_exceeded(d):
        return State.DEADLINE
    if not d.rollout.pods and not status.waves:
        return State.NO_WORKERS
    return State.ADVANCE


# Each transition returns True when the step should re-classify and go on (no I/O planned).
Transition = Callable[[Draft], bool]


# -- selector conflicts ------------------------------------------------------------------------


def conflicting_peer(d: Draft) -> Peer | None:
    meta = d.rollout.meta
    mine = (meta.created, meta.name)
    for peer in d.rollout.peers:
        if peer.name == meta.name or (peer.created, peer.name) > mine:
            continue
        try:
            other = LabelSelector.model_validate(peer.selector)
        except ValueError:
            continue
        if selectors_overlap(d.spec.selector, other):
            return peer
    return None


def _conflict(d: Draft) -> bool:
    peer = conflicting_peer(d)
    assert peer is not None
    message = f"selector overlaps CheckpointRollout {peer.name} (older); no pod is driven by two rollouts"
    if d.status.message != message:
        d.event(EventType.WARNING, EventReason.SELECTOR_CONFLICT, message)
    d.set(
        Verdict(Phase.PENDING, RolloutReason.SELECTOR_CONFLICT, message, stalled=True),
        phase=d.status.phase or Phase.PENDING,
        message=message,
    )
    d.wake(d.tuning.idle_poll_s)  # the other CR's changes reach only its own daemon
    return False


# -- a new version -----------------------------------------------------------------------------


def _retry(d: Draft) -> bool:
    """The same version from the start: pods already serving it answer "already live"."""
    ended = d.status.phase
    d.set(retried=d.rollout.meta.annotations[RETRY_ANNOTATION])
    return _start(d, why=f"retrying after {ended}")


def _start(d: Draft, why: str = "") -> bool:
    status, spec = d.status, d.spec
    superseding = status.phase in (Phase.PROGRESSING, Phase.PAUSED)
    old_target = status.target_version
    previous = status.stable_version or status.previous_version
    message = f"rolling out {spec.version} to {len(d.rollout.pods)} pods in {len(spec.strategy.waves)} waves"
    waves: list[WaveStatus] = []
    if why:
        message = f"{why}: {message}"
    if superseding:
        message = f"{old_target} superseded by {spec.version}; " + message
        # Pods the superseded rollout already called get the newest version first.
        catch_up = sorted({p for w in status.waves for p in w.called} & set(d.rollout.pods))
        if catch_up:
            waves.append(
                WaveStatus(
                    index=0,
                    kind=WaveKind.CATCH_UP,
                    target=len(catch_up),
                    pods=catch_up,
                    started_at=d.now.stamp,
                )
            )
    d.plan.reset_memory = True
    d.memory = Memory()  # the rest of this step sees what the executor's reset will leave
    d.set(
        Verdict(Phase.PROGRESSING, RolloutReason.ROLLOUT_STARTED, message),
        phase=Phase.PROGRESSING,
        target_version=spec.version,
        previous_version=previous,
        superseded_version=old_target if superseding else None,
        waves=waves,
        workers={},
        rollback=None,
        started_at=d.now.stamp,
        completed_at=None,
        paused_at=None,
        paused_seconds=0.0,
        message=message,
    )
    if superseding:
        d.event(EventType.NORMAL, EventReason.SUPERSEDED, message)
    d.event(EventType.NORMAL, EventReason.ROLLOUT_STARTED, message)
    return True


# -- terminal phases ---------------------------------------------------------------------------


def _done(d: Draft) -> bool:
    """After success, pods that appeared since (new or re-created) get the stable version."""
    if d.status.phase is not Phase.SUCCEEDED:
        return False
    new = sorted(set(d.rollout.pods) - {p for w in d.status.waves for p in w.pods})
    if not new:
        return False
    d.event(
        EventType.NORMAL,
        EventReason.DRIFT_CORRECTION,
        f"{len(new)} new pods: bringing them to {d.spec.version}",
    )
    _add_wave(d, WaveKind.DRIFT, new, f"{len(new)} pods appeared after the rollout")
    return True


def _no_workers(d: Draft) -> bool:
    message = "no Running pod with an IP matches the selector"
    d.set(Verdict(Phase.PENDING, RolloutReason.NO_WORKERS, message), phase=Phase.PENDING, message=message)
    return False  # a matching pod's arrival wakes the loop


# -- deadline and abort ------------------------------------------------------------------------


def deadline_exceeded(d: Draft) -> bool:
    remaining = deadline_remaining(d)
    return remaining is not None and remaining < 0


def deadline_remaining(d: Draft) -> float | None:
    """Seconds left of spec.timeouts.progressDeadlineSeconds (paused time excluded)."""
    started = parse_time(d.status.started_at)
    if started is None:
        return None
    now = d.now.wall
    paused = d.status.paused_seconds or 0.0
    paused_at = parse_time(d.status.paused_at)
    if paused_at is not None:
        paused += now - paused_at
    return d.spec.timeouts.progress_deadline_seconds - (now - started - paused)


def _deadline(d: Draft) -> bool:
    message = f"no completion within {d.spec.timeouts.progress_deadline_seconds}s (paused time excluded)"
    return _fail(d, RolloutReason.PROGRESS_DEADLINE_EXCEEDED, message)


def _abort(d: Draft) -> bool:
    _start_rollback(d, RolloutReason.ABORTED, "aborted by user")
    return True


def _fail(d: Draft, reason: str, message: str) -> bool:
    if d.spec.failure_policy.on_failure is FailureAction.ROLLBACK:
        _start_rollback(d, reason, message)
        return True
    d.set(
        Verdict(Phase.FAILED, reason, message), phase=Phase.FAILED, completed_at=d.now.stamp, message=message
    )
    _observe_end(d, Phase.FAILED)
    d.event(EventType.WARNING, EventReason.ROLLOUT_FAILED, message)
    return False


def _observe_end(d: Draft, phase: Phase) -> None:
    started = parse_time(d.status.started_at)
    if started is not None:
        d.metric(Measure.ROLLOUT_SECONDS, d.now.wall - started, phase)


# -- pause and promote -------------------------------------------------------------------------


_PROMOTED_WAVE = re.compile(r"-?[0-9]+")


def pause_reason(d: Draft, spec_done: int) -> str | None:
    if d.spec.paused:
        return "spec.paused is true"
    last = spec_done - 1
    if last < 0 or last not in d.spec.strategy.pause_after_wave:
        return None
    promoted = d.rollout.meta.annotations.get(PROMOTE_ANNOTATION, "")
    # ASCII digits only: str.isdigit() also accepts "²", which int() refuses.
    if _PROMOTED_WAVE.fullmatch(promoted) and int(promoted) >= last:
        return None
    duration = d.spec.strategy.pause_duration_seconds
    paused_at = parse_time(d.status.paused_at)
    if duration and paused_at is not None:
        left = paused_at + duration - d.now.wall
        if left <= 0:
            return None
        d.wake(left)
    elif duration:
        d.wake(duration)
    return f"paused after wave {last + 1} {'for ' + str(duration) + 's' if duration else 'for promote'}"


def _set_paused(d: Draft, reason: str | None) -> None:
    paused = d.status.phase is Phase.PAUSED
    if reason and not paused:
        d.set(
            Verdict(Phase.PAUSED, RolloutReason.ROLLOUT_PAUSED, reason),
            phase=Phase.PAUSED,
            paused_at=d.now.stamp,
            message=reason,
        )
        d.event(EventType.NORMAL, EventReason.PAUSED, reason)
    elif not reason and paused:
        began = parse_time(d.status.paused_at) or d.now.wall
        total = (d.status.paused_seconds or 0.0) + d.now.wall - began
        message = f"resumed after {total:.0f}s paused"
        d.set(
            Verdict(Phase.PROGRESSING, RolloutReason.ROLLOUT_RESUMED, message),
            phase=Phase.PROGRESSING,
            paused_at=None,
            paused_seconds=total,
            message=message,
        )
        d.event(EventType.NORMAL, EventReason.RESUMED, message)


# -- waves -------------------------------------------------------------------------------------


def _spec_done(d: Draft) -> int:
    return sum(1 for w in d.status.waves if w.kind is WaveKind.SPEC and w.phase is WavePhase.COMPLETED)


def _advance(d: Draft) -> bool:
    waves = d.status.waves
    running = next((i for i, w in enumerate(waves) if w.phase is WavePhase.RUNNING), None)
    spec_done = _spec_done(d)
    if running is None:
        reason = pause_reason(d, spec_done)
    else:
        reason = "spec.paused is true" if d.spec.paused else None
    _set_paused(d, reason)
    if running is not None:
        return _run_wave(d, running)
    if reason:
        return False
    if spec_done < len(d.spec.strategy.waves):
        return _start_wave(d, spec_done)
    late = sorted(set(d.rollout.pods) - {p for w in waves for p in w.pods})
    if late:
        _add_wave(d, WaveKind.DRIFT, late, f"{len(late)} pods joined during the rollout")
        return True
    _finish(d)
    return False  # pragma: no mutate (True: Done follows, finds no pod left out, and stops)


def _start_wave(d: Draft, spec_index: int) -> bool:
    waves = d.status.waves
    assigned = [p for w in waves for p in w.pods]
    members = plan_wave(
        index=spec_index,
        waves=d.spec.strategy.waves,
        eligible=d.rollout.pods,
        assigned=assigned,
        key=f"{d.rollout.meta.uid}/{d.spec.version}",
    )
    if not d.status.previous_version and members:
        # First rollout of this CR: ask the canary what it serves, so a rollback has a target.
        probed = d.memory.probed
        if probed is None or probed[0] != members[0]:
            canary = d.rollout.pods[members[0]]
            d.plan.probe = Probe(canary.name, canary.ip, d.spec.agent.port)
            return False
        if probed[1] and probed[1] != d.spec.version:
            d.set(previous_version=probed[1])
    total = len(d.spec.strategy.waves)
    message = f"wave {spec_index + 1}/{total}: {len(members)} pods"
    d.add_wave(
        WaveStatus(
            index=len(waves),
            kind=WaveKind.SPEC,
            spec_index=spec_index,
            target=len(set(assigned) & set(d.rollout.pods)) + len(members),
            pods=members,
            started_at=d.now.stamp,
        )
    )
    d.set(Verdict(Phase.PROGRESSING, RolloutReason.WAVE_STARTED, message), message=message)
    shown = ", ".join(members[:5]) + (", ..." if len(members) > 5 else "")
    d.event(EventType.NORMAL, EventReason.WAVE_STARTED, f"{message}: {shown}")
    return True


def _add_wave(d: Draft, kind: WaveKind, pods: list[str], why: str) -> None:
    message = f"{why}: bringing them to {d.spec.version}"
    d.add_wave(
        WaveStatus(index=len(d.status.waves), kind=kind, target=len(pods), pods=pods, started_at=d.now.stamp)
    )
    d.set(
        Verdict(Phase.PROGRESSING, RolloutReason.WAVE_STARTED, message),
        phase=Phase.PROGRESSING,
        completed_at=None,
        message=message,
    )
    d.event(EventType.NORMAL, EventReason.WAVE_STARTED, message)


def _run_wave(d: Draft, index: int) -> bool:
    wave = d.status.waves[index]
    target = Target(
        version=d.spec.version,
        members=list(wave.pods),
        called=list(wave.called),
        wave=index,
        kind="wave",  # pragma: no mutate (Target.kind is read nowhere)
        may_call=not d.spec.paused,
    )
    called, outcomes = drive(d, target)
    if called != wave.called:
        d.set_wave(index, called=called)
    if outcomes is None:
        return False
    return _complete_wave(d, index, outcomes)


def _complete_wave(d: Draft, index: int, outcomes: dict[str, Outcome]) -> bool:
    workers = d.status.workers
    failed_here = [p for p, o in outcomes.items() if o is Outcome.FAILED]
    failed_total = sum(
        1 for e in workers.values() if e.version == d.spec.version and e.phase is WorkerPhase.FAILED
    )
    budget = failure_budget(d.spec.failure_policy.max_failures, len(d.rollout.pods))
    if failed_total > budget:
        first = failed_here[0] if failed_here else "?"
        entry = workers.get(first)
        reason = (entry.reason if entry else None) or RolloutReason.WORKER_FAILED
        message = (
            f"wave {index + 1}: worker {first} failed ({reason}: {(entry.message if entry else '') or ''}); "
            f"{failed_total} failed > budget {budget}"
        )
        d.set_wave(index, phase=WavePhase.FAILED, completed_at=d.now.stamp, failed=len(failed_here))
        return _fail(d, reason, message)

    updated = [p for p, o in outcomes.items() if o is Outcome.UPDATED]
    gone = [p for p, o in outcomes.items() if o is Outcome.GONE]
    d.set_wave(
        index,
        phase=WavePhase.COMPLETED,
        completed_at=d.now.stamp,
        updated=len(updated),
        failed=len(failed_here),
        gone=len(gone),
    )
    wave = d.status.waves[index]
    # Fold successes into the wave's counter so status stays small for big fleets; failures
    # stay listed for whoever investigates.
    d.set_workers({p: None for p in updated if p in workers})
    label = (
        f"wave {wave.spec_index + 1}/{len(d.spec.strategy.waves)}"
        if wave.spec_index is not None
        else f"{wave.kind} wave"
    )
    message = f"{label} completed: {len(updated)} updated"
    if failed_here:
        message += f", {len(failed_here)} failed (within budget {budget})"
    d.set(message=message)
    d.metric(Measure.WORKERS, len(updated), WorkerResult.UPDATED)
    started = parse_time(wave.started_at)
    if started is not None:
        d.metric(Measure.WAVE_SECONDS, d.now.wall - started)
    d.event(EventType.NORMAL, EventReason.WAVE_COMPLETED, message)
    return True


def _finish(d: Draft) -> None:
    updated = derived_counters(d.status, d.rollout)["updated_replicas"]
    message = f"{d.spec.version} is live on {updated} pods"
    d.set(
        Verdict(Phase.SUCCEEDED, RolloutReason.ROLLOUT_COMPLETED, message),
        phase=Phase.SUCCEEDED,
        stable_version=d.spec.version,
        completed_at=d.now.stamp,
        paused_at=None,
        message=message,
    )
    _observe_end(d, Phase.SUCCEEDED)
    d.event(EventType.NORMAL, EventReason.ROLLOUT_COMPLETED, message)


# -- rollback ----------------------------------------------------------------------------------


def rollback_members(d: Draft) -> list[str]:
    """Every pod this rollout called, but those that surely kept their old weights."""
    workers = d.status.workers
    called = {p for w in d.status.waves for p in w.called}

    def kept_old_weights(pod: str) -> bool:
        entry = workers.get(pod)
        return (
            entry is not None
            and entry.version == d.spec.version
            and entry.phase is WorkerPhase.FAILED
            and entry.reason not in _UNCERTAIN_FAILURES
        )

    return sorted(p for p in called if not kept_old_weights(p))


def _start_rollback(d: Draft, reason: str, message: str) -> None:
    previous = d.status.previous_version
    if not previous:
        message += "; no previous version is known, so nothing can be rolled back"
        d.set(
            Verdict(Phase.FAILED, reason, message),
            phase=Phase.FAILED,
            completed_at=d.now.stamp,
            message=message,
        )
        d.event(EventType.WARNING, EventReason.ROLLOUT_FAILED, message)
        return
    members = rollback_members(d)
    message = f"{message}; rolling {len(members)} workers back to {previous}"
    d.set(
        Verdict(Phase.ROLLING_BACK, reason, message),
        phase=Phase.ROLLING_BACK,
        rollback=RollbackStatus(version=previous, reason=reason, pods=members, started_at=d.now.stamp),
        message=message,
    )
    d.event(EventType.WARNING, EventReason.ROLLBACK_STARTED, message)


def _rolling_back(d: Draft) -> bool:
    rollback = d.status.rollback
    assert rollback is not None  # set with the phase
    target = Target(
        version=rollback.version,
        members=list(rollback.pods),
        called=list(rollback.called),
        wave=len(d.status.waves),
        kind="rollback",  # pragma: no mutate (Target.kind is read nowhere)
    )
    called, outcomes = drive(d, target)
    if called != rollback.called:
        rollback = rollback.model_copy(update={"called": called})
        d.set(rollback=rollback)
    if outcomes is None:
        return False
    failed = sorted(p for p, o in outcomes.items() if o is Outcome.FAILED)
    back = sum(1 for o in outcomes.values() if o is Outcome.UPDATED)
    d.metric(Measure.WORKERS, back, WorkerResult.ROLLED_BACK)
    reason = rollback.reason or RolloutReason.ROLLED_BACK
    done = rollback.model_copy(
        update={"phase": WavePhase.FAILED if failed else WavePhase.COMPLETED, "completed_at": d.now.stamp}
    )
    if failed:
        message = f"rollback to {rollback.version} failed on {len(failed)} workers: {', '.join(failed[:10])}"
        end, verdict = Phase.FAILED, Verdict(Phase.FAILED, RolloutReason.ROLLBACK_FAILED, message)
        event = EventReason.ROLLBACK_FAILED
    else:
        message = f"rolled {back} workers back to {rollback.version} ({reason})"
        end, verdict = Phase.ROLLED_BACK, Verdict(Phase.ROLLED_BACK, reason, message)
        event = EventReason.ROLLED_BACK
    d.set(verdict, phase=end, rollback=done, completed_at=d.now.stamp, message=message)
    _observe_end(d, end)
    d.event(EventType.WARNING, event, message)
    return False


TRANSITIONS: dict[State, Transition] = {
    State.CONFLICT: _conflict,
    State.START: _start,
    State.RETRY: _retry,
    State.ROLLING_BACK: _rolling_back,
    State.DONE: _done,
    State.ABORT: _abort,
    State.DEADLINE: _deadline,
    State.NO_WORKERS: _no_workers,
    State.ADVANCE: _advance,
}
