"""The disk engines' staging directory when its filesystem is small, and after a crash: a
version that does not fit is refused as StagingFull before the engine is paused (its blocks
are allocated up front, so a full disk never surfaces as a SIGBUS on a mapped write), and the
hidden directories a killed load left behind are removed when the agent starts."""

from __future__ import annotations

import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from agent_testkit import AgentFactory, Tree
from disk_engine_kit import StandIn, disk_agent, holds, standins

from ckpt_agent.pipeline.staging_dir import sweep_orphans
from ckpt_e2e.standins.sglang import SGLangStandIn


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """An 8 KiB tmpfs (two pages): room for no version of the test tree."""
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "ckpt-staging-test", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.fixture
async def sglang(tree: Tree) -> AsyncIterator[StandIn]:
    async with standins(SGLangStandIn) as start:
        yield await start(boot_dir=tree.root / "v1")


def _version_bytes(tree: Tree, version: str) -> int:
    return sum(p.stat().st_size for p in (tree.root / version).iterdir() if p.suffix == ".safetensors")


async def test_a_version_too_big_for_the_staging_filesystem_is_staging_full(
    tree: Tree, agent_factory: AgentFactory, sglang: StandIn, small_fs: Path
) -> None:
    assert _version_bytes(tree, "v2") > 8 * 1024, "the test tree must not fit the small filesystem"
    client = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, small_fs / "staging")
    calls_before = len(sglang.names)
    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    error = status["last_error"]
    assert (error["reason"], status["weights_lost"], status["state"]) == ("StagingFull", False, "failed")
    assert str(small_fs / "staging") in error["message"]
    assert "bytes free" in error["message"]
    assert "pause" not in sglang.names[calls_before:], "a refused staging never pauses the engine"
    assert holds(sglang, tree, "v1")
    assert list((small_fs / "staging").iterdir()) == [], "nothing half-staged is left"


async def test_orphans_of_a_killed_load_are_swept_when_the_agent_starts(
    tree: Tree, agent_factory: AgentFactory, sglang: StandIn, tmp_path: Path
) -> None:
    staging = tmp_path / "staging"
    orphans = [staging / ".v2.partial-0badf00d", staging / ".v1.restore-12345678"]
    for orphan in orphans:
        orphan.mkdir(parents=True)
        (orphan / "model-00001-of-00001.safetensors").write_bytes(b"\0" * 4096)
    kept = staging / "notes"
    kept.mkdir()
    client = await disk_agent(agent_factory, "sglang", sglang.server.url, tree, staging)
    assert not any(o.exists() for o in orphans)
    assert kept.is_dir(), "only the agent's own hidden names are swept"
    assert (await client.update("v2"))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    assert sorted(p.name for p in staging.iterdir()) == ["notes", "v2"]


def test_sweeping_a_missing_or_clean_root_removes_nothing(tmp_path: Path) -> None:
    assert sweep_orphans(tmp_path / "absent") == []
    (tmp_path / "v1").mkdir()
    (tmp_path / ".v1.partial-not-a-dir").write_text("a file, not a staging")
    assert sweep_orphans(tmp_path) == []
    assert (tmp_path / ".v1.partial-not-a-dir").exists()
