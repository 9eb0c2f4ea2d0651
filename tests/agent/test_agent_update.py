"""Successful loads through the agent API: the new weights serve traffic afterwards."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from agent_testkit import AgentClient, AgentFactory, Tree, close_to

Source = Callable[[Path], Awaitable[str]]


@pytest.fixture(params=["staged", "streamed"])
def apply_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


async def _started(agent_factory: AgentFactory, source: str, **overrides: object) -> AgentClient:
    client = await agent_factory(source=source, initial_version="v1", **overrides)
    status = await client.wait_settled()
    assert status["version"] == "v1", status
    return client


async def test_initial_version_is_loaded_at_startup(tree: Tree, agent_factory: AgentFactory) -> None:
    client = await _started(agent_factory, tree.file_uri)
    status = await client.status()
    assert status["state"] == "idle"
    assert status["checksum_verified"] is True
    assert status["manifest_digest"] == tree.digests["v1"]
    assert close_to(await client.infer(), tree.expected("v1"))
    assert await client.is_paused() is False


@pytest.mark.parametrize("transport", ["file", "http"])
async def test_update_makes_new_weights_live(
    tree: Tree, agent_factory: AgentFactory, source_server: Source, apply_mode: str, transport: str
) -> None:
    source = tree.file_uri if transport == "file" else await source_server(tree.root)
    client = await _started(agent_factory, source, apply_mode=apply_mode)
    assert not close_to(tree.expected("v1"), tree.expected("v2")), "versions must be distinguishable"

    code, body = await client.update("v2", verify_checksum=True)
    assert (code, body) == (202, {"accepted": True, "version": "v2"})
    status = await client.wait_settled()

    assert status["version"] == "v2"
    assert status["state"] == "idle"
    assert status["checksum_verified"] is True
    assert status["bytes_done"] == status["bytes_total"] > 0
    assert status["last_load"]["phase"] == "Updated"
    assert close_to(await client.infer(), tree.expected("v2"))
    assert await client.is_paused() is False
    assert await client.metric("ckpt_agent_update_requests_total", {"result": "accepted"}) == 1
    assert await client.metric("ckpt_agent_version_info", {"version": "v2"}) == 1
    assert await client.metric("ckpt_agent_version_info", {"version": "v1"}) == 0


async def test_request_source_and_digest_pin_override_the_default(
    tree: Tree, agent_factory: AgentFactory, source_server: Source
) -> None:
    client = await _started(agent_factory, tree.file_uri)
    url = await source_server(tree.root)
    code, _ = await client.update(
        "v3", verify_checksum=False, source={"uri": url, "manifestDigest": tree.digests["v3"]}
    )
    assert code == 202
    status = await client.wait_settled()
    # verify_checksum false, but the pin implies verification.
    assert (status["version"], status["source"], status["checksum_verified"]) == ("v3", url, True)
    assert close_to(await client.infer(), tree.expected("v3"))


async def test_same_version_again_is_an_idempotent_success(tree: Tree, agent_factory: AgentFactory) -> None:
    client = await _started(agent_factory, tree.file_uri)
    rollout = {"namespace": "rl", "name": "fleet", "uid": "u-1", "wave": 2}
    code, body = await client.update("v1", verify_checksum=True, rollout=rollout)
    assert (code, body) == (200, {"accepted": True, "noop": True, "version": "v1"})
    status = await client.status()
    assert status["updates"]["noop"] == 1
    assert status["updates"]["accepted"] == 0
    report = status["report"]["last"]
    assert (report["phase"], report["reason"], report["version"], report["wave"], report["uid"]) == (
        "Updated",
        "Loaded",
        "v1",
        2,
        "u-1",
    )
    assert await client.metric("ckpt_agent_update_requests_total", {"result": "noop"}) == 1


async def test_same_version_is_reloaded_when_the_request_asks_for_more(
    tree: Tree, agent_factory: AgentFactory
) -> None:
    """Verification the live load skipped, or a different manifest pin, is not a no-op."""
    client = await _started(agent_factory, tree.file_uri, initial_verify=False)
    assert (await client.status())["checksum_verified"] is False
    assert (await client.update("v1", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["checksum_verified"]) == ("v1", True)

    pinned = {"uri": tree.file_uri, "manifestDigest": tree.digests["v2"]}
    assert (await client.update("v1", source=pinned))[0] == 202
    status = await client.wait_settled()
    assert status["last_error"]["reason"] == "ManifestDigestMismatch"
    assert status["version"] == "v1"
    assert (await client.update("v1", verify_checksum=True))[0] == 200


class StallingSource:
    """An HTTP source that accepts connections and answers nothing until released."""

    def __init__(self) -> None:
        self.writers: list[asyncio.StreamWriter] = []
        self.connected = asyncio.Event()

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        self.connected.set()

    async def release(self) -> None:
        for writer in self.writers:
            writer.close()
        self.server.close()
        await self.server.wait_closed()


@pytest.fixture
async def stalling_source() -> AsyncIterator[StallingSource]:
    source = StallingSource()
    yield source
    await source.release()


async def test_second_update_while_loading_is_a_conflict(
    tree: Tree, agent_factory: AgentFactory, stalling_source: StallingSource
) -> None:
    client = await _started(agent_factory, tree.file_uri)
    stalled = await stalling_source.start()
    code, _ = await client.update("v2", source={"uri": stalled})
    assert code == 202
    await asyncio.wait_for(stalling_source.connected.wait(), 10)

    code, body = await client.update("v3")
    assert code == 409
    assert (body["error"], body["target"]) == ("LoadInProgress", "v2")
    status = await client.status()
    assert (status["state"], status["target"], status["version"]) == ("loading", "v2", "v1")
    assert close_to(await client.infer(), tree.expected("v1")), "old weights serve while the new load runs"
    assert await client.metric("ckpt_agent_update_requests_total", {"result": "conflict"}) == 1

    await stalling_source.release()  # the source drops the connection mid-load
    status = await client.wait_settled()
    assert status["state"] == "failed"
    assert status["last_error"]["reason"] == "SourceUnreachable"
    assert status["version"] == "v1"
    assert close_to(await client.infer(), tree.expected("v1"))


async def test_operator_pause_outlives_a_load(tree: Tree, agent_factory: AgentFactory) -> None:
    """A load resumes only what it paused: an explicit /v1/pause stays until /v1/resume."""
    client = await _started(agent_factory, tree.file_uri, apply_mode="streamed")
    code, body = await client.request("POST", "/v1/pause")
    assert (code, body["result"]["is_paused"]) == (200, True)
    code, body = await client.request("POST", "/v1/infer", {})
    assert (code, body["error"]) == (503, "EngineUnavailable")

    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "v2"
    assert await client.is_paused() is True
    assert status["paused_by"] == ["user"]

    code, body = await client.request("POST", "/v1/resume")
    assert (code, body["result"]["is_paused"]) == (200, False)
    assert close_to(await client.infer(), tree.expected("v2"))


async def test_staged_parallel_streams(
    tree: Tree, agent_factory: AgentFactory, source_server: Source
) -> None:
    client = await _started(agent_factory, await source_server(tree.root), parallelism=3)
    assert (await client.update("v2", verify_checksum=True))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    assert close_to(await client.infer(), tree.expected("v2"))
