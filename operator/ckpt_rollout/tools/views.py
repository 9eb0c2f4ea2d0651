"""Human views of a CheckpointRollout for `ckpt-rollout status`, `watch` and the dashboard. Pure."""

from typing import Any

from ckpt_api.vocabulary import FAILED_PHASES, Phase


def _cell(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def analysis_cell(wave: dict[str, Any], spec: dict[str, Any]) -> str | None:
    """A wave's analysis in a few words, "Running 1/6 (0 failed)" (None: it has none)."""
    analysis = wave.get("analysis")
    if not analysis:
        return None
    settings = (spec.get("strategy") or {}).get("analysis") or {}
    interval, duration = settings.get("intervalSeconds") or 10, settings.get("durationSeconds", 60)
    required = f"/{max(1, duration // interval)}" if settings else ""
    return (
        f"{analysis.get('phase')} {analysis.get('measurements', 0)}{required} "
        f"({analysis.get('failedMeasurements', 0)} failed)"
    )


def _analysis_lines(status: dict[str, Any], spec: dict[str, Any], wide: bool) -> list[str]:
    """The latest analysis: how far it got and its last measurement, a row per query."""
    analyzed = [w for w in status.get("waves") or [] if w.get("analysis")]
    if not analyzed:
        return []
    wave = analyzed[-1]
    analysis = wave["analysis"]
    lines = [
        "",
        f"Analysis:   wave {wave.get('index', 0) + 1}: {analysis_cell(wave, spec)}, "
        f"{_cell(analysis.get('message'))}",
    ]
    results = analysis.get("results") or []
    if results:
        rows = [["QUERY", "VALUE", "PASSED", "MESSAGE"]]
        for r in results:
            message = _cell(r.get("message"))
            rows.append(
                [
                    r.get("name", ""),
                    _cell(r.get("value")),
                    str(r.get("passed")),
                    message if wide else message[:80],
                ]
            )
        lines += [_table(rows)]
    return lines


def human_bytes(size: float | None) -> str:
    """Decimal units, as `publish` and the benches print them."""
    if size is None:
        return "-"
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


def transfer_split(waves: list[dict[str, Any]]) -> str | None:
    """'X from source, Y from peers' over the waves that recorded where their bytes came from;
    None if none did."""
    recorded = [w for w in waves if w.get("bytesFromSource") is not None]
    if not recorded:
        return None
    source = sum(int(w["bytesFromSource"]) for w in recorded)
    peers = sum(int(w.get("bytesFromPeers") or 0) for w in recorded)
    return f"{human_bytes(source)} from source, {human_bytes(peers)} from peers"


def _source_lines(spec: dict[str, Any]) -> list[str]:
    source, strategy = spec.get("source") or {}, spec.get("strategy") or {}
    pin = source.get("manifestDigest")
    relay = f"on, fanout {strategy.get('relayFanout', 1)}" if strategy.get("peerRelay", True) else "off"
    return [
        f"Source:     {_cell(source.get('uri'))}  (manifest {pin or 'not pinned'})",
        f"Relay:      peers {relay}",
    ]


def _wide_workers(workers: list[dict[str, Any]]) -> list[list[str]]:
    """The rows of `status -o wide`'s worker table, from the live view's workers
    (ckpt_rollout.tools.watchtable.rollout_view)."""
    head = ["WORKER", "WAVE", "STATE", "VERSION", "LIVE", "REASON", "BYTES", "FROM PEERS", "SECONDS"]
    rows = [[*head, "NODE", "MESSAGE"]]
    for w in workers:
        seconds = w["seconds"]
        rows.append(
            [
                w["pod"],
                _cell(w["wave"]),
                w["state"],
                _cell(w["version"]),
                _cell(w["liveVersion"]),
                _cell(w["reason"]),
                human_bytes(w["bytes"]),
                human_bytes(w["bytesFromPeers"]),
                "-" if seconds is None else f"{seconds:.2f}",
                _cell(w["node"]),
                _cell(w["message"]),
            ]
        )
    return rows


def status_table(
    obj: dict[str, Any], *, wide: bool = False, workers: list[dict[str, Any]] | None = None
) -> str:
    """The rollout as tables; ``wide`` adds the source and relay settings, where each wave's
    bytes came from, and a row for each of ``workers`` (the live view's: every wave member and
    selected pod, with its node), messages whole."""
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    meta = obj.get("metadata") or {}
    from_configmap = "" if spec.get("version") else " (versionFrom)"
    lines = [
        f"Name:       {meta.get('namespace')}/{meta.get('name')}",
        f"Version:    {desired_version(obj)}{from_configmap}  (stable {_cell(status.get('stableVersion'))}, "
        f"previous {_cell(status.get('previousVersion'))})",
        f"Phase:      {_cell(status.get('phase'))}  updated {status.get('updatedReplicas', 0)}/"
        f"{status.get('replicas', 0)}, failed {status.get('failedReplicas', 0)}, "
        f"wave {_cell(status.get('waveProgress'))}",
        f"Message:    {_cell(status.get('message'))}",
    ]
    if wide:
        lines += _source_lines(spec)
    waves = status.get("waves") or []
    pulled = transfer_split(waves)
    if pulled is not None:
        lines.append(f"Pulled:     {pulled} (updated workers)")
    if waves:
        head = ["WAVE", "PODS", "CALLED", "UPDATED", "FAILED", "GONE", "PHASE", "STARTED", "COMPLETED"]
        rows = [[*head, "ANALYSIS", *(["FROM SOURCE", "FROM PEERS"] if wide else [])]]
        for w in waves:
            split = [human_bytes(w.get("bytesFromSource")), human_bytes(w.get("bytesFromPeers"))]
            rows.append(
                [
                    str(w.get("index", 0) + 1),
                    str(len(w.get("pods", []))),
                    str(len(w.get("called", []))),
                    str(w.get("updated", 0)),
                    str(w.get("failed", 0)),
                    str(w.get("gone", 0)),
                    _cell(w.get("phase")),
                    _cell(w.get("startedAt")),
                    _cell(w.get("completedAt")),
                    _cell(analysis_cell(w, spec)),
                    *(split if wide else []),
                ]
            )
        lines += ["", _table(rows)]
        lines += _analysis_lines(status, spec, wide)
    entries = status.get("workers") or {}
    if wide and workers:
        lines += ["", _table(_wide_workers(workers))]
    elif entries:
        rows = [["WORKER", "VERSION", "PHASE", "REASON", "VERIFIED", "SECONDS", "MESSAGE"]]
        for name in sorted(entries):
            e = entries[name]
            seconds = e.get("seconds")
            rows.append(
                [
                    name,
                    _cell(e.get("version")),
                    _cell(e.get("phase")),
                    _cell(e.get("reason")),
                    _cell(e.get("checksumVerified")),
                    "-" if seconds is None else f"{seconds:.2f}",
                    _cell(e.get("message"))[:80],
                ]
            )
        lines += ["", _table(rows)]
    conditions = status.get("conditions") or []
    if conditions:
        rows = [["CONDITION", "STATUS", "REASON", "SINCE"]]
        rows += [
            [c["type"], c["status"], _cell(c.get("reason")), _cell(c.get("lastTransitionTime"))]
            for c in conditions
        ]
        lines += ["", _table(rows)]
    return "\n".join(lines)


def desired_version(obj: dict[str, Any]) -> str | None:
    """The version a rollout is meant to roll out: spec.version, or for a spec.versionFrom rollout
    what the operator last resolved it to (status.targetVersion; the ConfigMap is the trainer's)."""
    version = (obj.get("spec") or {}).get("version")
    return version if version is not None else (obj.get("status") or {}).get("targetVersion")


def progress_line(obj: dict[str, Any], width: int = 30) -> str:
    status = obj.get("status") or {}
    replicas = status.get("replicas") or 0
    updated = status.get("updatedReplicas") or 0
    if status.get("targetVersion") != desired_version(obj):
        # The operator has not picked the new version up yet: old counters would mislead.
        status = {"replicas": replicas, "phase": Phase.PENDING}
        updated = 0
    filled = int(width * updated / replicas) if replicas else 0
    bar = "#" * filled + "." * (width - filled)
    return (
        f"{desired_version(obj)} [{bar}] {updated}/{replicas} updated  "
        f"wave {status.get('waveProgress') or '-'}  {status.get('phase') or Phase.PENDING}"
        + (f"  failed {status['failedReplicas']}" if status.get("failedReplicas") else "")
    )


def watch_exit_code(obj: dict[str, Any]) -> int | None:
    """0 when the rollout succeeded, 1 when it ended badly, None while it is still going."""
    status = obj.get("status") or {}
    if status.get("targetVersion") != desired_version(obj):
        return None
    phase = status.get("phase")
    if phase == Phase.SUCCEEDED:
        return 0
    if phase in FAILED_PHASES:
        return 1
    return None
