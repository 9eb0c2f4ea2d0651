"""The pure parts of `ckpt-rollout release` (ckpt_rollout.tools.client): where a CheckpointRollout
takes its target version from, where to publish for its source, the patch that sets the
version, what a status says about the version released, and the one-line summary.

A status is read for the released version only: until the operator picks the new target up,
status.targetVersion still names the old one, whose Failed or Succeeded says nothing about
ours. The one verdict that does not wait for the target is a fresh Stalled (a selector
conflict, an unreadable versionFrom): the operator will not start the version until a user
fixes the CR, so waiting for it would only end in a timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from ckpt_api.vocabulary import FAILED_PHASES, ConditionStatus, ConditionType, Phase, WorkerPhase
from ckpt_rollout.domain.wording import counted
from ckpt_rollout.tools.views import human_bytes, transfer_split

# Who wrote spec.version, in managedFields: what a GitOps ignore rule or a no-revert check names.
FIELD_MANAGER = "ckpt-rollout-release"
# Schemes a source serves from a directory (`ckpt-rollout serve ROOT`, also with --mooncake).
SERVED_SCHEMES = frozenset({"http", "https", "mooncake"})


@dataclass(frozen=True)
class SpecVersion:
    """The CR holds its version in spec.version (patched); ``pinned``: it also pins
    spec.source.manifestDigest, which must then follow the version."""

    pinned: bool


@dataclass(frozen=True)
class ConfigMapKey:
    """The CR reads its version from this ConfigMap key (spec.versionFrom.configMapKeyRef)."""

    name: str
    key: str


VersionTarget = SpecVersion | ConfigMapKey


def version_target(obj: dict[str, Any]) -> VersionTarget:
    """Where ``obj`` takes its target version from. ValueError for a CR release cannot drive."""
    spec = obj.get("spec") or {}
    source = spec.get("source") or {}
    ref = (spec.get("versionFrom") or {}).get("configMapKeyRef")
    if ref is None:
        return SpecVersion(pinned=bool(source.get("manifestDigest")))
    if source.get("manifestDigest"):
        # The ConfigMap carries only the version: every new version would fail the old pin.
        raise ValueError(
            "it takes its version from a ConfigMap (spec.versionFrom) but pins spec.source.manifestDigest, "
            "which a new version cannot match; drop the pin or use spec.version"
        )
    return ConfigMapKey(name=str(ref.get("name")), key=str(ref.get("key")))


def publish_dir(source_uri: str, given: Path | None) -> Path:
    """The directory a new version is published into for a CR whose source is ``source_uri``:
    ``given`` when the trainer names it (a shared filesystem mounted elsewhere, or the directory
    `ckpt-rollout serve` serves), else a file:// source's own path. A served source's URI does
    not say where its files live, so it needs ``given``."""
    if given is not None:
        return given
    parts = urlsplit(source_uri)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    if parts.scheme in SERVED_SCHEMES:
        raise ValueError(
            f"its source is {source_uri}, which does not say where its files live: name the directory "
            "`ckpt-rollout serve` serves there (publish_root=, --publish-root DIR)"
        )
    raise ValueError(f"its source {source_uri!r} has a scheme release cannot publish to")


def version_patch(version: str, digest: str | None, target: SpecVersion) -> dict[str, Any]:
    """The merge patch of the CR that sets its version (and moves a pinned digest with it)."""
    spec: dict[str, Any] = {"version": version}
    if target.pinned:
        if digest is None:
            raise ValueError(
                "it pins spec.source.manifestDigest and the version was not published here, so its "
                "digest is unknown; publish it with release (source_dir=, --from)"
            )
        spec["source"] = {"manifestDigest": digest}
    return {"spec": spec}


# -- reading the status ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """What a status says about the released version: still going (``done`` False), succeeded,
    or failed with the CR's reason and message."""

    done: bool
    succeeded: bool = False
    phase: str | None = None
    reason: str | None = None
    message: str | None = None
    # Failed workers of the version, "pod: reason: message": a rollback's message names only
    # the reason, the worker's names what was wrong (the tensor, the dtype).
    workers: tuple[str, ...] = ()


RUNNING = Outcome(done=False)


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c.get("type", ""): c for c in status.get("conditions") or []}


def _true(condition: dict[str, Any] | None) -> bool:
    return condition is not None and condition.get("status") == ConditionStatus.TRUE


