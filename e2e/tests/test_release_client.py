"""The trainer's client end to end on the local control plane: `release()` from Python and
`ckpt-rollout release` from a shell publish a Hugging Face checkpoint directory (BF16 + FP8
E4M3 with block scales) into the served source, set the rollout's target the way the CR is
owned (spec.version with its pinned digest, or a versionFrom ConfigMap), and return once real
paddle agents serve it; a checkpoint the workers' model cannot hold fails the release with the
CR's reason."""

from __future__ import annotations

import hashlib
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from ckpt_e2e.fixtures import ClusterHandle
from ckpt_e2e.hf_checkpoint import llama_like
from ckpt_e2e.procs import wait_for
from ckpt_e2e.rollout_env import (
    CLI,
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    conditions,
    http_json,
    rollout_spec,
)
from ckpt_e2e.rollout_fixtures import Fleet
from ckpt_rollout.tools.client import FIELD_MANAGER, ReleaseError, ReleaseFailed, publish, release

pytestmark = [pytest.mark.integration, pytest.mark.scenario]

NAME = "trainer"
ENDED = {"Succeeded", "Failed", "RolledBack"}
WAIT_S = 180
SUMMARY = re.compile(
    r"release (?P<version>\S+) -> (?P<ns>\S+)/trainer: Succeeded in [\d.]+s; (published [\d.]+ [kMG]?B; )?"
    r"2/2 workers updated in \d+ waves; .+"
)


def _manifest_digest(root: Path, version: str) -> str:
    return "sha256:" + hashlib.sha256((root / version / "manifest.json").read_bytes()).hexdigest()


def _fleet_on(
    fleet_factory: Callable[..., Fleet], source: CheckpointSource, boot: str, tmp_path: Path, seed: int
) -> Fleet:
    """Two paddle agents booted from ``boot``, an HF checkpoint published with the client."""
    published = publish(
        boot, llama_like(tmp_path / boot, seed=seed, scale_dtype="F32").path, root=source.root
    )
    assert published.digest == _manifest_digest(source.root, boot)
    fleet = fleet_factory(
        2,
        name=boot,
        initial_version=boot,
        extra_args=["--paddle-weights", str(published.path), "--apply-mode", "streamed"],
    )
    workers = fleet.workers(2)
    wait_for(
        lambda: {http_json(w.url("/v1/status"), token=fleet.token)["version"] for w in workers} == {boot},
        60,
        f"both agents serving {boot}",
    )
    return fleet


def _serving(fleet: Fleet) -> set[str]:
    return {http_json(w.url("/v1/status"), token=fleet.token)["version"] for w in fleet.workers(2)}


