"""A multi-node replica's agents (engine `member` on the followers, `sglang` on the leader)
against a two-node SGLang stand-in: a follower stages a version where its node's ranks read it
and touches no engine; the leader's one update then loads it on every node; the versions a
request retains stay staged, so a failed switch goes back on every node; a kept version is taken
again without a byte pulled."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_testkit import AgentClient, AgentFactory, Tree
from disk_engine_kit import Starter, disk_agent, standins

from ckpt_agent.formats.synth import load_published_tensors
from ckpt_e2e.standins.engine import iter_tensors, weight_files
from ckpt_e2e.standins.multinode import MultiNodeSGLang


@pytest.fixture
async def start_multinode() -> AsyncIterator[Starter]:
    async with standins(MultiNodeSGLang) as start:
        yield start


def staged(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def staged_as_published(directory: Path, tree: Tree, version: str) -> bool:
    """The staged directory holds exactly the published version's tensors."""
    held = dict(iter_tensors(weight_files(str(directory))))
    published = load_published_tensors(tree.root / version)
    return held.keys() == published.keys() and all((held[k] == published[k]).all() for k in held)


def node_holds(standin: MultiNodeSGLang, tree: Tree, version: str) -> bool:
    published = load_published_tensors(tree.root / version)
    for weights in (standin.weights, *standin.node_weights):
        held = weights.values()
        if held.keys() != published.keys():
            return False
        if not all((held[k] == published[k]).all() for k in held):
            return False
    return True


async def replica(
    tree: Tree, agent_factory: AgentFactory, start: Starter, tmp_path: Path
) -> tuple[MultiNodeSGLang, AgentClient, AgentClient, Path, Path]:
    lead_root, member_root = tmp_path / "node0", tmp_path / "node1"
    sglang: MultiNodeSGLang = await start(
        boot_dir=tree.root / "v1", leader_root=lead_root, follower_roots=[member_root]
    )
    leader = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, lead_root)
    member = await agent_factory(engine="member", source=tree.file_uri, staging_dir=member_root)
    return sglang, leader, member, lead_root, member_root


async def test_a_follower_stages_and_the_leader_switches_every_node_at_once(
    tree: Tree, agent_factory: AgentFactory, start_multinode: Starter, tmp_path: Path
) -> None:
    sglang, leader, member, _, member_root = await replica(tree, agent_factory, start_multinode, tmp_path)
    engine_calls = len(sglang.calls)

    assert (await member.update("v2", verify_checksum=True))[0] == 202
    status = await member.wait_settled()
    assert (status["version"], status["checksum_verified"], status["last_error"]) == ("v2", True, None)
    assert staged(member_root) == ["v2"]
    assert len(sglang.calls) == engine_calls, "a follower never calls the engine"
    assert staged_as_published(member_root / "v2", tree, "v2")

    assert (await leader.update("v2", verify_checksum=True))[0] == 202
    assert (await leader.wait_settled())["version"] == "v2"
    assert node_holds(sglang, tree, "v2")
    assert sglang.one_version()
    assert [n for n in sglang.names[engine_calls:] if n == "update_weights_from_disk"] == [
        "update_weights_from_disk"
    ], "one engine update for the whole replica"


async def test_a_failed_switch_goes_back_on_every_node_from_what_followers_retain(
    tree: Tree, agent_factory: AgentFactory, start_multinode: Starter, tmp_path: Path
) -> None:
    sglang, leader, member, _, member_root = await replica(tree, agent_factory, start_multinode, tmp_path)
    for client in (member, leader):
        assert (await client.update("v2"))[0] == 202
        assert (await client.wait_settled())["version"] == "v2"

    # The operator names what the replica serves: the follower keeps it beside v3.
    assert (await member.update("v3", retain=["v2"]))[0] == 202
    assert (await member.wait_settled())["version"] == "v3"
    assert staged(member_root) == ["v2", "v3"]
    sglang.weights.faults.extend([2, None])  # node 0's write fails part way; its re-read works
    assert (await leader.update("v3"))[0] == 202
    status = await leader.wait_settled()
    assert status["version"] == "v2"
    assert status["last_error"]["reason"] == "EngineError"
    assert "restored v2" in status["last_error"]["message"]
    # The restore read v2 on node 1 too, from the copy the follower kept.
    assert node_holds(sglang, tree, "v2")
    assert sglang.one_version()

    # Retaining nothing, the next version leaves only itself staged.
    assert (await member.update("v1"))[0] == 202
    assert (await member.wait_settled())["version"] == "v1"
    assert staged(member_root) == ["v1"]


