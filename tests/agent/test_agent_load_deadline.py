"""A load that moves bytes too slowly, outlives its deadline or is cancelled ends cleanly: the
blocked read is cut, the previous version serves again, the engine is not left paused, and the
agent takes the next update (issue 32 item 5).

A source that trickles a byte at a time is never caught by per-read timeouts; only the agent's
floor on bytes per second (--min-load-rate over --load-rate-window) or the request's
deadline_seconds stops it, and POST /v1/cancel_load stops any load on request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from agent_testkit import AgentClient, AgentFactory, Tree, close_to, wait_until
from aiohttp import web
from held_source import HeldSource

from ckpt_agent.server.httpserver import AppServer
from ckpt_agent.service.reporting import DisabledReporter
from ckpt_api.manifest import MANIFEST_NAME
from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import WorkerPhase, WorkerReason
from ckpt_rollout.io.agent_client import AgentClient as OperatorAgentClient
from ckpt_rollout.io.agent_tokens import NoToken

# Judged over a second: a trickle fails in about that, a local load is done long before.
WINDOW_S = 1.0
FLOOR = 1 << 20
# What a trickling server sends, and how often: far below the floor, yet never silent for long
# enough that a per-read timeout (30 s for a source, 10 s for a peer) would notice.
TRICKLE_BYTES = 1
TRICKLE_EVERY_S = 0.05


class TrickleServer(AppServer):
    """Serves a published tree as `ckpt-rollout serve` (under `prefix`: `/v1/relay` makes it look
    like a peer's relay), manifests whole and shard bytes a byte at a time."""

    def __init__(self, root: Path, prefix: str = "") -> None:
        self.root = root
        self.ranges_served = 0
        app = web.Application()
        app.router.add_get(prefix + "/{version}/{file}", self._file)
        super().__init__(app, "127.0.0.1", 0)

    async def _file(self, request: web.Request) -> web.StreamResponse:
        path = self.root / request.match_info["version"] / request.match_info["file"]
        if not path.is_file():
            raise web.HTTPNotFound()
        data = path.read_bytes()
        if path.name == MANIFEST_NAME:
            return web.Response(body=data, content_type="application/json")
        wanted = request.http_range
        start, stop = wanted.start or 0, len(data) if wanted.stop is None else min(wanted.stop, len(data))
        resp = web.StreamResponse(status=206)
        resp.content_length = stop - start
        resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        await resp.prepare(request)
        self.ranges_served += 1
        for pos in range(start, stop, TRICKLE_BYTES):
            await resp.write(data[pos : pos + TRICKLE_BYTES])
            await asyncio.sleep(TRICKLE_EVERY_S)
        await resp.write_eof()
        return resp


@pytest.fixture
async def trickle(tree: Tree) -> AsyncIterator[TrickleServer]:
    server = TrickleServer(tree.root)
    await server.start()
    yield server
    await server.stop()


@pytest.fixture
async def held(tree: Tree) -> AsyncIterator[HeldSource]:
    source = HeldSource(tree.root)
    await source.start()
    yield source
    await source.stop()


async def _serving_v1(agent_factory: AgentFactory, source: str, **overrides: Any) -> AgentClient:
    """A streamed agent serving v1 from `source`: the engine is paused for the whole of a load."""
    overrides.setdefault("min_load_rate", FLOOR)
    overrides.setdefault("load_rate_window", WINDOW_S)
    client = await agent_factory(source=source, initial_version="v1", apply_mode="streamed", **overrides)
    assert (await client.wait_settled())["version"] == "v1"
    return client


async def _serves_v1_and_takes_v3(client: AgentClient, tree: Tree, source: str) -> None:
    """After a failed or cancelled load: v1 answers, nothing holds the engine, and the next
    update is taken (202, not 409 LoadInProgress) and loads."""
    assert close_to(await client.infer(), tree.expected("v1"))
    assert not await client.is_paused()
    code, body = await client.update("v3", source={"uri": source})
    assert code == 202, body
    status = await client.wait_settled()
    assert (status["version"], status["state"]) == ("v3", "idle"), status
    assert close_to(await client.infer(), tree.expected("v3"))


async def _loading(client: AgentClient) -> None:
    """Wait until the load is reading tensors (the manifest is in, the engine paused)."""

    async def reading() -> bool:
        status = await client.status()
        return status["state"] == "loading" and status["bytes_total"] > 0 and await client.is_paused()

    await wait_until(reading, 10, "the load to start reading tensors")


async def test_a_trickling_source_fails_the_load_and_v1_serves_again(
    tree: Tree, agent_factory: AgentFactory, source_server: Any, trickle: TrickleServer
) -> None:
    fast = await source_server(tree.root)
    client = await _serving_v1(agent_factory, fast)
    code, body = await client.update("v2", source={"uri": trickle.url})
    assert code == 202, body

    status = await client.wait_settled(limit_s=20)

    error = status["last_error"]
    assert (error["version"], error["reason"]) == ("v2", "SourceUnreachable"), error
    assert "too slow" in error["message"], error
    assert "--min-load-rate" in error["message"], error
    assert (status["version"], status["weights_lost"]) == ("v1", False), status
    await _serves_v1_and_takes_v3(client, tree, fast)


async def test_a_trickling_peer_is_dropped_for_the_source(
    tree: Tree, agent_factory: AgentFactory, source_server: Any
) -> None:
    fast = await source_server(tree.root)
    peer = TrickleServer(tree.root, prefix="/v1/relay")
    await peer.start()
    peer_url = peer.url
    try:
        client = await _serving_v1(agent_factory, fast)
        code, body = await client.update("v2", source={"uri": fast, "peer": peer_url})
        assert code == 202, body

        status = await client.wait_settled(limit_s=20)

        assert (status["version"], status["last_error"]) == ("v2", None), status
        last = status["last_load"]
        assert last["peer"] == peer_url, last
        assert peer.ranges_served > 0  # the peer was read, and dropped
        assert "too slow" in (last["fallback_reason"] or ""), last
        assert last["bytes_from_source"] > 0, last
        assert close_to(await client.infer(), tree.expected("v2"))
    finally:
        await peer.stop()


async def test_deadline_seconds_fails_a_stalled_load(
    tree: Tree, agent_factory: AgentFactory, source_server: Any, held: HeldSource
) -> None:
    fast = await source_server(tree.root)
    # The floor off: only the request's deadline can stop this load.
    client = await _serving_v1(agent_factory, fast, min_load_rate=0)
    code, body = await client.update("v2", source={"uri": held.url}, deadline_seconds=1)
    assert code == 202, body

    status = await client.wait_settled(limit_s=20)

    error = status["last_error"]
    assert (error["version"], error["reason"]) == ("v2", "SourceUnreachable"), error
    assert "deadline_seconds (1s)" in error["message"], error
    assert status["version"] == "v1", status
    await _serves_v1_and_takes_v3(client, tree, fast)


class _Reports(DisabledReporter):
    """What the agent would write into its rollout's status."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[tuple[str, str]] = []

    def worker_event(self, rollout: Any, entry: WorkerStatus) -> None:
        self.entries.append((entry.phase, entry.reason))
        super().worker_event(rollout, entry)


async def test_cancel_load_stops_a_stalled_load_of_that_version_only(
    tree: Tree, agent_factory: AgentFactory, source_server: Any, held: HeldSource
) -> None:
    fast = await source_server(tree.root)
    client = await _serving_v1(agent_factory, fast, min_load_rate=0)
    assert client.agent is not None
    reports = client.agent.service.reporter = _Reports()
    rollout = {"namespace": "rl", "name": "fleet", "uid": "u-1", "wave": 0}
    code, body = await client.update("v2", source={"uri": held.url}, rollout=rollout)
    assert code == 202, body
    await _loading(client)

    # Another version named: a caller must never stop a load it did not mean.
    code, body = await client.request("POST", "/v1/cancel_load", {"version": "v3"})
    assert (code, body["error"], body["target"]) == (409, "LoadInProgress", "v2"), body
    assert (await client.status())["state"] == "loading"

    # As the operator sends it when it gives a load up (its own client, so the two agree).
    parts = urlsplit(client.url)
    operator = OperatorAgentClient(NoToken(), timeout_s=15, connect_attempts=1)
    try:
        result = await operator.cancel_load(
            str(parts.hostname), int(parts.port or 0), "v2", namespace="rl", pod="w-0"
        )
    finally:
        await operator.close()

    # Answered once the load ended: the held read was cut, not left to its 30 s timeout.
    assert (result.status, result.body) == (200, {"version": "v2", "ended": True, "live_version": "v1"})
    status = await client.status()
    error = status["last_error"]
    assert (error["version"], error["reason"]) == ("v2", "Cancelled"), error
    assert "/v1/cancel_load" in error["message"], error
    assert (status["version"], status["state"]) == ("v1", "failed"), status
    # Nothing written over the verdict of whoever cancelled (the operator's WorkerTimeout, say).
    assert reports.entries == [(WorkerPhase.LOADING, WorkerReason.LOADING)]
    await _serves_v1_and_takes_v3(client, tree, fast)

    code, body = await client.request("POST", "/v1/cancel_load")
    assert (code, body["error"]) == (404, "NotFound"), body


async def test_cancel_load_refuses_a_bad_body(tree: Tree, agent_factory: AgentFactory) -> None:
    client = await agent_factory(source=tree.file_uri)
    code, body = await client.request("POST", "/v1/cancel_load", {"version": "../etc"})
    assert (code, body["field"]) == (400, "version"), body
    code, body = await client.request("POST", "/v1/cancel_load", {"versio": "v2"})
    assert (code, body["error"]) == (400, "InvalidRequest"), body
