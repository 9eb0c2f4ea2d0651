"""A rollout's live view: one model of a CheckpointRollout (its waves, each member's state, each
worker's bytes and rate) that `watch` draws as a table on a terminal, as one line per change
elsewhere, and that the dashboard sends to the browser. Pure.

The status folds a wave's successes into its counters once the wave completes, so a member's
state is read in this order: its worker entry for the current target; else Updated if it was
called in a wave that completed; else Loading if it was called; else Pending.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ckpt_api.vocabulary import Phase, WavePhase, WorkerPhase
from ckpt_rollout.domain.wording import counted
from ckpt_rollout.tools.views import (
    _table,
    analysis_cell,
    desired_version,
    human_bytes,
    transfer_split,
)


def rollout_view(obj: dict[str, Any], pods: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """The JSON-able model of ``obj`` that every live view renders. ``pods``: the pods its
    selector selects, by name ({"node", "phase"}), where known: each is a worker too, those in no
    wave yet Pending."""
    pods = pods or {}
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if status.get("targetVersion") != desired_version(obj):
        # The operator has not picked the new version up yet: the old waves would mislead.
        status = {k: status.get(k) for k in ("stableVersion", "previousVersion", "replicas")}
    entries: dict[str, Any] = status.get("workers") or {}
    target = desired_version(obj)
    waves = []
    members: dict[str, tuple[int, str]] = {}
    for wave in status.get("waves") or []:
        index = int(wave.get("index", 0))
        called = set(wave.get("called") or [])
        chips = []
        pods_of_wave = list(wave.get("pods") or [])
        # A replica's followers are called (to stage) without being the wave's members, which
        # are its leaders: shown beside them, in the order they were called.
        followers = [p for p in wave.get("called") or [] if p not in set(pods_of_wave)]
        for pod in [*pods_of_wave, *followers]:
            state = _member_state(entries.get(pod), target, pod in called, wave.get("phase"))
            members[pod] = (index + 1, state)
            chips.append({"pod": pod, "state": state})
        waves.append(
            {
                "wave": index + 1,
                "kind": wave.get("kind"),
                "phase": wave.get("phase"),
                "target": wave.get("target"),
                "members": chips,
                "updated": wave.get("updated", 0),
                "failed": wave.get("failed", 0),
                "gone": wave.get("gone", 0),
                # Members that left before they loaded, each replaced by a pod no wave had taken.
                "replaced": list(wave.get("replaced") or []),
                "analysis": analysis_cell(wave, spec),
                "summary": wave_summary(wave),
            }
        )
    workers = []
    for pod in sorted(set(members) | set(entries) | set(pods)):
        entry = entries.get(pod) or {}
        wave_number, state = members.get(pod, (None, entry.get("phase") or WorkerPhase.PENDING))
        if wave_number is None and entry.get("wave") is not None:
            wave_number = int(entry["wave"]) + 1
        # A success folded into its wave's counters left no entry: it is the target's, and its
        # figures are its wave's.
        folded = state == WorkerPhase.UPDATED and not entry
        message = entry.get("message")
        if folded:
            message = f"figures folded into wave {wave_number}"
        elif pod not in members and not entry:
            message = "in no wave yet"
        size, seconds = entry.get("bytes"), entry.get("seconds")
        workers.append(
            {
                "pod": pod,
                "wave": wave_number,
                "state": state,
                "version": entry.get("version") or (target if folded else None),
                "liveVersion": entry.get("liveVersion"),
                "reason": entry.get("reason"),
                "bytes": size,
                "bytesFromPeers": entry.get("bytesFromPeers"),
                "seconds": seconds,
                "rate": size / seconds if size and seconds else None,
                "node": (pods.get(pod) or {}).get("node"),
                "message": message,
            }
        )
    return {
        "namespace": meta.get("namespace"),
        "name": meta.get("name"),
        "version": target,
        "targetVersion": status.get("targetVersion"),
        "stableVersion": status.get("stableVersion"),
        "previousVersion": status.get("previousVersion"),
        "phase": status.get("phase") or Phase.PENDING,
        "paused": bool(spec.get("paused")),
        "message": status.get("message"),
        "waveProgress": status.get("waveProgress"),
        "replicas": status.get("replicas") or 0,
        "updated": status.get("updatedReplicas") or 0,
        "failed": status.get("failedReplicas") or 0,
        "waves": waves,
        "workers": workers,
    }


def _member_state(entry: dict[str, Any] | None, target: str | None, called: bool, wave_phase: Any) -> str:
    if entry is not None and entry.get("version") == target:
        return str(entry.get("phase") or WorkerPhase.PENDING)
    if called and wave_phase == WavePhase.COMPLETED:
        return WorkerPhase.UPDATED
    return WorkerPhase.LOADING if called else WorkerPhase.PENDING


def wave_summary(wave: dict[str, Any]) -> str | None:
    """What a completed wave folded: its members' outcomes and where their bytes came from (the
    per-worker figures of its successes are not kept)."""
    if wave.get("phase") != WavePhase.COMPLETED:
        return None
    counts = f"{wave.get('updated', 0)} updated, {wave.get('failed', 0)} failed, {wave.get('gone', 0)} gone"
    split = transfer_split([wave])
    return f"{counts}; folded: {split}" if split else f"{counts}; folded (no byte counts reported)"


def _rate(rate: float | None) -> str:
    return "-" if rate is None else human_bytes(rate) + "/s"


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def summary_line(view: dict[str, Any]) -> str:
    return (
        f"{view['namespace']}/{view['name']} {view['version']}: {view['phase']}"
        f"{' (spec.paused)' if view['paused'] else ''}, {view['updated']}/{view['replicas']} updated, "
        f"{view['failed']} failed, waves {_cell(view['waveProgress'])}"
    )


def render_table(view: dict[str, Any]) -> str:
    """What `watch` draws on a terminal: the rollout, a row per wave, a row per worker."""
    lines = [
        summary_line(view),
        f"stable {_cell(view['stableVersion'])}, previous {_cell(view['previousVersion'])}",
        f"message: {_cell(view['message'])}",
    ]
    if view["waves"]:
        rows = [["WAVE", "KIND", "PHASE", "PODS", "UPDATED", "FAILED", "ANALYSIS", "MEMBERS"]]
        rows += [
            [
                str(w["wave"]),
                _cell(w["kind"]),
                _cell(w["phase"]),
                str(len(w["members"])),
                str(w["updated"]),
                str(w["failed"]),
                _cell(w["analysis"]),
                _members_cell(w),
            ]
            for w in view["waves"]
        ]
        lines += ["", _table(rows)]
    if view["workers"]:
        rows = [["WORKER", "WAVE", "STATE", "VERSION", "BYTES", "SECONDS", "RATE", "MESSAGE"]]
        rows += [
            [
                w["pod"],
                _cell(w["wave"]),
                w["state"],
                _cell(w["version"]),
                human_bytes(w["bytes"]),
                "-" if w["seconds"] is None else f"{w['seconds']:.2f}",
                _rate(w["rate"]),
                _said(w)[:80],
            ]
            for w in view["workers"]
        ]
        lines += ["", _table(rows)]
    return "\n".join(lines)


def _members_cell(wave: dict[str, Any]) -> str:
    cell = " ".join(f"{m['pod']}={m['state']}" for m in wave["members"])
    if wave["replaced"]:
        cell += f" (replaced: {', '.join(wave['replaced'])})"
    return cell


def change_lines(before: dict[str, Any] | None, after: dict[str, Any]) -> list[str]:
    """What `watch` prints when stdout is not a terminal: one line for each thing that changed
    between two views (the rollout's summary, its message, a wave's phase or size, a worker's
    state)."""
    lines = []
    if before is None or summary_line(before) != summary_line(after):
        lines.append(summary_line(after))
    # The message: what the rollout does, and what holds it up (a pod that cannot start).
    if after["message"] and (before is None or before["message"] != after["message"]):
        lines.append(f"message: {after['message']}")
    old_waves = {w["wave"]: w for w in (before or {}).get("waves", [])}
    for wave in after["waves"]:
        old = old_waves.get(wave["wave"])
        if old is None or (old["phase"], len(old["members"])) != (wave["phase"], len(wave["members"])):
            pods = counted(len(wave["members"]), "pod")
            if wave["members"]:
                pods += ": " + ", ".join(m["pod"] for m in wave["members"])
            lines.append(f"wave {wave['wave']}: {_cell(wave['phase'])} ({pods})")
        left = [pod for pod in wave["replaced"] if pod not in (old or {}).get("replaced", [])]
        if left:
            lines.append(f"wave {wave['wave']}: replaced {', '.join(left)} (left before loading)")
        if wave["analysis"] and (old is None or old["analysis"] != wave["analysis"]):
            lines.append(f"wave {wave['wave']} analysis: {wave['analysis']}")
    old_workers = {w["pod"]: w for w in (before or {}).get("workers", [])}
    for worker in after["workers"]:
        old = old_workers.get(worker["pod"])
        if old is None or (old["state"], old["version"], old["bytes"], old["reason"]) != (
            worker["state"],
            worker["version"],
            worker["bytes"],
            worker["reason"],
        ):
            lines.append(_worker_line(worker))
    return lines


def _worker_line(worker: dict[str, Any]) -> str:
    line = f"worker {worker['pod']}: {worker['state']}"
    if worker["version"]:
        line += f" {worker['version']}"
    if worker["bytes"] is not None:
        line += f", {human_bytes(worker['bytes'])}"
        if worker["seconds"] is not None:
            line += f" in {worker['seconds']:.2f}s ({_rate(worker['rate'])})"
    # Why it failed, or what holds it up (ckpt_rollout.domain.stalls).
    if worker["reason"] and worker["state"] in (WorkerPhase.FAILED, WorkerPhase.PENDING):
        line += f": {_said(worker)}"
    return line


def _said(worker: dict[str, Any]) -> str:
    """A worker's reason and message, as one cell."""
    if worker["reason"] and worker["message"]:
        return f"{worker['reason']}: {worker['message']}"
    return _cell(worker["reason"] or worker["message"])
