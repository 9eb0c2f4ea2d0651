"""Bad input and faults: every failed update leaves the old weights serving (proved with
/v1/infer), the engine resumed, and the reason in /v1/status and in the CR report entry."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agent_testkit import (
    SPEC,
    AgentClient,
    AgentFactory,
    Tree,
    close_to,
    corrupt_tensor,
    last_tensor,
    truncate_shard,
)
from safetensors.numpy import save_file

from ckpt_agent.formats.synth import ReferenceModelSpec, reference_params

ROLLOUT = {"namespace": "rl", "name": "fleet", "uid": "uid-7", "wave": 1}


@pytest.fixture(params=["staged", "streamed"])
def apply_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _agent(agent_factory: AgentFactory, tree: Tree, **overrides: Any) -> AgentClient:
    client = await agent_factory(source=tree.file_uri, initial_version="v1", **overrides)
    assert (await client.wait_settled())["version"] == "v1"
    return client


async def _assert_failed_with_old_weights(
    client: AgentClient, tree: Tree, version: str, reason: str
) -> dict[str, Any]:
    status = await client.wait_settled()
    assert status["state"] == "failed", status
    assert status["last_error"]["reason"] == reason, status["last_error"]
    assert status["last_error"]["version"] == version
    assert status["version"] == "v1"
    assert status["weights_lost"] is False
    assert await client.is_paused() is False, "the engine must be resumed after a failure"
    assert close_to(await client.infer(), tree.expected("v1")), "the old weights must still serve"
    entry = status["report"]["last"]
    assert (entry["phase"], entry["reason"], entry["version"]) == ("Failed", reason, version)
    assert (entry["liveVersion"], entry["wave"], entry["uid"], entry["rollout"]) == (
        "v1",
        1,
        "uid-7",
        "rl/fleet",
    )
    assert status["report"]["weights_ready"] is True
    return status


async def _update_fails(
    client: AgentClient, tree: Tree, version: str, reason: str, **body: Any
) -> dict[str, Any]:
    code, reply = await client.update(version, rollout=ROLLOUT, **body)
    assert code == 202, reply
    return await _assert_failed_with_old_weights(client, tree, version, reason)


async def test_unknown_version(tree: Tree, agent_factory: AgentFactory, apply_mode: str) -> None:
    client = await _agent(agent_factory, tree, apply_mode=apply_mode)
    await _update_fails(client, tree, "v404", "VersionNotFound", verify_checksum=True)


@pytest.mark.parametrize("version", ["a/b", "..", "v1..2", "-v", ".v", "v" * 129, "v 1"])
async def test_unsafe_version_is_refused_and_reported(
    tree: Tree, agent_factory: AgentFactory, version: str
) -> None:
    client = await _agent(agent_factory, tree)
    code, body = await client.update(version, rollout=ROLLOUT)
    assert code == 400
    assert (body["error"], body["field"]) == ("InvalidVersion", "version")
    status = await client.status()
    assert status["state"] == "idle"
    assert status["updates"]["rejected"] == 1
    assert status["updates"]["accepted"] == 0
    assert status["last_error"]["reason"] == "InvalidVersion"
    assert status["report"]["last"]["reason"] == "InvalidVersion"
    assert close_to(await client.infer(), tree.expected("v1"))
    assert await client.metric("ckpt_agent_update_requests_total", {"result": "rejected"}) == 1


async def test_manifest_over_the_size_cap(scratch_tree: Tree, agent_factory: AgentFactory) -> None:
    cap = (scratch_tree.root / "v1" / "manifest.json").stat().st_size + 64
    scratch_tree.add("big", seed=9, spec=ReferenceModelSpec(hidden=32, layers=12))
    client = await _agent(agent_factory, scratch_tree, max_manifest_bytes=cap)
    status = await _update_fails(client, scratch_tree, "big", "ManifestTooLarge")
    assert str(cap) in status["last_error"]["message"]


async def test_manifest_digest_mismatch(tree: Tree, agent_factory: AgentFactory) -> None:
    client = await _agent(agent_factory, tree)
    pinned = {"uri": tree.file_uri, "manifestDigest": tree.digests["v1"]}
    await _update_fails(client, tree, "v2", "ManifestDigestMismatch", source=pinned)


async def test_truncated_shard(scratch_tree: Tree, agent_factory: AgentFactory, apply_mode: str) -> None:
    truncate_shard(scratch_tree.root / "v2")
    client = await _agent(agent_factory, scratch_tree, apply_mode=apply_mode)
    await _update_fails(client, scratch_tree, "v2", "TruncatedShard", verify_checksum=True)


async def test_checksum_mismatch_names_the_tensor(
    scratch_tree: Tree, agent_factory: AgentFactory, apply_mode: str
) -> None:
    # The last tensor read: in streamed mode every other tensor was already applied, so this
    # proves the previous version is restored.
    tensor = last_tensor(scratch_tree.manifest("v2"))
    corrupt_tensor(scratch_tree.root / "v2", tensor)
    client = await _agent(agent_factory, scratch_tree, apply_mode=apply_mode)
    status = await _update_fails(client, scratch_tree, "v2", "ChecksumMismatch", verify_checksum=True)
    assert repr(tensor) in status["last_error"]["message"]
    assert repr(tensor) in status["report"]["last"]["message"]


async def test_without_verify_corruption_goes_unnoticed(
    scratch_tree: Tree, agent_factory: AgentFactory
) -> None:
    """What verify_checksum buys: the same corrupt version loads when it is off."""
    expected_clean = scratch_tree.expected("v2")
    corrupt_tensor(scratch_tree.root / "v2", "layers.0.weight")
    client = await _agent(agent_factory, scratch_tree)
    assert (await client.update("v2", verify_checksum=False))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["checksum_verified"]) == ("v2", False)
    assert not close_to(await client.infer(), expected_clean)


def _publish_params(tree: Tree, version: str, params: dict[str, np.ndarray]) -> None:
    src = tree.work / f"src-{version}"
    src.mkdir(parents=True)
    save_file(params, str(src / "model.safetensors"))
    tree.add_from_dir(version, src)


def _missing(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in p.items() if k != "head.bias"}


def _extra(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**p, "layers.9.weight": np.zeros((SPEC.hidden, SPEC.hidden), np.float32)}


def _reshaped(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**p, "head.weight": np.zeros((SPEC.hidden, SPEC.outputs + 1), np.float32)}


def _retyped(p: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {**p, "layers.1.weight": p["layers.1.weight"].astype(np.float16)}


@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (_missing, "missing tensors for parameters 'head.bias'"),
        (_extra, "no matching parameter 'layers.9.weight'"),
        (_reshaped, "'head.weight' is F32[32, 9] in the checkpoint, F32[32, 8] in the model"),
        (_retyped, "'layers.1.weight' is F16[32, 32]"),
    ],
    ids=["missing", "extra", "shape", "dtype"],
)
async def test_incompatible_checkpoint(
    scratch_tree: Tree, agent_factory: AgentFactory, mutate: Any, fragment: str
) -> None:
    _publish_params(scratch_tree, "bad", mutate(reference_params(SPEC, seed=4)))
    client = await _agent(agent_factory, scratch_tree)
    status = await _update_fails(client, scratch_tree, "bad", "IncompatibleCheckpoint", verify_checksum=True)
    assert fragment in status["last_error"]["message"]
    assert status["bytes_done"] == 0, "compatibility is checked before any tensor byte moves"


async def test_source_unreachable(tree: Tree, agent_factory: AgentFactory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = await _agent(agent_factory, tree)
    await _update_fails(client, tree, "v2", "SourceUnreachable", source={"uri": f"http://127.0.0.1:{port}"})


async def test_idempotent_success_after_a_failure(tree: Tree, agent_factory: AgentFactory) -> None:
    client = await _agent(agent_factory, tree)
    await _update_fails(client, tree, "v404", "VersionNotFound")
    code, _ = await client.update("v1", rollout=ROLLOUT)
    assert code == 200
    status = await client.status()
    assert (status["state"], status["version"]) == ("idle", "v1")
    assert (status["report"]["last"]["phase"], status["report"]["last"]["reason"]) == ("Updated", "Loaded")


async def test_streamed_failure_without_a_previous_version_refuses_traffic(
    scratch_tree: Tree, agent_factory: AgentFactory, tmp_path: Path
) -> None:
    """Nothing to restore: the agent says so and stops serving instead of serving a mix."""
    corrupt_tensor(scratch_tree.root / "v2", last_tensor(scratch_tree.manifest("v2")))
    client = await agent_factory(source=scratch_tree.file_uri, apply_mode="streamed")
    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", None, True)
    assert status["last_error"]["reason"] == "ChecksumMismatch"
    assert status["report"]["weights_ready"] is False
    code, body = await client.request("POST", "/v1/infer", {})
    assert (code, body["error"]) == (503, "EngineUnavailable")
    assert await client.is_paused() is False

    # A later load that fails before reaching the engine leaves the weights as lost as they were.
    assert (await client.update("no-such-version"))[0] == 202
    status = await client.wait_settled()
    assert (status["last_error"]["reason"], status["weights_lost"]) == ("VersionNotFound", True)
    assert status["report"]["weights_ready"] is False

    assert (await client.update("v1", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["weights_lost"]) == ("v1", False)
    assert close_to(await client.infer(), scratch_tree.expected("v1"))
