"""Pipelined relay between real agents (issue #15): a load asked to `relayWhileLoading` serves
each tensor onward once it verified it, so a chain of agents loads one version at once; a peer
that fails part way (gone, its load failed, bad bytes) is dropped and the load resumes by tensor
from the source. The source is held (held_source.HeldSource) so that "still loading" is a state
the test sets, not a race it hopes to win."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent_testkit import (
    SPEC,
    STATIC_TOKEN,
    AgentClient,
    AgentFactory,
    Tree,
    ckpt_agent_process,
    close_to,
    static_token_agent,
    wait_until,
)
from held_source import HeldSource

from ckpt_agent.server import relay_routes as relay_http
from ckpt_api.manifest import TensorRecord

PULLED = "ckpt_agent_pulled_bytes_total"


@pytest.fixture
async def held(tree: Tree, agent_factory: AgentFactory) -> AsyncIterator[HeldSource]:
    """A held source of the shared tree. Set up after the agents' factory so that it is torn
    down first: a load still held fails then, instead of holding the agents' shutdown."""
    source = HeldSource(tree.root)
    await source.start()
    yield source
    await source.stop()


def _peer_uri(agent: AgentClient, transport: str) -> str:
    return agent.url if transport == "http" else "mooncake://127.0.0.1:" + agent.url.rsplit(":", 1)[1]


def _relays(agent: AgentClient, version: str, entry: TensorRecord) -> bool:
    """Whether `agent` serves `entry` of `version` onward (its load verified it)."""
    copy = agent.agent.service.relay
    return copy is not None and copy.version == version and copy.is_ready(entry)


async def _relaying(agent: AgentClient, version: str, entry: TensorRecord) -> bool:
    return _relays(agent, version, entry)


@pytest.mark.parametrize("transport", ["http", "mooncake"])
async def test_a_chain_of_four_loads_one_version_while_its_head_still_loads(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, held: HeldSource, transport: str
) -> None:
    overrides: dict[str, Any] = {"relay_mooncake": "tcp"} if transport == "mooncake" else {}
    chain = [
        await static_token_agent(agent_factory, token_file, source=held.url, **overrides) for _ in range(4)
    ]
    head, tail = chain[0], chain[-1]
    sources = [{"uri": held.url, "relayWhileLoading": True}] + [
        {"uri": held.url, "peer": _peer_uri(parent, transport), "relayWhileLoading": True}
        for parent in chain[:-1]
    ]
    # All at once, as the operator calls a wave: each waits for its parent to begin relaying.
    answers = await asyncio.gather(*(a.update("v2", source=s) for a, s in zip(chain, sources, strict=True)))
    assert [code for code, _ in answers] == [202] * 4, answers

    entries = held.entries("v2")
    first = entries[0]
    await held.allow("v2", first)
    await wait_until(lambda: _relaying(tail, "v2", first), 10, "the chain's tail to verify the first tensor")
    # The tail verified bytes that came down the chain while its head holds one tensor of the
    # version: the head's load runs on, its copy incomplete; no one has more than that tensor.
    assert head.agent.service.relay.complete is False
    assert (await head.status())["state"] == "loading"
    for position, agent in enumerate(chain):
        status = await agent.status()
        assert (status["state"], status["target"], status["relay"]["version"]) == ("loading", "v2", "v2")
        assert not _relays(agent, "v2", entries[1]), position
    assert await tail.metric(PULLED, {"origin": "peer"}) >= first.nbytes

    await held.release()
    total = tree.tensor_bytes("v2")
    for position, agent in enumerate(chain):
        status = await agent.wait_settled()
        last = status["last_load"]
        assert (status["state"], status["version"], last["fallback_reason"]) == ("idle", "v2", None), position
        assert close_to(await agent.infer(), tree.expected("v2")), position
        expected = (0, total) if position == 0 else (total, 0)
        assert (last["bytes_from_peer"], last["bytes_from_source"]) == expected, position
        assert await agent.metric(PULLED, {"origin": "peer"}) == expected[0], position
        assert await agent.metric(PULLED, {"origin": "source"}) == expected[1], position
        # Complete now: served as any finished copy (the next wave reads it in turn).
        assert status["relay"]["version"] == "v2"
        assert agent.agent.service.relay.complete is True


