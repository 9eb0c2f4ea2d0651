"""The vLLM adapter against a stand-in rebuilt from vLLM 0.33.0's dev-mode routes: a staged
version is reloaded in place by `reload_weights(weights_path=...)` under pause, its version set
and confirmed; a reload that fails part way (vLLM has no rollback) ends with the previous
version reloaded and confirmed, or WeightsLost with the engine kept paused; servers without
dev mode, too old, or unable to reload from disk are refused with the fix named."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent_testkit import AgentFactory, Tree
from disk_engine_kit import Starter, disk_agent, holds, resumed_only_whole_versions, standins
from vllm_standin import VLLMStandIn

from ckpt_agent.engines.disk_staged import WEIGHTS_LOST_HOLDER, EngineMisconfigured
from ckpt_e2e.standins.engine import UNINITIALISED

LOAD_CALLS = ["pause", "collective_rpc", "update_weight_version", "weight_info", "resume"]


@pytest.fixture
async def start_vllm() -> AsyncIterator[Starter]:
    async with standins(VLLMStandIn) as start:
        yield start


def _after(vllm: VLLMStandIn, mark: int) -> list[str]:
    """Calls since `mark`, without the agent's own is_paused queries."""
    return [n for n in vllm.names[mark:] if n != "is_paused"]


async def _completions(session: aiohttp.ClientSession, vllm: VLLMStandIn, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = {"prompt": "The capital of France is"}
    async with session.post(vllm.server.url + "/v1/completions", json=body, headers=headers) as resp:
        return resp.status


async def test_a_load_is_paused_reloaded_labelled_confirmed_and_resumed(
    tree: Tree, agent_factory: AgentFactory, start_vllm: Starter, tmp_path: Path
) -> None:
    vllm: VLLMStandIn = await start_vllm(boot_dir=tree.root / "v1")
    staging = tmp_path / "staging"
    client = await disk_agent(agent_factory, "vllm", vllm.server.url, tree, staging)
    mark = len(vllm.calls)
    assert vllm.names[:mark] == ["is_paused", "weight_info", "server_info"]

    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["state"], status["checksum_verified"]) == ("v2", "idle", True)
    assert vllm.calls[mark:] == [
        ("pause", {"mode": "abort", "clear_cache": "true"}),
        (
            "collective_rpc",
            {
                "method": "reload_weights",
                "kwargs": {"weights_path": str(staging / "v2"), "is_checkpoint_format": True},
            },
        ),
        ("update_weight_version", {"new_version": "v2"}),
        ("weight_info", None),
        ("resume", None),
    ]
    assert holds(vllm, tree, "v2")
    assert (vllm.weight_version, vllm.paused, vllm.prefix_cache_resets) == ("v2", None, 1)
    assert await client.is_paused() is False
    assert vllm.resumed_with == [frozenset({str(staging / "v2")})]


@pytest.mark.parametrize(
    ("options", "hint"),
    [
        ({"dev_mode": False}, "VLLM_SERVER_DEV_MODE=1"),
        ({"version": "0.15.1", "weights_path_kwarg": False}, "needs vLLM >= 0.16.0"),
        ({"weight_version_routes": False}, "/update_weight_version"),
        ({"load_format": "dummy"}, "--load-format dummy"),
    ],
)
async def test_a_server_the_agent_cannot_drive_is_refused_at_start_up(
    options: dict[str, Any],
    hint: str,
    tree: Tree,
    agent_factory: AgentFactory,
    start_vllm: Starter,
    tmp_path: Path,
) -> None:
    vllm: VLLMStandIn = await start_vllm(**options)
    with pytest.raises(EngineMisconfigured, match=hint):
        await disk_agent(agent_factory, "vllm", vllm.server.url, tree, tmp_path / "s")
    assert "pause" not in vllm.names


