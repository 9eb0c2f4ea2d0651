"""A load that fails before it changes the weights leaves the live version relayed: the agent
still serves v1 and peers of the next wave still find v1's copy here, instead of all falling
back to the source. Once a load has changed the weights, the old copy is gone either way."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from agent_testkit import AgentClient, AgentFactory, Tree, close_to, corrupt_tensor, static_token_agent

WRONG_DIGEST = "sha256:" + "0" * 64


async def _holder_of_v1(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, **overrides: Any
) -> AgentClient:
    holder = await static_token_agent(
        agent_factory, token_file, source=tree.file_uri, initial_version="v1", **overrides
    )
    status = await holder.wait_settled()
    assert (status["version"], status["relay"]["version"]) == ("v1", "v1")
    return holder


async def _peer_reads_v1_from(
    holder: AgentClient, tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    """A next-wave agent loads v1 naming ``holder`` as its peer: every byte comes from it."""
    reader = await static_token_agent(agent_factory, token_file, source=tree.file_uri)
    await reader.wait_settled()
    body = {"uri": tree.file_uri, "manifestDigest": tree.digests["v1"], "peer": holder.url}
    assert (await reader.update("v1", source=body))[0] == 202
    status = await reader.wait_settled()
    last = status["last_load"]
    assert (status["version"], last["fallback_reason"]) == ("v1", None), last
    assert last["bytes_from_peer"] == tree.tensor_bytes("v1")
    assert last["bytes_from_source"] == 0


@pytest.mark.parametrize("apply_mode", ["staged", "streamed"])
async def test_a_load_refused_before_a_byte_moved_keeps_the_live_versions_relay(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, apply_mode: str
) -> None:
    holder = await _holder_of_v1(tree, agent_factory, token_file, apply_mode=apply_mode)
    body = {"uri": tree.file_uri, "manifestDigest": WRONG_DIGEST}
    assert (await holder.update("v2", source=body))[0] == 202
    status = await holder.wait_settled()
    assert (status["state"], status["version"]) == ("failed", "v1")
    assert status["relay"]["version"] == "v1"
    await _peer_reads_v1_from(holder, tree, agent_factory, token_file)


async def test_a_load_that_failed_while_pulling_keeps_the_live_versions_relay(
    scratch_tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    """Staged: v2's bad tensor is caught while it is staged, before the engine is touched."""
    holder = await _holder_of_v1(scratch_tree, agent_factory, token_file)
    manifest = scratch_tree.manifest("v2")
    corrupt_tensor(scratch_tree.root / "v2", manifest["tensors"][-1]["name"])
    assert (await holder.update("v2", verify_checksum=True))[0] == 202
    status = await holder.wait_settled()
    assert (status["state"], status["last_error"]["reason"]) == ("failed", "ChecksumMismatch")
    assert status["relay"]["version"] == "v1"
    assert close_to(await holder.infer(), scratch_tree.expected("v1"))
    await _peer_reads_v1_from(holder, scratch_tree, agent_factory, token_file)


async def test_a_pipelined_load_that_fails_puts_the_live_versions_relay_back(
    scratch_tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    """Relayed while it loaded, v2's copy took the relay's place; v1's was set aside, not
    dropped, and serves again once v2 fails."""
    holder = await _holder_of_v1(scratch_tree, agent_factory, token_file)
    manifest = scratch_tree.manifest("v2")
    corrupt_tensor(scratch_tree.root / "v2", manifest["tensors"][-1]["name"])
    body = {"uri": scratch_tree.file_uri, "relayWhileLoading": True}
    assert (await holder.update("v2", verify_checksum=True, source=body))[0] == 202
    status = await holder.wait_settled()
    assert status["state"] == "failed"
    assert status["relay"]["version"] == "v1"
    await _peer_reads_v1_from(holder, scratch_tree, agent_factory, token_file)


async def test_a_load_that_succeeds_releases_the_old_copy(
    tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    holder = await _holder_of_v1(tree, agent_factory, token_file)
    old = holder.agent.service.relay
    assert old is not None
    assert (await holder.update("v2"))[0] == 202
    status = await holder.wait_settled()
    assert (status["version"], status["relay"]["version"]) == ("v2", "v2")
    assert old.released, "the old copy's memory is let go once v2 is live"