def _release_cli(cluster: ClusterHandle, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [
        *CLI,
        "release",
        *args,
        "--rollout",
        NAME,
        "-n",
        namespace,
        "--kubeconfig",
        str(cluster.kubeconfig),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=WAIT_S + 60)


def _version_managers(obj: dict[str, Any]) -> set[str]:
    """Field managers that own spec.version."""
    entries = obj["metadata"].get("managedFields") or []
    return {e["manager"] for e in entries if "f:version" in ((e.get("fieldsV1") or {}).get("f:spec") or {})}


def test_release_publishes_rolls_out_and_returns_with_the_summary(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    cluster: ClusterHandle,
    namespace: str,
    tmp_path: Path,
) -> None:
    root = checkpoint_source.root
    fleet = _fleet_on(fleet_factory, checkpoint_source, "rel-100", tmp_path, seed=100)
    # The CR pins its version's manifest: release must move the pin with the version.
    source = {"uri": checkpoint_source.url, "manifestDigest": _manifest_digest(root, "rel-100")}
    rollouts.create(
        NAME,
        rollout_spec(checkpoint_source.url, "rel-100", fleet.labels, source=source, verifyChecksum=True),
    )
    assert rollouts.wait_phase(NAME, ENDED, timeout=WAIT_S)["phase"] == "Succeeded"

    # A publish root the source does not serve is caught before the rollout is touched.
    with pytest.raises(ReleaseError, match="HTTP 404") as wrong:
        release(
            "rel-150",
            source_dir=llama_like(tmp_path / "rel-150", seed=150, scale_dtype="F32").path,
            rollout=NAME,
            namespace=namespace,
            publish_root=tmp_path / "not-served",
            kubeconfig=cluster.kubeconfig,
        )
    assert wrong.value.code == 2
    assert rollouts.get(NAME)["spec"]["version"] == "rel-100"

    new = llama_like(tmp_path / "rel-200", seed=200, scale_dtype="F32")
    result = release(
        "rel-200",
        source_dir=new.path,
        rollout=NAME,
        namespace=namespace,
        publish_root=root,
        kubeconfig=cluster.kubeconfig,
        timeout=WAIT_S,
    )
    assert result.phase == "Succeeded"
    assert (result.updated, result.replicas) == (2, 2)
    assert result.published is not None
    assert result.published.digest == _manifest_digest(root, "rel-200")
    match = SUMMARY.fullmatch(result.summary)
    assert match is not None, result.summary
    assert (match["version"], match["ns"]) == ("rel-200", namespace)
    obj = rollouts.get(NAME)
    assert obj["spec"]["version"] == "rel-200"
    assert obj["spec"]["source"]["manifestDigest"] == result.published.digest
    assert FIELD_MANAGER in _version_managers(obj)
    assert obj["status"]["targetVersion"] == "rel-200"
    assert _serving(fleet) == {"rel-200"}

    cli = _release_cli(
        cluster,
        namespace,
        "rel-300",
        "--from",
        str(llama_like(tmp_path / "rel-300", seed=300, scale_dtype="F32").path),
        "--publish-root",
        str(root),
        "--timeout",
        str(WAIT_S),
    )
    assert cli.returncode == 0, cli.stderr
    (line,) = cli.stdout.splitlines()
    match = SUMMARY.fullmatch(line)
    assert match is not None, line
    assert match["version"] == "rel-300"
    assert _serving(fleet) == {"rel-300"}


def test_a_checkpoint_the_model_cannot_hold_fails_the_release_with_the_crs_reason(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    cluster: ClusterHandle,
    namespace: str,
    tmp_path: Path,
) -> None:
    fleet = _fleet_on(fleet_factory, checkpoint_source, "rel-fp8-boot", tmp_path, seed=400)
    rollouts.create(NAME, rollout_spec(checkpoint_source.url, "rel-fp8-boot", fleet.labels))
    assert rollouts.wait_phase(NAME, ENDED, timeout=WAIT_S)["phase"] == "Succeeded"
    # DeepSeek-style F8_E8M0 block scales: paddle has no such dtype.
    e8m0 = llama_like(tmp_path / "e8m0", seed=401, scale_dtype="F8_E8M0").path

    with pytest.raises(ReleaseFailed) as failed:
        release(
            "rel-e8m0",
            source_dir=e8m0,
            rollout=NAME,
            namespace=namespace,
            publish_root=checkpoint_source.root,
            kubeconfig=cluster.kubeconfig,
            timeout=WAIT_S,
        )
    status = rollouts.status(NAME)
    assert status["targetVersion"] == "rel-e8m0"
    assert failed.value.phase == status["phase"] in {"Failed", "RolledBack"}
    assert failed.value.reason == conditions(status)["Failed"]["reason"]
    assert failed.value.detail == status["message"]
    assert "IncompatibleCheckpoint" in str(failed.value), failed.value
    # The worker's own message names what the model cannot hold.
    (worker,) = failed.value.workers
    assert "F8_E8M0" in worker, worker
    assert _serving(fleet) == {"rel-fp8-boot"}

    cli = _release_cli(
        cluster,
        namespace,
        "rel-e8m0-again",
        "--from",
        str(e8m0),
        "--publish-root",
        str(checkpoint_source.root),
        "--timeout",
        str(WAIT_S),
    )
    assert cli.returncode == 1, (cli.stdout, cli.stderr)
    assert "IncompatibleCheckpoint" in cli.stderr, cli.stderr
    assert "F8_E8M0" in cli.stderr, cli.stderr
    assert cli.stdout == ""
    assert rollouts.status(NAME)["targetVersion"] == "rel-e8m0-again"


def test_release_writes_the_config_map_a_version_from_rollout_reads(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    k8s_api: client.ApiClient,
    cluster: ClusterHandle,
    namespace: str,
    tmp_path: Path,
) -> None:
    """Git holds the CR (no spec.version); the trainer owns the ConfigMap, absent at first: the
    CR is Stalled until release creates it, and that Stalled does not fail the release."""
    fleet = _fleet_on(fleet_factory, checkpoint_source, "rel-cm-boot", tmp_path, seed=500)
    spec = rollout_spec(checkpoint_source.url, "unused", fleet.labels)
    del spec["version"]
    spec["versionFrom"] = {"configMapKeyRef": {"name": "trainer-version", "key": "version"}}
    rollouts.create(NAME, spec)
    wait_for(
        lambda: conditions(rollouts.status(NAME)).get("Stalled", {}).get("status") == "True",
        60,
        "the rollout Stalled on its missing ConfigMap",
    )

    result = release(
        "rel-cm-200",
        source_dir=llama_like(tmp_path / "rel-cm-200", seed=501, scale_dtype="F32").path,
        rollout=NAME,
        namespace=namespace,
        publish_root=checkpoint_source.root,
        kubeconfig=cluster.kubeconfig,
        timeout=WAIT_S,
    )
    assert result.phase == "Succeeded", result
    config_map = client.CoreV1Api(k8s_api).read_namespaced_config_map("trainer-version", namespace)
    assert config_map.data == {"version": "rel-cm-200"}
    assert "version" not in rollouts.get(NAME)["spec"]
    assert _serving(fleet) == {"rel-cm-200"}