async def test_a_reader_called_before_its_peer_waits_for_it_to_begin(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, held: HeldSource, source_server: Any
) -> None:
    """The operator calls a chain at once, so a reader may ask before its peer began the load:
    it waits (bounded, PEER_START_WAIT_S) instead of falling back at once."""
    plain = await source_server(tree.root)
    peer = await static_token_agent(agent_factory, token_file, source=held.url)
    reader = await static_token_agent(agent_factory, token_file, source=plain)
    assert (await reader.update("v2", source={"uri": plain, "peer": peer.url}))[0] == 202
    # The reader is loading and has nothing yet (the peer has no v2 to relay).
    status = await reader.status()
    assert (status["state"], status["target"], status["bytes_done"]) == ("loading", "v2", 0)
    assert (await peer.status())["relay"] is None

    assert (await peer.update("v2", source={"uri": held.url, "relayWhileLoading": True}))[0] == 202
    await held.release()
    status = await reader.wait_settled()
    last = status["last_load"]
    assert (status["version"], last["fallback_reason"]) == ("v2", None)
    assert (last["bytes_from_peer"], last["bytes_from_source"]) == (tree.tensor_bytes("v2"), 0)
    assert close_to(await reader.infer(), tree.expected("v2"))


async def _loses_its_peer_part_way(
    tree: Tree,
    reader: AgentClient,
    peer: AgentClient,
    held: HeldSource,
    plain: str,
    lose: Callable[[], Awaitable[None]],
) -> None:
    """`peer` loads v2 from `held` relaying as it loads, `reader` from `peer` (its own source:
    `plain`); once the reader verified the first tensor from the peer, `lose` ends the peer's
    relay. The reader must keep that tensor and take the rest from its source."""
    assert (await peer.update("v2", source={"uri": held.url, "relayWhileLoading": True}))[0] == 202
    body = {"uri": plain, "peer": peer.url, "relayWhileLoading": True}
    assert (await reader.update("v2", source=body))[0] == 202
    first = held.entries("v2")[0]
    await held.allow("v2", first)
    await wait_until(lambda: _relaying(reader, "v2", first), 10, "the reader to verify the first tensor")

    await lose()
    status = await reader.wait_settled()
    last = status["last_load"]
    assert (status["state"], status["version"], last["peer"]) == ("idle", "v2", peer.url)
    assert peer.url in (last["fallback_reason"] or ""), last
    # Resumed by tensor: the first tensor as the peer sent it, the others (all held there) from
    # the source; nothing read twice.
    total = tree.tensor_bytes("v2")
    assert (last["bytes_from_peer"], last["bytes_from_source"]) == (first.nbytes, total - first.nbytes)
    assert await reader.metric(PULLED, {"origin": "peer"}) == first.nbytes
    assert await reader.metric(PULLED, {"origin": "source"}) == total - first.nbytes
    assert close_to(await reader.infer(), tree.expected("v2"))
    assert status["relay"]["version"] == "v2", "what it loaded in the end it relays, complete"
    assert reader.agent.service.relay.complete is True


async def test_a_peer_killed_mid_stream_leaves_the_rest_to_the_source(
    tree: Tree,
    agent_factory: AgentFactory,
    token_file: Path,
    held: HeldSource,
    source_server: Any,
    session: aiohttp.ClientSession,
) -> None:
    plain = await source_server(tree.root)
    reader = await static_token_agent(agent_factory, token_file, source=plain)
    async with ckpt_agent_process(
        "agent", "--port", "0", "--metrics-port", "0", "--source", held.url, "--auth-token-file",
        str(token_file), "--plain-http", "--no-report", "--model-hidden", str(SPEC.hidden),
        "--model-layers", str(SPEC.layers), "--model-outputs", str(SPEC.outputs),
        "--relay-token-file", str(token_file.with_name("relay-token")),
    ) as (proc, url):  # fmt: skip
        peer = AgentClient(session, url, STATIC_TOKEN)

        async def kill() -> None:
            proc.send_signal(signal.SIGKILL)
            assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGKILL

        await _loses_its_peer_part_way(tree, reader, peer, held, plain, kill)


async def test_a_peer_whose_load_fails_mid_stream_leaves_the_rest_to_the_source(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, held: HeldSource, source_server: Any
) -> None:
    """The peer's own source fails: its load fails, its copy is released, and the streams it
    was relaying end early."""
    plain = await source_server(tree.root)
    reader = await static_token_agent(agent_factory, token_file, source=plain)
    peer = await static_token_agent(agent_factory, token_file, source=held.url)
    await _loses_its_peer_part_way(tree, reader, peer, held, plain, held.break_streams)
    status = await peer.status()
    assert (status["state"], status["relay"]) == ("failed", None)
    assert peer.agent.service.relay is None


