"""A real-layout checkpoint end to end on the local control plane: a Hugging Face model
directory (BF16, FP8 E4M3 weights with block scales, tied embedding, two shards + index, config
and tokenizer files) published with `ckpt-rollout publish`, rolled out by the operator to paddle
agents booted from the previous version, and read back from the agents' live parameters."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from ckpt_e2e.hf_checkpoint import HFCheckpoint, llama_like
from ckpt_e2e.procs import wait_for
from ckpt_e2e.rollout_env import (
    CLI,
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    Worker,
    conditions,
    http_json,
    rollout_spec,
    urlopen,
)
from ckpt_e2e.rollout_fixtures import Fleet
from ckpt_e2e.serviceaccounts import ChartAccounts

pytestmark = [pytest.mark.integration, pytest.mark.scenario]


def _publish(src: Path, version: str, root: Path) -> dict[str, Any]:
    """`ckpt-rollout publish SRC --json`, as a user runs it; returns the summary."""
    proc = subprocess.run(
        [*CLI, "publish", str(src), "--version", version, "--out", str(root), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary: dict[str, Any] = json.loads(proc.stdout)
    return summary


def _relayed(worker: Worker, token: str, version: str, file: str) -> bytes:
    import urllib.request

    request = urllib.request.Request(
        worker.url(f"/v1/relay/{version}/{file}"), headers={"Authorization": f"Bearer {token}"}
    )
    with urlopen(request, 10) as resp:
        data: bytes = resp.read()
        return data


def _live_tensors(worker: Worker, token: str, version: str, manifest: dict[str, Any]) -> dict[str, bytes]:
    """Each tensor's bytes as the agent serves them to peers. In streamed apply mode that is a
    read-back of the live paddle parameters, so this is what the engine holds."""
    shards = {f: _relayed(worker, token, version, f) for f in manifest["files"]}
    return {
        t["name"]: shards[t["file"]][t["offset"] : t["offset"] + t["nbytes"]] for t in manifest["tensors"]
    }


def test_hf_checkpoint_rolls_out_to_paddle_agents_byte_exact(
    fleet_factory: Callable[..., Fleet],
    chart_accounts: ChartAccounts,
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    tmp_path: Path,
) -> None:
    root = checkpoint_source.root
    old = llama_like(tmp_path / "hf-step-100", seed=100, scale_dtype="F32")
    new: HFCheckpoint = llama_like(tmp_path / "hf-step-200", seed=200, scale_dtype="F32")
    published_old = _publish(old.path, "hf-step-100", root)
    published_new = _publish(new.path, "hf-step-200", root)
    assert published_new["digest"].startswith("sha256:")
    manifest = json.loads((root / "hf-step-200" / "manifest.json").read_text())
    # Nothing of the model directory is dropped: every non-weight file is in the version.
    assert set(manifest["extra_files"]) == set(new.extra_files)
    assert {t["dtype"] for t in manifest["tensors"]} == {"BF16", "F8_E4M3", "F32"}
    assert published_old["digest"] != published_new["digest"]

    fleet = fleet_factory(
        2,
        name="hf",
        initial_version="hf-step-100",
        extra_args=["--paddle-weights", str(root / "hf-step-100"), "--apply-mode", "streamed"],
    )
    workers = fleet.workers(2)
    # The agents answer while they still load their boot version; wait until it is live.
    wait_for(
        lambda: all(
            http_json(w.url("/v1/status"), token=fleet.token)["version"] == "hf-step-100" for w in workers
        ),
        60,
        "both agents serving hf-step-100",
    )

    rollouts.create(
        "hf",
        rollout_spec(
            checkpoint_source.url,
            "hf-step-200",
            fleet.labels,
            verifyChecksum=True,
            source={"uri": checkpoint_source.url, "manifestDigest": published_new["digest"]},
            strategy={"waves": [1, "100%"]},
        ),
    )
    status = rollouts.wait_phase("hf", {"Succeeded", "Failed", "RolledBack"}, timeout=180)
    assert status["phase"] == "Succeeded", status.get("message")
    assert (status["updatedReplicas"], status["replicas"]) == (2, 2)

    # Relays are read as a peer reads them: the operator's identity may not (RBAC).
    peer = chart_accounts.peer_token()
    for w in workers:
        live = _live_tensors(w, peer, "hf-step-200", manifest)
        assert live.keys() == new.tensors.keys()
        wrong = [n for n, t in new.tensors.items() if live[n] != t.data]
        assert wrong == [], f"{w.name}: live bytes differ from the trainer's for {wrong[:5]}"
        for name, raw in new.extra_files.items():
            assert _relayed(w, peer, "hf-step-200", name) == raw, (w.name, name)


def test_a_dtype_paddle_lacks_is_refused_and_the_old_version_keeps_serving(
    fleet_factory: Callable[..., Fleet],
    chart_accounts: ChartAccounts,
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    rollouts: Rollouts,
    tmp_path: Path,
) -> None:
    root = checkpoint_source.root
    boot = llama_like(tmp_path / "fp8-boot", seed=300, scale_dtype="F32")
    _publish(boot.path, "fp8-boot", root)
    base = llama_like(tmp_path / "fp8-base", seed=302, scale_dtype="F32")
    _publish(base.path, "fp8-base", root)
    # The same model exported with F8_E8M0 block scales (DeepSeek-style): paddle has no E8M0.
    e8m0 = llama_like(tmp_path / "fp8-e8m0", seed=301, scale_dtype="F8_E8M0")
    _publish(e8m0.path, "fp8-e8m0", root)

    fleet = fleet_factory(
        2,
        name="e8m0",
        initial_version="fp8-boot",
        extra_args=["--paddle-weights", str(root / "fp8-boot"), "--apply-mode", "streamed"],
    )
    workers = fleet.workers(2)
    rollouts.create(
        "e8m0",
        rollout_spec(checkpoint_source.url, "fp8-base", fleet.labels, strategy={"waves": [1, "100%"]}),
    )
    assert (
        rollouts.wait_phase("e8m0", {"Succeeded", "Failed", "RolledBack"}, timeout=180)["phase"]
        == "Succeeded"
    )
    rollouts.patch_spec("e8m0", {"version": "fp8-e8m0"})
    status = rollouts.wait_phase(
        "e8m0", {"Succeeded", "Failed", "RolledBack"}, timeout=180, version="fp8-e8m0"
    )
    assert status["phase"] in {"Failed", "RolledBack"}, status
    assert "IncompatibleCheckpoint" in status["message"], status["message"]
    scales = [n for n, t in e8m0.tensors.items() if t.dtype == "F8_E8M0"]
    assert conditions(status)["Failed"]["status"] == "True"
    (canary,) = status["waves"][0]["pods"]
    worker_entry = (status.get("workers") or {}).get(canary) or {}
    detail = f"{status['message']} {worker_entry.get('message', '')}"
    # The refusal names the dtype and a tensor that has it.
    assert "F8_E8M0" in detail, detail
    assert any(n in detail for n in scales), detail

    base_manifest = json.loads((root / "fp8-base" / "manifest.json").read_text())
    for w in workers:
        assert http_json(w.url("/v1/status"), token=fleet.token)["version"] == "fp8-base", w.name
    # The canary's refused load withdrew its relay copy (a load start always does); the pod the
    # rollout never reached still hands out fp8-base, read back from its parameters.
    (untouched,) = [w for w in workers if w.name != canary]
    live = _live_tensors(untouched, chart_accounts.peer_token(), "fp8-base", base_manifest)
    assert all(live[n] == t.data for n, t in base.tensors.items())
