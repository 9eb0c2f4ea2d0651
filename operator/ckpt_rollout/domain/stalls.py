"""Workers a rollout waits on that make no progress, with why (ckpt_rollout.domain.troubles),
shown while it lasts: in status.message (after what the rollout is doing), in one Warning event
per pod and cause, and for a called member in its status.workers entry (Pending, the trouble's
reason and message), which `watch` and the dashboard show. Nothing here changes what the rollout
decides: a trouble the operator outwaits still fails the worker only at the worker timeout. Pure."""

from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import EventReason, EventType, Phase, WavePhase, WorkerPhase
from ckpt_api.worker_entries import worker_entry
from ckpt_rollout.domain.plan import Draft
from ckpt_rollout.domain.troubles import STALL_GRACE_S, STALL_REASONS, Trouble
from ckpt_rollout.domain.wording import counted

# What status.message says after the rollout's own message while it waits on a stalled pod.
SEPARATOR = "; waiting on "
_SHOWN = frozenset({Phase.PROGRESSING, Phase.ROLLING_BACK, Phase.PENDING})


def note_stalls(d: Draft) -> None:
    status = d.status
    if status.phase not in _SHOWN:
        return
    rollback = status.rollback if status.phase is Phase.ROLLING_BACK else None
    target = rollback.version if rollback is not None else status.target_version
    stalled: dict[str, Trouble] = {}
    for pod, trouble in sorted(d.memory.troubles.items()):
        if trouble.since is not None and d.now.mono - trouble.since < STALL_GRACE_S:
            d.wake(trouble.since + STALL_GRACE_S - d.now.mono)
            continue
        entry = status.workers.get(pod)
        decided = (
            entry is not None
            and entry.version == target
            and entry.phase in (WorkerPhase.UPDATED, WorkerPhase.FAILED)
        )
        if pod in d.rollout.pods and not decided:
            stalled[pod] = trouble
    called = _called(d)
    _entries(d, target, {p: t for p, t in stalled.items() if p in called}, called)
    for pod, trouble in sorted(d.rollout.stuck.items()):
        stalled.setdefault(pod, trouble)
    base = (status.message or "").split(SEPARATOR)[0]
    message = base
    if stalled:
        pod, trouble = next(iter(stalled.items()))
        more = f" (and {counted(len(stalled) - 1, 'more pod')})" if len(stalled) > 1 else ""
        message = f"{base}{SEPARATOR}{pod}: {trouble.line()}{more}"
    if message != (status.message or ""):
        d.set(message=message)
    for pod, trouble in stalled.items():
        key = f"stalled:{pod}/{trouble.reason}"
        if key in d.memory.announced or key in d.plan.announced:
            continue
        d.plan.announced.append(key)
        d.event(EventType.WARNING, EventReason.WORKER_STALLED, f"{pod}: {trouble.line()}"[:1000])


def _called(d: Draft) -> dict[str, int]:
    """Pods called and not yet settled, with the status.waves index of their call."""
    status = d.status
    if status.phase is Phase.ROLLING_BACK and status.rollback is not None:
        return dict.fromkeys(status.rollback.called, len(status.waves))
    return {
        p: i
        for i, w in enumerate(status.waves)
        if w.phase in (WavePhase.RUNNING, WavePhase.ANALYZING)
        for p in w.called
    }


def _entries(d: Draft, target: str | None, stalled: dict[str, Trouble], called: dict[str, int]) -> None:
    """A Pending entry naming the trouble for each stalled member that has no entry of its own
    (an agent's report replaces it); the entries of troubles that passed go."""
    entries: dict[str, WorkerStatus | None] = {}
    for pod, entry in d.status.workers.items():
        if pod not in stalled and entry.phase is WorkerPhase.PENDING and entry.reason in STALL_REASONS:
            entries[pod] = None
    for pod, trouble in stalled.items():
        current = d.status.workers.get(pod)
        if current is not None and (current.phase is not WorkerPhase.PENDING or current.version != target):
            continue
        if current is not None and (current.reason, current.message) == (trouble.reason, trouble.message):
            continue
        entries[pod] = worker_entry(
            version=target,
            phase=WorkerPhase.PENDING,
            reason=trouble.reason,
            message=trouble.message,
            last_transition_time=d.now.stamp,
            wave=called[pod],
        )
    if entries:
        d.set_workers(entries)