def stall_stamp(obj: dict[str, Any]) -> str | None:
    """lastTransitionTime of ``obj``'s Stalled condition if it is True (taken before the version
    is set: that Stalled is about the CR as it was, and does not count against the new version)."""
    stalled = _conditions(obj.get("status") or {}).get(ConditionType.STALLED)
    return str(stalled.get("lastTransitionTime")) if _true(stalled) and stalled else None


def outcome(obj: dict[str, Any], version: str, stale_stall: str | None = None) -> Outcome:
    """The released ``version``'s outcome as ``obj``'s status tells it. ``stale_stall``: the
    stall_stamp read before the version was set."""
    status = obj.get("status") or {}
    conditions = _conditions(status)
    phase = status.get("phase")
    stalled = conditions.get(ConditionType.STALLED)
    if status.get("targetVersion") != version:
        fresh = _true(stalled) and stalled is not None and stalled.get("lastTransitionTime") != stale_stall
        # A Failed or RolledBack phase is the old target's (its Stalled is its own failure).
        if fresh and phase not in FAILED_PHASES:
            return _failed(phase, stalled, status)
        return RUNNING
    if phase == Phase.SUCCEEDED and _true(conditions.get(ConditionType.COMPLETE)):
        return Outcome(done=True, succeeded=True, phase=phase)
    if phase in FAILED_PHASES:
        return _failed(phase, conditions.get(ConditionType.FAILED), status)
    if _true(stalled):
        return _failed(phase, stalled, status)
    return RUNNING  # RollingBack included: the rollback's own end is the answer


def _failed(phase: Any, condition: dict[str, Any] | None, status: dict[str, Any]) -> Outcome:
    condition = condition or {}
    target = status.get("targetVersion")
    workers = tuple(
        f"{pod}: {entry.get('reason')}: {entry.get('message')}"
        for pod, entry in sorted((status.get("workers") or {}).items())
        if entry.get("version") == target and entry.get("phase") == WorkerPhase.FAILED
    )
    return Outcome(
        done=True,
        phase=None if phase is None else str(phase),
        reason=condition.get("reason"),
        message=status.get("message") or condition.get("message") or None,
        workers=workers,
    )


def updated_bytes(seen: dict[str, int], obj: dict[str, Any], version: str) -> dict[str, int]:
    """``seen`` plus the bytes of every worker ``obj`` shows updated to ``version``. A wave's
    successes leave status.workers once the wave completes (folded into its counters), so the
    caller keeps what each status it saw showed."""
    out = dict(seen)
    for pod, entry in ((obj.get("status") or {}).get("workers") or {}).items():
        ours = entry.get("version") == version and entry.get("phase") == WorkerPhase.UPDATED
        if ours and entry.get("bytes") is not None:
            out[pod] = int(entry["bytes"])
    return out


def summary(
    obj: dict[str, Any], version: str, seconds: float, loaded: dict[str, int], published_bytes: int | None
) -> str:
    """One line: what was released where, how it ended, how long it took, workers updated,
    and the bytes the workers pulled, split by origin as the waves record it (source, peers);
    without that record and without peer relay they all came from the source."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    spec = obj.get("spec") or {}
    waves = [w for w in status.get("waves") or [] if w.get("phase")]
    replicas = status.get("replicas") or 0
    updated = status.get("updatedReplicas") or 0
    total = sum(loaded.values())
    if not loaded:
        pulled = "bytes n/a"
    else:
        known = "" if len(loaded) >= updated else f" (of {len(loaded)}/{updated} workers)"
        relay = (spec.get("strategy") or {}).get("peerRelay", True)
        recorded = transfer_split(waves)
        if recorded is not None:
            split = recorded
        elif relay:
            split = "source/peers n/a"
        else:
            split = f"{human_bytes(total)} from source, 0 B from peers"
        pulled = f"{human_bytes(total)} pulled{known}, {split}"
    published = "" if published_bytes is None else f"published {human_bytes(published_bytes)}; "
    return (
        f"release {version} -> {meta.get('namespace')}/{meta.get('name')}: "
        f"{status.get('phase') or Phase.PENDING} in {seconds:.1f}s; {published}"
        f"{updated}/{replicas} workers updated in {counted(len(waves), 'wave')}; {pulled}"
    )