async def test_a_worker_without_weights_path_is_a_clear_minimum_version_error(
    tree: Tree, agent_factory: AgentFactory, start_vllm: Starter, tmp_path: Path
) -> None:
    """A build whose /version says nothing usable, but whose workers predate weights_path:
    the TypeError (a 500) touched nothing, so the boot weights still serve."""
    vllm: VLLMStandIn = await start_vllm(version="dev", weights_path_kwarg=False, boot_dir=tree.root / "v1")
    client = await disk_agent(agent_factory, "vllm", vllm.server.url, tree, tmp_path / "s")
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", None, False)
    assert "needs vLLM >= 0.16.0" in status["last_error"]["message"]
    assert "unexpected keyword argument 'weights_path'" in status["last_error"]["message"]
    assert status["report"]["weights_ready"] is True
    assert vllm.names.count("collective_rpc") == 1
    assert holds(vllm, tree, "v1")
    assert vllm.paused is None


async def test_a_reload_failing_part_way_restores_the_previous_version(
    tree: Tree, agent_factory: AgentFactory, start_vllm: Starter, tmp_path: Path
) -> None:
    vllm: VLLMStandIn = await start_vllm(boot_dir=tree.root / "v1")
    staging = tmp_path / "staging"
    client = await disk_agent(agent_factory, "vllm", vllm.server.url, tree, staging)
    assert (await client.update("v2"))[0] == 202
    await client.wait_settled()
    vllm.weights.faults.append(2)
    mark = len(vllm.calls)

    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", "v2", False)
    assert "Worker failed with error" in status["last_error"]["message"]
    assert "restored v2" in status["last_error"]["message"]
    assert status["report"]["weights_ready"] is True
    assert _after(vllm, mark) == [
        "pause",
        "collective_rpc",
        "collective_rpc",
        "update_weight_version",
        "weight_info",
        "resume",
    ]
    reloads = [body["kwargs"]["weights_path"] for name, body in vllm.calls[mark:] if name == "collective_rpc"]
    assert reloads == [str(staging / "v3"), str(staging / "v2")]
    assert holds(vllm, tree, "v2")
    assert vllm.weight_version == "v2"
    assert resumed_only_whole_versions(vllm)


async def test_a_failed_restore_is_weights_lost_and_keeps_vllm_paused(
    tree: Tree,
    agent_factory: AgentFactory,
    start_vllm: Starter,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> None:
    """vLLM survives a failed reload with layers uninitialised and /weight_info still naming
    v2: the agent says WeightsLost and keeps it paused (new requests get 503, not a broken
    model) until a load succeeds."""
    vllm: VLLMStandIn = await start_vllm(boot_dir=tree.root / "v1")
    staging = tmp_path / "staging"
    client = await disk_agent(agent_factory, "vllm", vllm.server.url, tree, staging)
    assert (await client.update("v2"))[0] == 202
    await client.wait_settled()
    vllm.weights.faults.extend([2, 1])

    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", None, True)
    assert status["report"]["weights_ready"] is False
    assert "restoring v2" in status["last_error"]["message"]
    assert status["paused_by"] == [WEIGHTS_LOST_HOLDER]
    assert UNINITIALISED in vllm.weights.sources()
    assert vllm.weight_version == "v2", "vLLM's own label still names v2: it proves nothing"
    assert await _completions(session, vllm) == 503
    assert await client.is_paused() is True
    assert resumed_only_whole_versions(vllm)

    mark = len(vllm.calls)
    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["weights_lost"], status["paused_by"]) == ("v3", False, [])
    assert _after(vllm, mark) == LOAD_CALLS
    assert holds(vllm, tree, "v3")
    assert await _completions(session, vllm) == 200
    assert resumed_only_whole_versions(vllm)


async def test_a_first_reload_failure_restores_boot_weights_from_a_local_directory(
    tree: Tree, agent_factory: AgentFactory, start_vllm: Starter, tmp_path: Path
) -> None:
    boot = str(tree.root / "v1")
    vllm: VLLMStandIn = await start_vllm(boot_path=boot, boot_dir=tree.root / "v1")
    client = await disk_agent(agent_factory, "vllm", vllm.server.url, tree, tmp_path / "s")
    vllm.weights.faults.append(2)

    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", None, False)
    assert status["report"]["weights_ready"] is True
    restore = [body for name, body in vllm.calls if name == "collective_rpc"][-1]
    assert restore["kwargs"]["weights_path"] == boot
    assert holds(vllm, tree, "v1")
    assert vllm.weight_version == "default"
    assert resumed_only_whole_versions(vllm)


