"""The SGLang and vLLM adapters against stand-ins that follow each engine's documented API:
the agent stages and verifies the version into a local directory, the engine loads it while
paused, is always resumed, and (SGLang) reports the new weight version."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from agent_testkit import AgentClient, AgentFactory, Tree, close_to, corrupt_tensor
from sglang_standin import SGLangStandIn
from vllm_standin import VLLMStandIn

from ckpt_agent.synth import load_published_tensors


@pytest.fixture
async def sglang() -> AsyncIterator[SGLangStandIn]:
    standin = SGLangStandIn()
    await standin.server.start()
    yield standin
    await standin.server.stop()


@pytest.fixture
async def vllm() -> AsyncIterator[VLLMStandIn]:
    standin = VLLMStandIn()
    await standin.server.start()
    yield standin
    await standin.server.stop()


def _same_tensors(held: dict[str, np.ndarray], tree: Tree, version: str) -> bool:
    published = load_published_tensors(tree.root / version)
    return held.keys() == published.keys() and all(np.array_equal(held[k], published[k]) for k in held)


async def _agent(
    agent_factory: AgentFactory, engine: str, url: str, tree: Tree, staging: Path
) -> AgentClient:
    return await agent_factory(engine=engine, engine_url=url, source=tree.file_uri, staging_dir=staging)


async def test_sglang_update_stages_pauses_loads_continues_and_confirms(
    tree: Tree, agent_factory: AgentFactory, sglang: SGLangStandIn, tmp_path: Path
) -> None:
    staging = tmp_path / "staging"
    client = await _agent(agent_factory, "sglang", sglang.server.url, tree, staging)
    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["state"], status["checksum_verified"]) == ("v2", "idle", True)
    assert sglang.calls == [
        ("pause_generation", {"mode": "abort"}),
        (
            "update_weights_from_disk",
            {"model_path": str(staging / "v2"), "weight_version": "v2", "flush_cache": True},
        ),
        ("continue_generation", None),
    ]
    assert _same_tensors(sglang.weights, tree, "v2")
    assert sglang.weight_version == "v2"
    assert not sglang.paused
    assert sorted(p.name for p in staging.iterdir()) == ["v2"]

    assert (await client.update("v3", verify_checksum=True))[0] == 202
    assert (await client.wait_settled())["version"] == "v3"
    assert _same_tensors(sglang.weights, tree, "v3")
    assert sorted(p.name for p in staging.iterdir()) == ["v3"], "the previous staged version is removed"


async def test_sglang_refusal_keeps_the_old_version_and_resumes(
    tree: Tree, agent_factory: AgentFactory, sglang: SGLangStandIn, tmp_path: Path
) -> None:
    staging = tmp_path / "staging"
    client = await _agent(agent_factory, "sglang", sglang.server.url, tree, staging)
    assert (await client.update("v2"))[0] == 202
    await client.wait_settled()
    sglang.failing_versions.add("v3")
    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"]) == ("failed", "v2")
    assert status["last_error"]["reason"] == "EngineError"
    assert "out of memory" in status["last_error"]["message"]
    assert sglang.names[-3:] == ["pause_generation", "update_weights_from_disk", "continue_generation"]
    assert not sglang.paused
    assert _same_tensors(sglang.weights, tree, "v2")
    assert sorted(p.name for p in staging.iterdir()) == ["v2"], "the refused version's staging is removed"


async def test_sglang_reporting_another_version_fails_the_load(
    tree: Tree, agent_factory: AgentFactory, sglang: SGLangStandIn, tmp_path: Path
) -> None:
    sglang.report_version = "stale"
    client = await _agent(agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s")
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert status["state"] == "failed"
    assert "reports weight_version 'stale'" in status["last_error"]["message"]
    assert not sglang.paused


async def test_corrupted_source_is_refused_before_the_engine_is_paused(
    scratch_tree: Tree, agent_factory: AgentFactory, sglang: SGLangStandIn, tmp_path: Path
) -> None:
    corrupt_tensor(scratch_tree.root / "v2", "head.weight")
    client = await _agent(agent_factory, "sglang", sglang.server.url, scratch_tree, tmp_path / "s")
    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert status["last_error"]["reason"] == "ChecksumMismatch"
    assert sglang.calls == []
    assert list((tmp_path / "s").iterdir()) == []


async def test_vllm_update_pauses_reloads_and_resumes(
    tree: Tree, agent_factory: AgentFactory, vllm: VLLMStandIn, tmp_path: Path
) -> None:
    staging = tmp_path / "staging"
    client = await _agent(agent_factory, "vllm", vllm.server.url, tree, staging)
    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "v2"
    assert vllm.calls == [
        ("pause", {"mode": "abort", "clear_cache": "true"}),
        ("collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(staging / "v2")}}),
        ("resume", None),
    ]
    assert _same_tensors(vllm.weights, tree, "v2")
    assert await client.is_paused() is False


async def test_vllm_reload_failure_resumes_and_reports(
    tree: Tree, agent_factory: AgentFactory, vllm: VLLMStandIn, tmp_path: Path
) -> None:
    vllm.fail_reload = True
    client = await _agent(agent_factory, "vllm", vllm.server.url, tree, tmp_path / "s")
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["last_error"]["reason"]) == ("failed", "EngineError")
    assert "shape mismatch" in status["last_error"]["message"]
    assert vllm.names == ["pause", "collective_rpc", "resume"]
    assert not vllm.paused


async def test_a_staged_engine_relays_its_staging_copy(
    tree: Tree, agent_factory: AgentFactory, sglang: SGLangStandIn, tmp_path: Path
) -> None:
    """An SGLang agent's verified staging directory feeds a peer (here a paddle agent)."""
    peer = await _agent(agent_factory, "sglang", sglang.server.url, tree, tmp_path / "s")
    assert (await peer.update("v2", verify_checksum=True))[0] == 202
    assert (await peer.wait_settled())["relay"]["version"] == "v2"
    client = await agent_factory(source=tree.file_uri, initial_version="v1")
    await client.wait_settled()
    assert (await client.update("v2", source={"uri": tree.file_uri, "peer": peer.url}))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["last_load"]["fallback_reason"]) == ("v2", None)
    assert close_to(await client.infer(), tree.expected("v2"))
