"""FastDeploy's own client tests, re-expressed: the assertions of FastDeploy's
tests/ce/server/test_update_weight.py (upstream commit c1b7c083da606ed7f3ac35c2f905dc904f1163b2,
now tests/ci_validation/server/) and of its example pause -> update_weights -> resume script,
run against three servers:

- `fastdeploy`: the stand-in itself, which must be faithful to what FastDeploy's tests expect;
- `agent`: our agent (reference paddle engine), as a drop-in for FastDeploy;
- `agent+fastdeploy`: our agent driving the stand-in through the FastDeploy adapter, where the
  engine behind the agent must also be in the state the client was told.

FastDeploy's helpers assert HTTP 200 and `status == "success"` on every call, and read
`result.is_paused`. Its concurrent cases use 5 threads; here 5 concurrent requests (separate
connections) on one event loop, which is the same to the server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from agent_testkit import AgentClient, AgentFactory, Tree
from fastdeploy_standin import FastDeployStandIn

TARGETS = ["fastdeploy", "agent", "agent+fastdeploy"]


@dataclass
class FastDeployClient:
    """FastDeploy's test helpers: pause(), resume(), is_paused(expected), and update_weights
    as its example script sends it. No Prefer header, no rollout: a plain FastDeploy client."""

    http: AgentClient
    # The engine behind an agent, if it has its own state to check (None: nothing behind).
    engine_paused: Callable[[], bool] | None = None

    async def _ok(self, method: str, path: str, body: Any = None) -> Any:
        code, reply = await self.http.request(method, path, body)
        assert code == 200, reply
        assert reply["status"] == "success", reply
        return reply["result"]

    async def pause(self) -> None:
        await self._ok("POST", "/v1/pause")

    async def resume(self) -> None:
        await self._ok("POST", "/v1/resume")

    async def is_paused(self, expected: bool | None = None) -> bool:
        paused = (await self._ok("GET", "/v1/is_paused"))["is_paused"]
        if expected is not None:
            assert paused == expected
            if self.engine_paused is not None:
                assert self.engine_paused() == expected, "the engine behind the agent disagrees"
        return bool(paused)

    async def update_weights(self, version: str) -> list[dict[str, Any]]:
        result = await self._ok("POST", "/v1/update_weights", {"version": version, "verify_checksum": False})
        assert isinstance(result, list)
        return result


@dataclass
class Target:
    fd: FastDeployClient
    live: Callable[[], Awaitable[str | None]]  # the version served, as the server says


@pytest.fixture(params=TARGETS)
async def target(
    request: pytest.FixtureRequest, tree: Tree, agent_factory: AgentFactory, session: aiohttp.ClientSession
) -> AsyncIterator[Target]:
    standin = FastDeployStandIn("v1", tp=2)
    await standin.server.start()
    try:
        if request.param == "fastdeploy":

            async def served() -> str | None:
                return standin.version

            yield Target(FastDeployClient(AgentClient(session, standin.server.url)), served)
            return
        if request.param == "agent":
            client = await agent_factory(source=tree.file_uri, initial_version="v1")
            await client.wait_settled()
            fd = FastDeployClient(client)
        else:
            client = await agent_factory(
                engine="fastdeploy", fastdeploy_url=standin.server.url, initial_version="v1"
            )
            fd = FastDeployClient(client, engine_paused=lambda: standin.paused)

        async def live() -> str | None:
            version: str | None = (await client.status())["version"]
            if request.param == "agent+fastdeploy":
                assert standin.version == version, (standin.ranks, version)
            return version

        yield Target(fd, live)
    finally:
        await standin.server.stop()


async def test_basic(target: Target) -> None:
    fd = target.fd
    await fd.is_paused(False)
    await fd.pause()
    await fd.is_paused(True)
    await fd.resume()
    await fd.is_paused(False)


async def test_reentrant(target: Target) -> None:
    fd = target.fd
    await fd.pause()
    await fd.pause()
    await fd.is_paused(True)
    await fd.resume()
    await fd.resume()
    await fd.is_paused(False)


async def test_reentrant1(target: Target) -> None:
    fd = target.fd
    for _ in range(9):
        await fd.pause()
    await fd.is_paused(True)
    for _ in range(9):
        await fd.resume()
    await fd.is_paused(False)


async def test_reentrant2(target: Target) -> None:
    fd = target.fd
    for _ in range(9):
        await fd.pause()
        await fd.resume()
    await fd.is_paused(False)
    for _ in range(9):
        await fd.resume()
        await fd.pause()
    await fd.is_paused(True)
    await fd.resume()
    await fd.is_paused(False)


async def test_concurrent_pause_resume(target: Target) -> None:
    fd = target.fd
    await asyncio.gather(*(fd.pause() for _ in range(5)))
    await fd.is_paused(True)
    await asyncio.gather(*(fd.resume() for _ in range(5)))
    await fd.is_paused(False)


async def test_pause_update_weights_resume(target: Target) -> None:
    """FastDeploy's documented sequence; update_weights answers once the version is loaded."""
    fd = target.fd
    await fd.pause()
    ranks = await fd.update_weights("v2")
    assert ranks, "one result per rank"
    assert all(r["version"] == "v2" for r in ranks), ranks
    assert [r["rank"] for r in ranks] == list(range(len(ranks)))
    assert all(r["total_cost"] >= 0 for r in ranks)
    await fd.is_paused(True)  # update_weights never resumes
    await fd.resume()
    await fd.is_paused(False)
    assert await target.live() == "v2"
