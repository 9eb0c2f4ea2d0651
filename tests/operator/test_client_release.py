"""The pure parts of `ckpt-rollout release` (ckpt_rollout.tools.release): where a CR takes its version
from, where to publish for its source, the patch, what a status says about the released
version, and the summary line; plus the command's refusals that need no cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ckpt_rollout.tools.client import ReleaseFailed
from ckpt_rollout.tools.release import (
    ConfigMapKey,
    Outcome,
    SpecVersion,
    outcome,
    publish_dir,
    stall_stamp,
    summary,
    updated_bytes,
    version_patch,
    version_target,
)

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def _cr(spec: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "fleet", "namespace": "rl"},
        "spec": {"source": {"uri": "http://src:8080"}, **(spec or {})},
        "status": status,
    }


def _cond(type_: str, status: str, reason: str = "R", since: str = T0) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": "", "lastTransitionTime": since}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"version": "v1"}, SpecVersion(pinned=False)),
        (
            {"version": "v1", "source": {"uri": "http://s", "manifestDigest": "sha256:" + "0" * 64}},
            SpecVersion(pinned=True),
        ),
        ({"versionFrom": {"configMapKeyRef": {"name": "trainer", "key": "v"}}}, ConfigMapKey("trainer", "v")),
    ],
)
def test_version_target(spec: dict[str, Any], expected: object) -> None:
    assert version_target(_cr(spec)) == expected


def test_a_config_map_version_with_a_pinned_digest_is_refused() -> None:
    spec = {
        "versionFrom": {"configMapKeyRef": {"name": "trainer", "key": "v"}},
        "source": {"uri": "http://s", "manifestDigest": "sha256:" + "0" * 64},
    }
    with pytest.raises(ValueError, match="drop the pin"):
        version_target(_cr(spec))


@pytest.mark.parametrize(
    ("uri", "given", "expected"),
    [
        ("file:///mnt/ckpt", None, Path("/mnt/ckpt")),
        ("file:///mnt/with%20space", None, Path("/mnt/with space")),
        ("file:///mnt/ckpt", Path("/shared/ckpt"), Path("/shared/ckpt")),  # mounted elsewhere here
        ("http://src:8080", Path("/srv/versions"), Path("/srv/versions")),
        ("mooncake://src:17000", Path("/srv/versions"), Path("/srv/versions")),
    ],
)
def test_publish_dir(uri: str, given: Path | None, expected: Path) -> None:
    assert publish_dir(uri, given) == expected


@pytest.mark.parametrize(
    ("uri", "match"),
    [("http://src:8080", "--publish-root"), ("mooncake://src:1", "--publish-root"), ("s3://b", "scheme")],
)
def test_publish_dir_needs_a_root_the_uri_does_not_give(uri: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        publish_dir(uri, None)


def test_version_patch_moves_a_pinned_digest_with_the_version() -> None:
    digest = "sha256:" + "a" * 64
    assert version_patch("v2", digest, SpecVersion(pinned=False)) == {"spec": {"version": "v2"}}
    assert version_patch("v2", digest, SpecVersion(pinned=True)) == {
        "spec": {"version": "v2", "source": {"manifestDigest": digest}}
    }
    with pytest.raises(ValueError, match="digest is unknown"):
        version_patch("v2", None, SpecVersion(pinned=True))


OK = Outcome(done=True, succeeded=True, phase="Succeeded")


@pytest.mark.parametrize(
    ("status", "stale", "expected"),
    [
        # The operator has not picked v2 up: the old target's end says nothing about v2.
        (
            {"targetVersion": "v1", "phase": "Succeeded", "conditions": [_cond("Complete", "True")]},
            None,
            None,
        ),
        (
            {"targetVersion": "v1", "phase": "RolledBack", "conditions": [_cond("Stalled", "True")]},
            None,
            None,
        ),
        ({"targetVersion": "v2", "phase": "Progressing"}, None, None),
        ({"targetVersion": "v2", "phase": "Paused"}, None, None),  # waits for promote
        (
            {"targetVersion": "v2", "phase": "RollingBack", "conditions": [_cond("Failed", "True")]},
            None,
            None,
        ),
        ({"targetVersion": "v2", "phase": "Succeeded", "conditions": [_cond("Complete", "True")]}, None, OK),
        # Succeeded is read with its condition: a phase alone is not Complete.
        (
            {"targetVersion": "v2", "phase": "Succeeded", "conditions": [_cond("Complete", "False")]},
            None,
            None,
        ),
        (
            {
                "targetVersion": "v2",
                "phase": "RolledBack",
                "message": "rolled 0 workers back to v1 (IncompatibleCheckpoint)",
                "conditions": [_cond("Failed", "True", "IncompatibleCheckpoint")],
                "workers": {
                    "w-1": {
                        "version": "v2",
                        "phase": "Failed",
                        "reason": "IncompatibleCheckpoint",
                        "message": "t: F8",
                    },
                    "w-0": {
                        "version": "v1",
                        "phase": "Failed",
                        "reason": "ChecksumMismatch",
                        "message": "old",
                    },
                },
            },
            None,
            Outcome(
                done=True,
                phase="RolledBack",
                reason="IncompatibleCheckpoint",
                message="rolled 0 workers back to v1 (IncompatibleCheckpoint)",
                workers=("w-1: IncompatibleCheckpoint: t: F8",),
            ),
        ),
        (
            {
                "targetVersion": "v2",
                "phase": "Failed",
                "conditions": [_cond("Failed", "True", "ChecksumMismatch")],
            },
            None,
            Outcome(done=True, phase="Failed", reason="ChecksumMismatch"),
        ),
        # Stalled before v2 started (a selector conflict): it never will start.
        (
            {
                "targetVersion": "v1",
                "phase": "Pending",
                "message": "overlaps",
                "conditions": [_cond("Stalled", "True", "SelectorConflict", T1)],
            },
            None,
            Outcome(done=True, phase="Pending", reason="SelectorConflict", message="overlaps"),
        ),
        # ... unless it is the Stalled seen before the version was set (e.g. the versionFrom
        # ConfigMap was missing until release wrote it): the operator has yet to look again.
        (
            {
                "targetVersion": "v1",
                "phase": "Pending",
                "conditions": [_cond("Stalled", "True", "VersionSourceInvalid", T0)],
            },
            T0,
            None,
        ),
        (
            {
                "targetVersion": "v1",
                "phase": "Pending",
                "conditions": [_cond("Stalled", "True", "VersionSourceInvalid", T1)],
            },
            T0,
            Outcome(done=True, phase="Pending", reason="VersionSourceInvalid"),
        ),
        # Stalled while v2 is the target: blocked mid-rollout.
        (
            {"targetVersion": "v2", "phase": "Progressing", "conditions": [_cond("Stalled", "True", "X")]},
            T0,
            Outcome(done=True, phase="Progressing", reason="X"),
        ),
    ],
)
def test_outcome(status: dict[str, Any], stale: str | None, expected: Outcome | None) -> None:
    got = outcome(_cr({"version": "v2"}, **status), "v2", stale)
    assert got == (expected or Outcome(done=False))


def test_stall_stamp_is_the_true_stalled_conditions_transition() -> None:
    assert stall_stamp(_cr(conditions=[_cond("Stalled", "True", since=T1)])) == T1
    assert stall_stamp(_cr(conditions=[_cond("Stalled", "False", since=T1)])) is None
    assert stall_stamp(_cr()) is None


def test_updated_bytes_keeps_what_earlier_statuses_showed() -> None:
    first = _cr(
        workers={
            "w-0": {"version": "v2", "phase": "Updated", "bytes": 100},
            "w-1": {"version": "v2", "phase": "Loading"},
            "w-2": {"version": "v1", "phase": "Updated", "bytes": 7},  # another version's load
        }
    )
    seen = updated_bytes({}, first, "v2")
    assert seen == {"w-0": 100}
    # The wave completed: w-0's success was folded into the wave's counters.
    later = _cr(workers={"w-1": {"version": "v2", "phase": "Updated", "bytes": 100}})
    assert updated_bytes(seen, later, "v2") == {"w-0": 100, "w-1": 100}


def _done(**spec: Any) -> dict[str, Any]:
    return _cr(
        {"version": "v2", **spec},
        phase="Succeeded",
        replicas=3,
        updatedReplicas=3,
        waves=[{"index": 0, "phase": "Completed"}, {"index": 1, "phase": "Completed"}],
    )


@pytest.mark.parametrize(
    ("spec", "loaded", "published", "expected"),
    [
        (
            {},
            {"a": 2_000_000, "b": 2_000_000, "c": 2_000_000},
            6_100_000,
            "release v2 -> rl/fleet: Succeeded in 12.3s; published 6.1 MB; 3/3 workers updated in 2 waves; "
            "6.0 MB pulled, source/peers n/a",
        ),
        (
            {"strategy": {"peerRelay": False}},
            {"a": 1000, "b": 1000},
            None,
            "release v2 -> rl/fleet: Succeeded in 12.3s; 3/3 workers updated in 2 waves; "
            "2.0 kB pulled (of 2/3 workers), 2.0 kB from source, 0 B from peers",
        ),
        (
            {},
            {},
            None,
            "release v2 -> rl/fleet: Succeeded in 12.3s; 3/3 workers updated in 2 waves; bytes n/a",
        ),
    ],
)
def test_summary(spec: dict[str, Any], loaded: dict[str, int], published: int | None, expected: str) -> None:
    assert summary(_done(**spec), "v2", 12.34, loaded, published) == expected


def test_summary_splits_the_bytes_as_the_waves_recorded() -> None:
    done = _done()
    done["status"]["waves"] = [
        {"index": 0, "phase": "Completed", "bytesFromSource": 2_000_000, "bytesFromPeers": 0},
        {"index": 1, "phase": "Completed", "bytesFromSource": 2_000_000, "bytesFromPeers": 4_000_000},
    ]
    loaded = {"a": 2_000_000, "b": 2_000_000, "c": 2_000_000, "d": 2_000_000}
    assert summary(done, "v2", 1.0, loaded, None).endswith(
        "8.0 MB pulled, 4.0 MB from source, 4.0 MB from peers"
    )


def test_release_failed_carries_the_crs_reason_and_message() -> None:
    exc = ReleaseFailed("fleet", "RolledBack", "IncompatibleCheckpoint", "rolled 0 workers back to v1")
    assert str(exc) == "fleet: RolledBack: IncompatibleCheckpoint: rolled 0 workers back to v1"
    assert (exc.code, exc.reason, exc.detail) == (1, "IncompatibleCheckpoint", "rolled 0 workers back to v1")
    named = ReleaseFailed("fleet", "Failed", "WorkerFailed", None, ("w-0: EngineError: died", "w-1: x: y"))
    assert str(named) == "fleet: Failed: WorkerFailed (worker w-0: EngineError: died)"


@pytest.mark.parametrize(
    ("argv", "match"),
    [
        (["release", "../v2", "--rollout", "fleet"], "contains '/'"),
        (["release", "v2"], "--rollout"),
    ],
)
def test_release_refuses_bad_usage_before_touching_anything(
    argv: list[str], match: str, tmp_path: Path
) -> None:
    # No kubeconfig at all: a refusal that needed the cluster would say so instead.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KUBECONFIG": str(tmp_path / "none")}
    proc = subprocess.run(
        [sys.executable, "-m", "ckpt_cli", *argv], capture_output=True, text=True, env=env, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert match in proc.stderr
    assert "Traceback" not in proc.stderr