@pytest.mark.parametrize("transport", ["http", "mooncake"])
async def test_a_peer_still_loading_that_serves_a_corrupted_tensor_is_dropped(
    tree: Tree,
    agent_factory: AgentFactory,
    token_file: Path,
    held: HeldSource,
    source_server: Any,
    transport: str,
) -> None:
    """The peer verified a tensor, then its staged copy went bad before the reader read it,
    while the peer still loads: the reader refuses it (sha256), reads nothing more from that
    peer and finishes from the source, without waiting for the peer's load."""
    overrides: dict[str, Any] = {"relay_mooncake": "tcp"} if transport == "mooncake" else {}
    peer = await static_token_agent(agent_factory, token_file, source=held.url, **overrides)
    assert (await peer.update("v2", source={"uri": held.url, "relayWhileLoading": True}))[0] == 202
    first, second = held.entries("v2")[:2]
    assert first.file == second.file, "held in one shard"
    await held.allow("v2", second)
    await wait_until(lambda: _relaying(peer, "v2", second), 10, "the peer to verify two tensors")
    copy = peer.agent.service.relay
    copy.store.buffer(second)[second.nbytes // 2] ^= 0xFF

    plain = await source_server(tree.root)
    reader = await static_token_agent(agent_factory, token_file, source=plain, **overrides)
    body = {"uri": plain, "peer": _peer_uri(peer, transport)}
    assert (await reader.update("v2", source=body))[0] == 202
    status = await reader.wait_settled()
    assert copy.complete is False, "the peer still loads"
    assert (await peer.status())["state"] == "loading"
    last = status["last_load"]
    assert (status["state"], status["version"]) == ("idle", "v2")
    reason = last["fallback_reason"]
    assert reason.startswith("ChecksumMismatch"), reason
    assert f"tensor {second.name!r}" in reason, reason
    assert "blake3" in reason, "peer bytes are checked against the blake3"
    # The peer sent the first tensor and the bad one; the bad one and all after it came from
    # the source.
    total = tree.tensor_bytes("v2")
    peer_bytes = first.nbytes + second.nbytes
    assert (last["bytes_from_peer"], last["bytes_from_source"]) == (peer_bytes, total - first.nbytes)
    assert await reader.metric(PULLED, {"origin": "peer"}) == peer_bytes
    assert close_to(await reader.infer(), tree.expected("v2"))
    await held.release()
    # (The peer applies the damaged tensor: the damage came after its own check, which is what
    # the reader's check of every peer byte is for.)
    assert (await peer.wait_settled())["version"] == "v2"


async def test_ready_answers_per_tensor_while_the_load_runs(
    tree: Tree,
    agent_factory: AgentFactory,
    token_file: Path,
    held: HeldSource,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`?ready=a-b`, what a Mooncake reader asks before it reads memory the load may still be
    filling: false while a tensor there is not verified (after a wait, shortened here), true once
    it is, 404 NotRelayable once the load failed (a waiting ask too)."""
    monkeypatch.setattr(relay_http, "READY_WAIT_S", 0.2)
    peer = await static_token_agent(agent_factory, token_file, source=held.url)
    assert (await peer.update("v2", source={"uri": held.url, "relayWhileLoading": True}))[0] == 202
    first, second = held.entries("v2")[:2]
    assert first.file == second.file, "held in one shard"

    async def ready(span: str) -> tuple[int, Any]:
        return await peer.request("GET", f"/v1/relay/v2/{first.file}?ready={span}")

    async def published() -> bool:
        return (await peer.status())["relay"] is not None

    await wait_until(published, 10, "the load to publish its copy")
    for bad in ("", "7", "5-5", "9-2", "a-b", "-3", "1-2-3"):
        code, body = await ready(bad)
        assert (code, body["error"]) == (400, "InvalidRequest"), bad
    assert await ready(f"{first.offset}-{first.end}") == (200, {"ready": False, "complete": False})

    await held.allow("v2", first)

    async def first_ready() -> bool:
        return (await ready(f"{first.offset}-{first.end}"))[1]["ready"] is True

    await wait_until(first_ready, 10, "the first tensor to be verified")
    assert await ready(f"{first.offset}-{first.end}") == (200, {"ready": True, "complete": False})
    # A range reaching into a tensor still held is not ready.
    assert await ready(f"{first.offset}-{second.offset + 1}") == (200, {"ready": False, "complete": False})

    monkeypatch.setattr(relay_http, "READY_WAIT_S", 30.0)
    waiting = asyncio.create_task(ready(f"{second.offset}-{second.end}"))
    await held.break_streams()
    code, body = await asyncio.wait_for(waiting, 10)
    assert (code, body["error"]) == (404, "NotRelayable")
    assert (await peer.wait_settled())["state"] == "failed"
    code, body = await ready(f"{first.offset}-{first.end}")
    assert (code, body["error"]) == (404, "NotRelayable")
