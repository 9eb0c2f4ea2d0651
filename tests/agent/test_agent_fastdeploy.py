"""The FastDeploy adapter against a stand-in that follows FastDeploy's documented V1 API:
pause -> update_weights{version, verify_checksum} -> resume, always resume."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator

import pytest
from agent_testkit import AgentClient, AgentFactory, Tree
from fastdeploy_standin import FastDeployStandIn

ROLLOUT = {"namespace": "rl", "name": "fleet", "uid": "u", "wave": 0}


@pytest.fixture
async def fastdeploy() -> AsyncIterator[FastDeployStandIn]:
    standin = FastDeployStandIn()
    await standin.server.start()
    yield standin
    await standin.server.stop()


async def _agent(agent_factory: AgentFactory, fd: FastDeployStandIn, **overrides: object) -> AgentClient:
    return await agent_factory(
        engine="fastdeploy", fastdeploy_url=fd.server.url, initial_version="v1", **overrides
    )


async def test_update_drives_pause_update_resume(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    client = await _agent(agent_factory, fastdeploy)
    assert (await client.status())["version"] == "v1"
    assert (await client.update("v2", verify_checksum=True, rollout=ROLLOUT))[0] == 202
    status = await client.wait_settled()
    assert fastdeploy.calls == [
        ("pause", None),
        ("update_weights", {"version": "v2", "verify_checksum": True}),
        ("resume", None),
    ]
    assert (status["version"], status["state"], status["checksum_verified"]) == ("v2", "idle", True)
    assert status["report"]["last"]["phase"] == "Updated"
    assert fastdeploy.version == "v2"
    assert await client.is_paused() is False
    code, body = await client.request("POST", "/v1/infer", {})
    assert (code, body["error"]) == (404, "NotSupported")


async def test_engine_failure_is_reported_and_the_engine_resumed(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    fastdeploy.failing_versions.add("v2")
    client = await _agent(agent_factory, fastdeploy)
    assert (await client.update("v2", rollout=ROLLOUT))[0] == 202
    status = await client.wait_settled()
    assert fastdeploy.names == ["pause", "update_weights", "resume"]
    assert not fastdeploy.paused
    assert (status["state"], status["version"]) == ("failed", "v1")
    assert status["last_error"]["reason"] == "EngineError"
    assert "checksum error" in status["last_error"]["message"]
    assert status["report"]["last"]["reason"] == "EngineError"


async def test_operator_pause_is_kept_across_a_load(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    client = await _agent(agent_factory, fastdeploy)
    assert (await client.request("POST", "/v1/pause"))[0] == 200
    assert (await client.update("v2"))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    assert fastdeploy.names == ["pause", "update_weights"]
    assert await client.is_paused() is True
    assert (await client.request("POST", "/v1/resume"))[0] == 200
    assert fastdeploy.names == ["pause", "update_weights", "resume"]


async def test_unreachable_engine(agent_factory: AgentFactory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = await agent_factory(
        engine="fastdeploy", fastdeploy_url=f"http://127.0.0.1:{port}", initial_version="v1"
    )
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["last_error"]["reason"]) == ("failed", "EngineError")
    code, body = await client.request("GET", "/v1/is_paused")
    assert (code, body["error"]) == (502, "EngineError")


async def test_manifest_preflight_refuses_before_pausing(
    tree: Tree, agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    client = await _agent(agent_factory, fastdeploy, source=tree.file_uri)
    assert (await client.update("v404"))[0] == 202
    assert (await client.wait_settled())["last_error"]["reason"] == "VersionNotFound"
    pinned = {"uri": tree.file_uri, "manifestDigest": tree.digests["v1"]}
    assert (await client.update("v2", source=pinned))[0] == 202
    assert (await client.wait_settled())["last_error"]["reason"] == "ManifestDigestMismatch"
    assert fastdeploy.calls == [], "a refused version must not pause the engine"

    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["manifest_digest"]) == ("v2", tree.digests["v2"])
    assert status["bytes_total"] == sum(t["nbytes"] for t in tree.manifest("v2")["tensors"])


async def test_a_peer_is_not_used_by_an_engine_that_pulls_by_itself(
    tree: Tree, agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    client = await _agent(agent_factory, fastdeploy, source=tree.file_uri)
    body = {"uri": tree.file_uri, "peer": "http://127.0.0.1:9"}
    assert (await client.update("v2", verify_checksum=True, source=body))[0] == 202
    status = await client.wait_settled()
    last = status["last_load"]
    assert (status["version"], last["peer"], last["bytes_from_peer"]) == ("v2", "http://127.0.0.1:9", 0)
    assert last["fallback_reason"] is None
    assert fastdeploy.names == ["pause", "update_weights", "resume"]
