"""The reconcile machine: ``decide(rollout, memory, tuning, now) -> Plan``. Pure; table-tested.

Each step classifies the CR into a state and runs that state's transition; transitions that
need no I/O chain within the step (a new version starts, its first wave is planned and its
canary called in one status write). All progress lives in the CR status, so a restarted
operator resumes where the last one stopped: wave membership and the pods about to be called
are in the status the executor writes *before* it makes the calls.

States: RetryIgnored (a retry annotation that came when there was nothing to retry), Conflict
(stalled on an older overlapping CR), Start (a new spec.version, possibly superseding one in
flight), Retry (the same version again after Failed or RolledBack, asked for with the retry
annotation), RollingBack, Done (terminal; Succeeded corrects drift), Abort,
Deadline, NoWorkers, Advance (pause/promote, waves, analysis, drift waves, finish).

Analysis (spec.strategy.analysis): a spec wave whose workers settled within the budget is
Analyzing before it completes; its transitions are ckpt_rollout.domain.analyzing's.
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
from ckpt_rollout.domain import analyzing
from ckpt_rollout.domain.conditions import Verdict
from ckpt_rollout.domain.drive import Target, cancel_loads, fold_heard, fold_settled
from ckpt_rollout.domain.gang import drive_units
from ckpt_rollout.domain.outcomes import Outcome, failed_workers, loaded, transfer_split
from ckpt_rollout.domain.pinning import unpinned_note
from ckpt_rollout.domain.plan import (
    Draft,
    Measure,
    Plan,
    Probe,
    Rollout,
    spec_wave_name,
    unit_word,
    updated_replicas,
    wave_name,
)
from ckpt_rollout.domain.planning import failure_budget, plan_wave, rollout_order
from ckpt_rollout.domain.selectors import selectors_overlap
from ckpt_rollout.domain.stalls import note_stalls
from ckpt_rollout.domain.wording import counted
from ckpt_rollout.domain.world import Memory, Now, Peer, Tuning, parse_time

# Failures after which the worker may still end up on the new version: roll those back too.
_UNCERTAIN_FAILURES = frozenset({WorkerReason.WORKER_TIMEOUT, WorkerReason.AGENT_UNREACHABLE})
_MAX_TRANSITIONS = 8  # a step chains at most this many (each one advances the state)


class State(Enum):
    RETRY_IGNORED = auto()
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
    fold_settled(d)
    for _ in range(_MAX_TRANSITIONS):
        state = classify(d)
        if not TRANSITIONS[state](d):
            break
    if state is not State.CONFLICT:  # a stalled pod is another rollout's to show
        note_stalls(d)
    if d.status.phase is Phase.PROGRESSING and (remaining := deadline_remaining(d)) is not None:
        d.wake(remaining + 1)  # the deadline passes even if nothing else happens
    return d.finish()


def classify(d: Draft) -> State:
    status, spec = d.status, d.spec
    retry = pending_retry(d)
    # A retry is for the version that had ended Failed or RolledBack when it was asked for.
    # Kept for later, it would restart a rollout that fails afterwards, which nobody asked for.
    if retry and (status.phase not in FAILED_PHASES or status.target_version != spec.version):
        return State.RETRY_IGNORED
    if conflicting_peer(d) is not None:
        return State.CONFLICT
    if status.target_version != spec.version:
        return State.START
    if status.phase is Phase.ROLLING_BACK:
        return State.ROLLING_BACK
    if retry:
        return State.RETRY
    if status.phase in TERMINAL_PHASES:
        return State.DONE
    if abort_requested(d):
        return State.ABORT
    if deadline_exceeded(d):
        return State.DEADLINE
    if not d.rollout.units and not status.waves:
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


def pending_retry(d: Draft) -> str | None:
    """The retry annotation's value, unless this rollout already acted on it or ignored it."""
    token = d.rollout.meta.annotations.get(RETRY_ANNOTATION)
    if not token or token == d.status.retried:
        return None
    return token


def _retry(d: Draft) -> bool:
    """The same version from the start: pods already serving it answer "already live"."""
    ended = d.status.phase
    d.set(retried=pending_retry(d))
    return _start(d, why=f"retrying after {ended}")