@pytest.mark.parametrize(
    ("options", "why"),
    [
        ({"boot_path": "Qwen/Qwen3-0.6B"}, "not a local directory"),
        ({"revision": "abc123"}, "pinned model"),
    ],
)
async def test_boot_weights_that_a_reload_would_not_reproduce_are_not_restored(
    options: dict[str, Any],
    why: str,
    tree: Tree,
    agent_factory: AgentFactory,
    start_vllm: Starter,
    tmp_path: Path,
) -> None:
    if "boot_path" not in options:
        options = {**options, "boot_path": str(tree.root / "v1")}
    vllm: VLLMStandIn = await start_vllm(boot_dir=tree.root / "v1", **options)
    client = await disk_agent(agent_factory, "vllm", vllm.server.url, tree, tmp_path / "s")
    vllm.weights.faults.append(2)
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["weights_lost"]) == (None, True)
    assert why in status["last_error"]["message"]
    assert status["report"]["weights_ready"] is False
    assert vllm.names.count("collective_rpc") == 1
    assert vllm.paused == "abort"


async def test_an_unmounted_staging_directory_loses_the_weights(
    tree: Tree, agent_factory: AgentFactory, start_vllm: Starter, tmp_path: Path
) -> None:
    """vLLM finds a missing directory only once reading starts, after every layer was reset:
    unlike SGLang, even this failure leaves it broken, and the restore (same mount) fails."""
    vllm: VLLMStandIn = await start_vllm(boot_dir=tree.root / "v1")
    staging = tmp_path / "staging"
    client = await disk_agent(agent_factory, "vllm", vllm.server.url, tree, staging)
    assert (await client.update("v2"))[0] == 202
    await client.wait_settled()
    vllm.unmounted = (str(staging),)
    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["weights_lost"]) == (None, True)
    assert vllm.names.count("collective_rpc") == 3
    assert resumed_only_whole_versions(vllm)


async def test_dev_routes_need_no_key_even_when_vllm_has_one(
    tree: Tree,
    agent_factory: AgentFactory,
    start_vllm: Starter,
    tmp_path: Path,
    session: aiohttp.ClientSession,
) -> None:
    """vLLM checks --api-key under /v1 only: the agent sends none, and nothing stops anyone
    else who reaches the port (hence loopback or a NetworkPolicy)."""
    vllm: VLLMStandIn = await start_vllm(boot_dir=tree.root / "v1", api_key="k")
    client = await disk_agent(agent_factory, "vllm", vllm.server.url, tree, tmp_path / "s")
    assert (await client.update("v2"))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    assert await _completions(session, vllm) == 401
    assert await _completions(session, vllm, "k") == 200


async def test_the_smoke_check_sends_the_key_vllm_guards_v1_with(
    tree: Tree, agent_factory: AgentFactory, start_vllm: Starter, tmp_path: Path
) -> None:
    """The smoke check's /v1/completions is behind --api-key: without --vllm-api-key-file it is
    refused (401), the check fails and the previous version is loaded back; with it, it passes."""
    check = {"prompt": "The capital of France is", "max_tokens": 8, "timeout_seconds": 5}
    vllm: VLLMStandIn = await start_vllm(boot_dir=tree.root / "v1", api_key="k")
    keyless = await disk_agent(agent_factory, "vllm", vllm.server.url, tree, tmp_path / "a")
    assert (await keyless.update("v2"))[0] == 202  # a version the agent knows, to go back to
    assert (await keyless.wait_settled())["version"] == "v2"
    assert (await keyless.update("v3", health_check=check))[0] == 202
    status = await keyless.wait_settled()
    assert (status["version"], status["last_error"]["reason"]) == ("v2", "HealthCheckFailed")
    assert "401" in status["last_error"]["message"]

    key_file = tmp_path / "vllm-key"
    key_file.write_text("k\n")
    keyed = await disk_agent(
        agent_factory, "vllm", vllm.server.url, tree, tmp_path / "b", vllm_api_key_file=key_file
    )
    assert (await keyed.update("v3", health_check=check))[0] == 202
    status = await keyed.wait_settled()
    assert (status["version"], status["last_load"]["health_check"]["passed"]) == ("v3", True)
