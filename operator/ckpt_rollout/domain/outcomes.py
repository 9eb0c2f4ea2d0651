"""What a worker's reports say about its load of the target version. Pure; table-tested."""

from collections.abc import Container, Sequence
from enum import Enum, auto

from ckpt_api.agent_api import AgentStatus
from ckpt_api.status import CheckpointRolloutStatus, WorkerStatus
from ckpt_api.vocabulary import AgentState, WorkerPhase, WorkerReason


class Outcome(Enum):
    """The operator's reading of one worker (never written: status says WorkerPhase)."""

    UNCALLED = auto()
    WAITING = auto()
    UPDATED = auto()
    FAILED = auto()
    GONE = auto()
    LOST = auto()  # the agent never got (or forgot) our call: call again


DECIDED = frozenset({Outcome.UPDATED, Outcome.FAILED, Outcome.GONE})


def reported_outcome(entry: WorkerStatus | None, *, target: str, present: bool, called: bool) -> Outcome:
    """Outcome from the CR's ``status.workers`` entry (the agent's push or the operator's pull).

    A load that succeeded counts even once its pod has gone: the version was proven. A worker
    whose pod has gone (or is being deleted: the pod cache drops it then) is gone whatever else
    its agent reported: a drain or an eviction cancels the load as the agent shuts down, which
    says nothing about the version. A load cancelled on a pod still selected is not decided
    either: its agent stopped (a container restart), and the pull finds out what it serves."""
    if loaded(entry, target):
        return Outcome.UPDATED
    if present and entry is not None and settles(entry, target):
        return Outcome.FAILED
    if not present:
        return Outcome.GONE
    return Outcome.WAITING if called else Outcome.UNCALLED


def loaded(entry: WorkerStatus | None, version: str | None) -> bool:
    """Whether ``entry`` says its worker loaded ``version``."""
    return entry is not None and entry.version == version and entry.phase is WorkerPhase.UPDATED


def settles(entry: WorkerStatus, version: str | None) -> bool:
    """Whether ``entry`` decides the load of ``version``: it loaded, or it failed for a reason
    other than its agent shutting down."""
    if entry.phase is WorkerPhase.FAILED:
        return entry.version == version and entry.reason != WorkerReason.CANCELLED
    return loaded(entry, version)


def failed_workers(status: CheckpointRolloutStatus, selected: Container[str]) -> list[str]:
    """The selected pods whose load of the target version failed (a pod gone since is gone, not
    failed: failures count against the budget only while their pods are in the fleet)."""
    return sorted(
        name
        for name, entry in status.workers.items()
        if name in selected and entry.phase is WorkerPhase.FAILED and settles(entry, status.target_version)
    )


def pulled_outcome(agent_status: AgentStatus, *, target: str) -> tuple[Outcome, str, str]:
    """Outcome from the agent's ``GET /v1/status`` (the pull fallback): (outcome, reason, message)."""
    error = agent_status.last_error
    if agent_status.state == AgentState.LOADING:
        return Outcome.WAITING, "", ""
    if agent_status.version == target:
        reason = WorkerReason.STAGED if agent_status.staged else WorkerReason.LOADED
        return Outcome.UPDATED, reason, "confirmed by the agent's /v1/status"
    if error is not None and error.version == target:
        if error.reason == WorkerReason.CANCELLED:
            return Outcome.WAITING, "", ""  # its agent is stopping: whether its pod goes decides
        return Outcome.FAILED, error.reason or WorkerReason.LOAD_FAILED, error.message
    return Outcome.LOST, "", ""


def transfer_split(entries: Sequence[WorkerStatus]) -> dict[str, int | None]:
    """Where the bytes of a wave's updated members came from, as WaveStatus fields; None when
    no entry says (agents that report no byte counts)."""
    known = [e for e in entries if e.bytes is not None]
    if not known:
        return {"bytes_from_source": None, "bytes_from_peers": None}
    total = sum(e.bytes or 0 for e in known)
    peers = sum(min(e.bytes_from_peers or 0, e.bytes or 0) for e in known)
    return {"bytes_from_source": total - peers, "bytes_from_peers": peers}