def _ignore_retry(d: Draft) -> bool:
    """Recorded as seen (status.retried), so it never fires later, and a Warning says why; the
    annotation itself is the user's to remove, as promote's and abort's are."""
    token = pending_retry(d)
    if d.status.phase in FAILED_PHASES:  # and so spec.version has changed
        why = f"spec.version is now {d.spec.version}, which rolls out as a new version"
    else:
        why = f"phase is {d.status.phase or Phase.PENDING}; only a Failed or RolledBack rollout is retried"
    d.set(retried=token)
    d.event(EventType.WARNING, EventReason.RETRY_IGNORED, f"retry {token} ignored: {why}")
    return True


def _start(d: Draft, why: str = "") -> bool:
    status, spec = d.status, d.spec
    superseding = status.phase in (Phase.PROGRESSING, Phase.PAUSED)
    old_target = status.target_version
    previous = status.stable_version or status.previous_version
    pods, waves_ = counted(len(d.rollout.units), unit_word(d)), counted(len(spec.strategy.waves), "wave")
    message = f"rolling out {spec.version} to {pods} in {waves_}"
    waves: list[WaveStatus] = []
    if why:
        message = f"{why}: {message}"
    if superseding:
        cancel_loads(d, old_target)
        message = f"{old_target} superseded by {spec.version}; " + message
        # Pods the superseded rollout already called get the newest version first.
        catch_up = sorted({p for w in status.waves for p in w.called} & set(d.rollout.units))
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
        promote_at_start=d.rollout.meta.annotations.get(PROMOTE_ANNOTATION),
        abort_at_start=d.rollout.meta.annotations.get(ABORT_ANNOTATION),
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
    new = sorted(set(d.rollout.units) - {p for w in d.status.waves for p in w.pods})
    if not new:
        return False
    d.event(
        EventType.NORMAL,
        EventReason.DRIFT_CORRECTION,
        f"bringing {d.spec.version} to {counted(len(new), 'new pod')}",
    )
    _add_wave(d, WaveKind.DRIFT, new, "appeared after the rollout")
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
    return d.spec.timeouts.progress_deadline_seconds - (d.now.wall - started - paused_total(d))


def _deadline(d: Draft) -> bool:
    message = f"no completion within {d.spec.timeouts.progress_deadline_seconds}s (paused time excluded)"
    return _fail(d, RolloutReason.PROGRESS_DEADLINE_EXCEEDED, message)


def abort_requested(d: Draft) -> bool:
    """Whether the abort annotation aborts this rollout. It outlives the rollout it was written
    for, and the same version may roll out again later: "<startedAt>@<version>" (what `ckpt-rollout
    abort` writes) names the rollout by its status.startedAt; a bare "<version>" (by hand, older
    CLIs) counts only if it changed since this rollout started (status.abortAtStart)."""
    value = d.rollout.meta.annotations.get(ABORT_ANNOTATION)
    if not value:
        return False
    started, _, version = value.rpartition("@")
    if version != d.spec.version:
        return False
    if started:
        return started == d.status.started_at
    return value != d.status.abort_at_start


def _abort(d: Draft) -> bool:
    _end_pause(d)
    cancel_loads(d, d.status.target_version)
    _start_rollback(d, RolloutReason.ABORTED, "aborted by user")
    return True


def _fail(d: Draft, reason: str, message: str) -> bool:
    _end_pause(d)
    cancel_loads(d, d.status.target_version)
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


# "<wave>@<version>" (what `ckpt-rollout promote` writes) or a bare "<wave>" (by hand, older CLIs).
# ASCII digits only: str.isdigit() also accepts "²", which int() refuses. Versions never hold "@".
_PROMOTE_VALUE = re.compile(r"([0-9]+)(?:@(.*))?")


def paused_total(d: Draft) -> float:
    """Seconds this rollout has been paused, the pause going on now included."""
    paused = d.status.paused_seconds or 0.0
    began = parse_time(d.status.paused_at)
    if began is not None:
        paused += d.now.wall - began
    return paused


def _end_pause(d: Draft) -> None:
    """The paused time so far joins pausedSeconds (with no pause going on, nothing changes)."""
    d.set(paused_at=None, paused_seconds=paused_total(d))


