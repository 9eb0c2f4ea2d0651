"""What the SGLang and vLLM adapters share (engines/disk_staged.py): the version is staged and
verified before the engine is paused, the live version's staged copy is the restore point
(even while that same version is loaded again), and it feeds peers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_testkit import AgentFactory, Tree, close_to, corrupt_tensor
from disk_engine_kit import StandIn, disk_agent, holds, resumed_only_whole_versions, standins
from vllm_standin import VLLMStandIn

from ckpt_e2e.standins.sglang import SGLangStandIn

STANDINS: dict[str, Any] = {"sglang": SGLangStandIn, "vllm": VLLMStandIn}


@pytest.fixture(params=sorted(STANDINS))
async def engine(request: pytest.FixtureRequest, tree: Tree) -> AsyncIterator[tuple[str, StandIn]]:
    """(engine name, a started stand-in booted with v1's weights), for each disk engine."""
    name = str(request.param)
    async with standins(STANDINS[name]) as start:
        yield name, await start(boot_dir=tree.root / "v1")


WEIGHT_CALLS = ("pause", "pause_generation", "collective_rpc", "update_weights_from_disk")


def _weight_calls(standin: StandIn, since: int) -> list[str]:
    return [n for n in standin.names[since:] if n in WEIGHT_CALLS]


async def test_a_corrupted_source_is_refused_before_the_engine_is_paused(
    scratch_tree: Tree, agent_factory: AgentFactory, engine: tuple[str, StandIn], tmp_path: Path
) -> None:
    name, standin = engine
    corrupt_tensor(scratch_tree.root / "v2", "head.weight")
    client = await disk_agent(agent_factory, name, standin.server.url, scratch_tree, tmp_path / "s")
    after_start_up = len(standin.names)
    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["last_error"]["reason"], status["weights_lost"]) == ("ChecksumMismatch", False)
    assert _weight_calls(standin, after_start_up) == []
    assert list((tmp_path / "s").iterdir()) == []


async def test_reloading_the_live_version_keeps_its_staged_copy_to_restore(
    tree: Tree, agent_factory: AgentFactory, engine: tuple[str, StandIn], tmp_path: Path
) -> None:
    """A verified reload of v2 (the live load skipped verification) stages where v2's copy
    lives; that copy is set aside, not overwritten, so a failure part way can still restore it."""
    name, standin = engine
    staging = tmp_path / "staging"
    client = await disk_agent(agent_factory, name, standin.server.url, tree, staging)
    assert (await client.update("v2"))[0] == 202
    await client.wait_settled()
    # A failure part way; SGLang's own re-read of the new path then works.
    fault = [2, None] if name == "sglang" else [2]
    standin.weights.faults.extend(fault)

    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", "v2", False)
    assert "restored v2" in status["last_error"]["message"]
    assert holds(standin, tree, "v2")

    # The copy is still there for the next failure.
    standin.weights.faults.extend(fault)
    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", "v2", False)
    assert holds(standin, tree, "v2")
    assert resumed_only_whole_versions(standin)

    assert (await client.update("v3"))[0] == 202
    assert (await client.wait_settled())["version"] == "v3"
    assert sorted(p.name for p in staging.iterdir()) == ["v3"], "the set-aside copy goes once v3 lands"


async def test_a_staged_engine_relays_its_staging_copy(
    tree: Tree, agent_factory: AgentFactory, engine: tuple[str, StandIn], tmp_path: Path
) -> None:
    """An engine agent's verified staging directory feeds a peer (here a paddle agent)."""
    name, standin = engine
    peer = await disk_agent(agent_factory, name, standin.server.url, tree, tmp_path / "s")
    assert (await peer.update("v2", verify_checksum=True))[0] == 202
    assert (await peer.wait_settled())["relay"]["version"] == "v2"
    client = await agent_factory(source=tree.file_uri, initial_version="v1")
    await client.wait_settled()
    assert (await client.update("v2", source={"uri": tree.file_uri, "peer": peer.url}))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["last_load"]["fallback_reason"]) == ("v2", None)
    assert close_to(await client.infer(), tree.expected("v2"))