async def test_a_kept_version_is_taken_again_without_pulling(
    tree: Tree, agent_factory: AgentFactory, start_multinode: Starter, tmp_path: Path
) -> None:
    _, _, member, _, member_root = await replica(tree, agent_factory, start_multinode, tmp_path)
    assert (await member.update("v2"))[0] == 202
    await member.wait_settled()
    assert (await member.update("v3", retain=["v2"]))[0] == 202
    await member.wait_settled()

    # A rollback to v2 (retaining v3, the version it leaves) takes the kept copy.
    assert (await member.update("v2", retain=["v3"]))[0] == 202
    status = await member.wait_settled()
    assert (status["version"], status["last_load"]["bytes"]) == ("v2", 0)
    assert staged(member_root) == ["v2", "v3"]
    assert staged_as_published(member_root / "v2", tree, "v2")


async def test_a_follower_runs_no_health_check_of_its_own(
    tree: Tree, agent_factory: AgentFactory, start_multinode: Starter, tmp_path: Path
) -> None:
    sglang, _, member, _, _ = await replica(tree, agent_factory, start_multinode, tmp_path)
    check = {"prompt": "The capital of France is", "max_tokens": 4, "timeout_seconds": 5}
    assert (await member.update("v2", health_check=check))[0] == 202
    status = await member.wait_settled()
    assert status["version"] == "v2"
    assert status["last_load"]["health_check"]["passed"] is None
    assert "generate" not in sglang.names


ROLLOUT = {"namespace": "rl", "name": "fleet", "uid": "u-1", "wave": 0, "report": True}


async def test_a_staged_follower_is_not_ready_until_a_call_without_stage_confirms_it(
    tree: Tree, agent_factory: AgentFactory, start_multinode: Starter, tmp_path: Path
) -> None:
    """What the operator's gang sends: the follower stages (`stage`), its pod NotReady while its
    replica switches; the same call without `stage` once the leader is decided makes it Ready."""
    _, leader, member, _, _ = await replica(tree, agent_factory, start_multinode, tmp_path)
    assert (await member.status())["report"]["weights_ready"] is True

    assert (await member.update("v2", rollout=ROLLOUT, stage=True))[0] == 202
    status = await member.wait_settled()
    assert (status["version"], status["staged"], status["report"]["weights_ready"]) == ("v2", True, False)
    assert status["report"]["last"]["reason"] == "Staged"
    # Staged again (an operator that restarted mid-gang): a noop, still NotReady.
    code, body = await member.update("v2", rollout=ROLLOUT, stage=True)
    assert (code, body["noop"]) == (200, True)
    status = await member.status()
    assert (status["staged"], status["report"]["weights_ready"], status["report"]["last"]["reason"]) == (
        True,
        False,
        "Staged",
    )

    code, body = await member.update("v2", rollout={**ROLLOUT, "report": False})
    assert (code, body["noop"]) == (200, True)
    status = await member.status()
    assert (status["version"], status["staged"], status["report"]["weights_ready"]) == ("v2", False, True)

    # A staging call that is not a member's is refused: the leader's engine would be switched.
    serving = (await leader.status())["version"]
    code, body = await leader.update("v2", rollout=ROLLOUT, stage=True)
    assert (code, body["field"]) == (400, "stage"), body
    status = await leader.status()
    assert (status["version"], status["state"]) == (serving, "idle")