def pause_reason(d: Draft, running: int | None) -> str | None:
    """Why the rollout holds now (its status.message while it does), or None."""
    waves = d.status.waves
    if d.spec.paused:
        if running is not None:
            where = f"during {wave_name(d, waves[running])}"
        elif waves:
            where = f"after {wave_name(d, waves[-1])}"
        else:
            where = f"before {spec_wave_name(d, 0)}"
        return f"paused {where}: spec.paused is true"
    if running is not None:
        return None  # a pauseAfterWave holds once its wave is done
    last = _spec_done(d) - 1
    if last < 0 or last not in d.spec.strategy.pause_after_wave:
        return None
    promoted = promoted_past(d)
    if promoted is not None and promoted >= last:
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
    until = f"for {duration}s" if duration else "for promote"
    return f"paused after {spec_wave_name(d, last)} {until}"


def promoted_past(d: Draft) -> int | None:
    """The wave index the promote annotation lets this rollout past, or None. The annotation
    outlives the rollout it was written for, and the next version pauses after the same waves:
    a value naming a version counts only for that version, and a bare one only if it changed
    since this rollout started."""
    value = d.rollout.meta.annotations.get(PROMOTE_ANNOTATION, "")
    match = _PROMOTE_VALUE.fullmatch(value)
    if match is None:
        return None
    wave, version = match.groups()
    if version is None and value == d.status.promote_at_start:
        return None
    if version is not None and version != d.spec.version:
        return None
    return int(wave)


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
    elif reason and d.status.message != reason:
        # Still paused, but where it holds has moved on: the wave it held in has completed.
        d.set(Verdict(Phase.PAUSED, RolloutReason.ROLLOUT_PAUSED, reason), message=reason)
    elif not reason and paused:
        _end_pause(d)
        message = f"resumed after {d.status.paused_seconds:.0f}s paused"
        d.set(
            Verdict(Phase.PROGRESSING, RolloutReason.ROLLOUT_RESUMED, message),
            phase=Phase.PROGRESSING,
            message=message,
        )
        d.event(EventType.NORMAL, EventReason.RESUMED, message)


# -- waves -------------------------------------------------------------------------------------


def _spec_done(d: Draft) -> int:
    return sum(1 for w in d.status.waves if w.kind is WaveKind.SPEC and w.phase is WavePhase.COMPLETED)


_UNFINISHED = (WavePhase.RUNNING, WavePhase.ANALYZING)


def _advance(d: Draft) -> bool:
    waves = d.status.waves
    running = next((i for i, w in enumerate(waves) if w.phase in _UNFINISHED), None)
    reason = pause_reason(d, running)
    _set_paused(d, reason)
    if running is not None:
        if waves[running].phase is WavePhase.ANALYZING:
            return _after_analysis(d, running, analyzing.step(d, running))
        return _run_wave(d, running)
    if reason:
        return False
    spec_done = _spec_done(d)
    if spec_done < len(d.spec.strategy.waves):
        return _start_wave(d, spec_done)
    late = sorted(set(d.rollout.units) - {p for w in waves for p in w.pods})
    if late:
        _add_wave(d, WaveKind.DRIFT, late, "joined during the rollout")
        return True
    _finish(d)
    return False  # pragma: no mutate (True: Done follows, finds no pod left out, and stops)


