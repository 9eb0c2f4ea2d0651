"""One pod's `status.workers` entry, built in one place by whoever writes it: the pod's agent
(its own report) or the operator (an outcome it pulled, a failure it decided, a stall it saw).
One builder, so that every entry's message is cut the same way."""

from __future__ import annotations

from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import WorkerPhase

# Status objects are read by humans and kubectl; a stack trace or a whole engine reply does not
# belong there.
MAX_MESSAGE = 1024


def clip(message: str) -> str:
    """`message` cut to MAX_MESSAGE characters, marked as cut."""
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


def worker_entry(
    *,
    version: str | None,
    phase: WorkerPhase,
    reason: str,
    message: str,
    last_transition_time: str,
    checksum_verified: bool | None = None,
    bytes: int | None = None,
    seconds: float | None = None,
    live_version: str | None = None,
    wave: int | None = None,
    uid: str | None = None,
    manifest_digest: str | None = None,
    bytes_from_peers: int | None = None,
) -> WorkerStatus:
    """A pod's entry. `version`: the version the entry is about (the one requested);
    `live_version`: what the worker serves now (differs from `version` after a failure);
    `manifest_digest`: of the version loaded, in an Updated entry (a later rollback is pinned to
    it); `wave`: the status.waves index of the call."""
    return WorkerStatus(
        version=version,
        phase=phase,
        reason=reason,
        message=clip(message),
        checksum_verified=checksum_verified,
        bytes=bytes,
        bytes_from_peers=bytes_from_peers,
        seconds=None if seconds is None else round(seconds, 3),
        last_transition_time=last_transition_time,
        live_version=live_version,
        wave=wave,
        uid=uid,
        manifest_digest=manifest_digest,
    )