def _start_wave(d: Draft, spec_index: int) -> bool:
    waves = d.status.waves
    assigned = [p for w in waves for p in w.pods]
    members = plan_wave(
        index=spec_index,
        waves=d.spec.strategy.waves,
        eligible=d.rollout.units,
        assigned=assigned,
        key=_order_key(d),
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
    message = f"{spec_wave_name(d, spec_index)}: {counted(len(members), unit_word(d))}"
    d.add_wave(
        WaveStatus(
            index=len(waves),
            kind=WaveKind.SPEC,
            spec_index=spec_index,
            target=len(set(assigned) & set(d.rollout.units)) + len(members),
            pods=members,
            started_at=d.now.stamp,
        )
    )
    d.set(Verdict(Phase.PROGRESSING, RolloutReason.WAVE_STARTED, message), message=message)
    shown = ", ".join(members[:5]) + (", ..." if len(members) > 5 else "")
    d.event(EventType.NORMAL, EventReason.WAVE_STARTED, f"{message}: {shown}" if members else message)
    return True


def _order_key(d: Draft) -> str:
    """The key of this rollout's pod order (ckpt_rollout.domain.planning.rollout_order)."""
    return f"{d.rollout.meta.uid}/{d.spec.version}"


def _untaken(d: Draft) -> list[str]:
    """Selected pods no wave has taken, in this rollout's order."""
    taken = {p for w in d.status.waves for p in w.pods}
    return rollout_order([p for p in d.rollout.units if p not in taken], _order_key(d))


def _replace_departed(d: Draft, index: int) -> None:
    """Members that went away before they loaded (deleted, evicted, rescheduled) give their places
    to selected pods no wave has taken, so the wave still updates as many pods as it planned: a
    canary replaced mid-load is followed by another canary, not by the next wave."""
    wave = d.status.waves[index]
    workers, pods = d.status.workers, d.rollout.units
    departed = [p for p in wave.pods if p not in pods and not loaded(workers.get(p), d.spec.version)]
    swap = dict(zip(departed, _untaken(d), strict=False))
    if not swap:
        return
    d.set_wave(index, pods=[swap.get(p, p) for p in wave.pods], replaced=[*wave.replaced, *swap])
    d.set_workers(dict.fromkeys(swap))  # what a departed agent said while it shut down
    pairs = ", ".join(f"{new} replaces {old}" for old, new in swap.items())
    message = f"{wave_name(d, wave)}: {pairs} (gone before loading {d.spec.version})"
    d.set(message=message)
    d.event(EventType.NORMAL, EventReason.WAVE_STARTED, message)


def _proven(d: Draft) -> bool:
    """Whether a completed wave of this rollout brought a pod to its version."""
    return any(w.updated for w in d.status.waves if w.phase is WavePhase.COMPLETED)


def _unproven(d: Draft, index: int, failed: list[str], gone: list[str]) -> bool:
    """A wave settled with nobody on a version no wave has proven yet: it never completes so.
    It tries the next pod no wave has taken; with none left, it waits for one to take a departed
    member's place, and when only failures are left (within the budget), the rollout fails."""
    wave = d.status.waves[index]
    label, version, unit = wave_name(d, wave), d.spec.version, unit_word(d)
    untaken = _untaken(d)
    if untaken:
        d.set_wave(index, pods=[*wave.pods, untaken[0]])
        tried = ", ".join(failed)
        message = f"{label}: no {unit} has loaded {version} yet ({tried} failed); {untaken[0]} tries it"
        d.set(message=message)
        d.event(EventType.NORMAL, EventReason.WAVE_STARTED, message)
        return True
    if gone:
        message = (
            f"{label}: no {unit} has loaded {version} yet; waiting for a {unit} to take the place of "
            f"{', '.join(gone)} (gone)"
        )
        d.set(message=message)
        return False
    entry = d.status.workers[failed[0]]
    reason = entry.reason or RolloutReason.WORKER_FAILED
    tried = ", ".join(failed)
    message = f"{label}: no {unit} loaded {version} ({tried} failed) and no other {unit} is left to try it"
    d.set_wave(index, phase=WavePhase.FAILED, completed_at=d.now.stamp, failed=len(failed))
    return _fail(d, reason, message)


def _add_wave(d: Draft, kind: WaveKind, pods: list[str], came: str) -> None:
    """A wave for pods outside the spec's waves; ``came``: when they did."""
    message = f"bringing {d.spec.version} to {counted(len(pods), unit_word(d))} that {came}"
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
    if d.status.waves[index].kind is WaveKind.SPEC:
        _replace_departed(d, index)
    wave = d.status.waves[index]
    target = Target(
        version=d.spec.version,
        members=list(wave.pods),
        called=list(wave.called),
        wave=index,
        kind="wave",  # pragma: no mutate (Target.kind is read nowhere)
        may_call=not d.spec.paused,
    )
    called, outcomes = drive_units(d, target)
    if called != wave.called:
        d.set_wave(index, called=called)
    if outcomes is None:
        return False
    return _complete_wave(d, index, outcomes)


def _complete_wave(d: Draft, index: int, outcomes: dict[str, Outcome]) -> bool:
    workers = d.status.workers
    label = wave_name(d, d.status.waves[index])
    failed_here = [p for p, o in outcomes.items() if o is Outcome.FAILED]
    failures = failed_workers(d.status, d.rollout.units)
    budget = failure_budget(d.spec.failure_policy.max_failures, len(d.rollout.units))
    if len(failures) > budget:
        # With none of its own, earlier failures are over a budget that shrank (a spec edit,
        # fewer pods): name one of those.
        named = failed_here[0] if failed_here else failures[0]
        entry = workers[named]
        reason = entry.reason or RolloutReason.WORKER_FAILED
        detail = f"{reason}: {entry.message}" if entry.message else reason
        earlier = "" if failed_here else " in an earlier wave"
        message = (
            f"{label}: worker {named} failed{earlier} ({detail}); {len(failures)} failed > budget {budget}"
        )
        d.set_wave(index, phase=WavePhase.FAILED, completed_at=d.now.stamp, failed=len(failed_here))
        return _fail(d, reason, message)

    updated = [p for p, o in outcomes.items() if o is Outcome.UPDATED]
    gone = [p for p, o in outcomes.items() if o is Outcome.GONE]
    wave = d.status.waves[index]
    if not updated and wave.kind is WaveKind.SPEC and not _proven(d) and wave.pods:
        return _unproven(d, index, failed_here, gone)
    # Before the entries are folded away: where the wave's bytes came from.
    d.set_wave(index, **transfer_split([workers[p] for p in updated if p in workers]))
    wave = d.status.waves[index]
    departed = len(wave.replaced) + len(gone)
    if d.spec.strategy.analysis is not None and wave.analysis is None and wave.kind is WaveKind.SPEC:
        analyzing.begin(d, index, updated=len(updated), failed=len(failed_here), gone=departed)
        return True  # the first measurement is due now
    d.set_wave(
        index,
        phase=WavePhase.COMPLETED,
        completed_at=d.now.stamp,
        updated=len(updated),
        failed=len(failed_here),
        gone=departed,
    )
    wave = d.status.waves[index]
    # Fold successes into the wave's counter so status stays small for big fleets; failures
    # stay listed for whoever investigates, and what departed members said goes with them.
    followers = d.rollout.replicas.followers
    folded = [m for p in [*updated, *gone] for m in (p, *followers.get(p, ()))]
    d.set_workers({p: None for p in folded if p in workers})
    message = f"{label} completed: {len(updated)} updated"
    if failed_here:
        message += f", {len(failed_here)} failed (within budget {budget})"
    if gone:
        message += f", {len(gone)} gone with no pod left to take their place"
    d.set(message=message)
    d.metric(Measure.WORKERS, len(updated), WorkerResult.UPDATED)
    started = parse_time(wave.started_at)
    if started is not None:
        d.metric(Measure.WAVE_SECONDS, d.now.wall - started)
    d.event(EventType.NORMAL, EventReason.WAVE_COMPLETED, message)
    return True


def _after_analysis(d: Draft, index: int, ending: analyzing.Ending | None) -> bool:
    if ending is None:
        return False
    if ending.failure is not None:
        return _fail(d, RolloutReason.ANALYSIS_FAILED, ending.failure)
    return _run_wave(d, index)


def _finish(d: Draft) -> None:
    message = f"{d.spec.version} is live on {counted(updated_replicas(d.status), unit_word(d))}"
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
    # A replica's followers only staged: its leader's engine is what a rollback puts back.
    followers = d.rollout.replicas.follower_names
    called = {p for w in d.status.waves for p in w.called if p not in followers}

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
    message = f"{message}; rolling {counted(len(members), 'worker')} back to {previous}"
    message += unpinned_note(previous, d.status.manifest_digests)
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
    called, outcomes = drive_units(d, target)
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
        on = counted(len(failed), "worker")
        message = f"rollback to {rollback.version} failed on {on}: {', '.join(failed[:10])}"
        end, verdict = Phase.FAILED, Verdict(Phase.FAILED, RolloutReason.ROLLBACK_FAILED, message)
        event = EventReason.ROLLBACK_FAILED
    else:
        message = f"rolled {counted(back, 'worker')} back to {rollback.version} ({reason})"
        end, verdict = Phase.ROLLED_BACK, Verdict(Phase.ROLLED_BACK, reason, message)
        event = EventReason.ROLLED_BACK
    d.set(verdict, phase=end, rollback=done, completed_at=d.now.stamp, message=message)
    _observe_end(d, end)
    d.event(EventType.WARNING, event, message)
    return False


TRANSITIONS: dict[State, Transition] = {
    State.RETRY_IGNORED: _ignore_retry,
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
