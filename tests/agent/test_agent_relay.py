"""Peer relay between real agents: the manifest from the original source, tensor bytes from a
peer that loaded and verified the version, every byte verified against the source's manifest;
a bad or absent peer makes the agent load from the source instead (recorded in last_load)."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from agent_testkit import (
    STATIC_TOKEN,
    AgentClient,
    AgentFactory,
    Tree,
    close_to,
    corrupt_tensor,
    static_token_agent,
)

from ckpt_agent.pipeline import relay_peer


async def _peer_with(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, version: str, **overrides: Any
) -> AgentClient:
    peer = await static_token_agent(agent_factory, token_file, source=tree.file_uri, **overrides)
    assert (await peer.update(version, verify_checksum=True))[0] == 202
    status = await peer.wait_settled()
    assert status["version"] == version
    assert status["relay"]["version"] == version
    return peer


def _total(tree: Tree, version: str) -> int:
    return sum(t["nbytes"] for t in tree.manifest(version)["tensors"])


@pytest.mark.parametrize("peer_mode", ["staged", "streamed"])
async def test_agent_loads_from_a_peer_over_http(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, source_server: Any, peer_mode: str
) -> None:
    peer = await _peer_with(tree, agent_factory, token_file, "v2", apply_mode=peer_mode)
    source = await source_server(tree.root)
    client = await static_token_agent(agent_factory, token_file, source=source, initial_version="v1")
    await client.wait_settled()

    # verify_checksum false: bytes from a peer are verified anyway.
    body = {"uri": source, "manifestDigest": tree.digests["v2"], "peer": peer.url}
    assert (await client.update("v2", verify_checksum=False, source=body))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["checksum_verified"], status["source"]) == ("v2", True, source)
    last = status["last_load"]
    assert (last["peer"], last["fallback_reason"]) == (peer.url, None)
    assert (last["bytes_from_peer"], last["bytes_from_source"]) == (_total(tree, "v2"), 0)
    pulled = "ckpt_agent_pulled_bytes_total"
    assert await client.metric(pulled, {"origin": "peer"}) == _total(tree, "v2")
    assert await client.metric(pulled, {"origin": "source"}) == _total(tree, "v1"), "the initial load"
    assert close_to(await client.infer(), tree.expected("v2"))
    # The new holder relays it in turn (wave relay).
    assert status["relay"]["version"] == "v2"


async def test_agent_loads_from_a_peer_over_mooncake(
    tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    peer = await _peer_with(tree, agent_factory, token_file, "v3", relay_mooncake="tcp")
    client = await static_token_agent(agent_factory, token_file, source=tree.file_uri, initial_version="v1")
    await client.wait_settled()
    peer_uri = "mooncake://127.0.0.1:" + peer.url.rsplit(":", 1)[1]
    assert (await client.update("v3", source={"uri": tree.file_uri, "peer": peer_uri}))[0] == 202
    status = await client.wait_settled()
    last = status["last_load"]
    assert (status["version"], last["peer"], last["fallback_reason"]) == ("v3", peer_uri, None)
    assert last["bytes_from_peer"] == _total(tree, "v3")
    assert close_to(await client.infer(), tree.expected("v3"))


@pytest.mark.parametrize("transport", ["http", "mooncake"])
async def test_a_peer_serving_corrupted_bytes_cannot_inject_weights(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, transport: str
) -> None:
    """The peer's kept copy is damaged after it verified it: the asking agent catches the bad
    tensor with the source manifest's checksum, drops the peer and loads the rest from the
    source, resuming by tensor (what verified from the peer stays)."""
    peer = await _peer_with(tree, agent_factory, token_file, "v2", relay_mooncake="tcp")
    copy = peer.agent.service.relay
    entry = copy.manifest.tensors[len(copy.manifest.tensors) // 2]
    view = copy.store.buffer(entry)
    view[entry.nbytes // 2] ^= 0xFF
    peer_uri = peer.url if transport == "http" else "mooncake://127.0.0.1:" + peer.url.rsplit(":", 1)[1]

    client = await static_token_agent(agent_factory, token_file, source=tree.file_uri, initial_version="v1")
    await client.wait_settled()
    assert (await client.update("v2", source={"uri": tree.file_uri, "peer": peer_uri}))[0] == 202
    status = await client.wait_settled()
    last = status["last_load"]
    assert status["version"] == "v2"
    assert last["fallback_reason"].startswith("ChecksumMismatch")
    assert entry.name in last["fallback_reason"]
    assert "blake3" in last["fallback_reason"], "peer bytes are checked against the blake3"
    total = _total(tree, "v2")
    # The bad tensor and those after it from the source; those before it stayed as the peer sent them.
    assert entry.nbytes <= last["bytes_from_source"] < total
    assert 0 < last["bytes_from_peer"] < total
    assert last["bytes_from_peer"] + last["bytes_from_source"] >= total
    pulled = "ckpt_agent_pulled_bytes_total"
    assert await client.metric(pulled, {"origin": "peer"}) == last["bytes_from_peer"]
    assert await client.metric(pulled, {"origin": "source"}) == _total(tree, "v1") + last["bytes_from_source"]
    assert close_to(await client.infer(), tree.expected("v2"))


async def test_bad_peer_and_bad_source_leave_the_old_weights_live(
    scratch_tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    """Nothing verified, nothing applied: with both the peer and the source wrong (and the
    request asking for verification, so the source's bytes are checked too), the load fails
    and the previous version keeps serving."""
    peer = await _peer_with(scratch_tree, agent_factory, token_file, "v2")
    copy = peer.agent.service.relay
    entry = copy.manifest.tensors[0]
    copy.store.buffer(entry)[0] ^= 0xFF
    corrupt_tensor(scratch_tree.root / "v2", entry.name)

    client = await static_token_agent(
        agent_factory, token_file, source=scratch_tree.file_uri, initial_version="v1"
    )
    await client.wait_settled()
    body = {"uri": scratch_tree.file_uri, "peer": peer.url}
    assert (await client.update("v2", verify_checksum=True, source=body))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"]) == ("failed", "v1")
    assert status["last_error"]["reason"] == "ChecksumMismatch"
    assert status["last_load"]["fallback_reason"].startswith("ChecksumMismatch")
    assert close_to(await client.infer(), scratch_tree.expected("v1"))
    # The source's failure ends the load: it is not read again from the start after the peer
    # was left (the bad first tensor, once from the peer and once from the source).
    pulled = "ckpt_agent_pulled_bytes_total"
    assert await client.metric(pulled, {"origin": "peer"}) == entry.nbytes
    assert await client.metric(pulled, {"origin": "source"}) == _total(scratch_tree, "v1") + entry.nbytes


async def test_unreachable_peer_falls_back_to_the_source(
    tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = await static_token_agent(agent_factory, token_file, source=tree.file_uri, initial_version="v1")
    await client.wait_settled()
    body = {"uri": tree.file_uri, "peer": f"http://127.0.0.1:{port}"}
    assert (await client.update("v2", source=body))[0] == 202
    status = await client.wait_settled()
    last = status["last_load"]
    assert status["version"] == "v2"
    assert last["fallback_reason"].startswith("SourceUnreachable")
    assert (last["bytes_from_peer"], last["bytes_from_source"]) == (0, _total(tree, "v2"))
    assert close_to(await client.infer(), tree.expected("v2"))


async def test_peer_without_the_version_falls_back(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A peer may be called in the same moment (pipelined relay): the load waits for it to
    relay the version, bounded (shortened here), then takes the source."""
    monkeypatch.setattr(relay_peer, "PEER_START_WAIT_S", 1.0)
    peer = await _peer_with(tree, agent_factory, token_file, "v3")
    client = await static_token_agent(agent_factory, token_file, source=tree.file_uri, initial_version="v1")
    await client.wait_settled()
    assert (await client.update("v2", source={"uri": tree.file_uri, "peer": peer.url}))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "v2"
    last = status["last_load"]
    assert (
        last["fallback_reason"] == f"SourceUnreachable: peer {peer.url}/v1/relay did not relay v2 within 1s"
    )
    assert (last["bytes_from_peer"], last["bytes_from_source"]) == (0, _total(tree, "v2"))


async def test_a_peer_that_never_relays_is_left_at_once(
    tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    """A peer run with --no-relay (or an engine that keeps no copy) answers 410 Gone, not the 404
    of one that may be about to begin: the reader takes the source without waiting for it."""
    peer = await static_token_agent(agent_factory, token_file, source=tree.file_uri, relay=False)
    assert (await peer.update("v2"))[0] == 202
    assert (await peer.wait_settled())["version"] == "v2"
    async with peer.session.get(
        f"{peer.url}/v1/relay/v2/manifest.json", headers={"Authorization": f"Bearer {STATIC_TOKEN}"}
    ) as resp:
        assert resp.status == 410
        assert await resp.json() == {
            "error": "NotRelayable",
            "message": "this agent does not relay: it runs with --no-relay",
        }
    client = await static_token_agent(agent_factory, token_file, source=tree.file_uri, initial_version="v1")
    await client.wait_settled()
    assert (await client.update("v2", source={"uri": tree.file_uri, "peer": peer.url}))[0] == 202
    status = await client.wait_settled()
    last = status["last_load"]
    assert status["version"] == "v2"
    assert last["fallback_reason"] == (
        f"SourceUnreachable: peer {peer.url}/v1/relay: {peer.url}/v1/relay answered HTTP 410 for the manifest"
    )
    assert (last["bytes_from_peer"], last["bytes_from_source"]) == (0, _total(tree, "v2"))


async def test_relay_endpoints_need_the_token_and_serve_only_the_live_version(
    tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    peer = await _peer_with(tree, agent_factory, token_file, "v2")
    doc = tree.manifest("v2")
    shard = sorted(doc["files"])[0]
    published = (tree.root / "v2" / shard).read_bytes()
    entry = min((t for t in doc["tensors"] if t["file"] == shard), key=lambda t: t["offset"])
    start, end = entry["offset"], entry["offset"] + entry["nbytes"]

    headers = {"Authorization": f"Bearer {STATIC_TOKEN}", "Range": f"bytes={start}-{end - 1}"}
    async with peer.session.get(f"{peer.url}/v1/relay/v2/{shard}", headers=headers) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == f"bytes {start}-{end - 1}/{len(published)}"
        assert await resp.read() == published[start:end]
    async with peer.session.get(f"{peer.url}/v1/relay/v2/manifest.json", headers=headers) as resp:
        assert await resp.read() == (tree.root / "v2" / "manifest.json").read_bytes()
    async with peer.session.get(f"{peer.url}/v1/relay/v2/{shard}") as resp:
        assert resp.status == 401
    async with peer.session.get(f"{peer.url}/v1/relay/v1/{shard}", headers=headers) as resp:
        assert (resp.status, (await resp.json())["error"]) == (404, "NotRelayable")
    async with peer.session.get(f"{peer.url}/v1/mooncake/v2", headers=headers) as resp:
        assert resp.status == 410  # started without --relay-mooncake: never, not "not yet"

    # A new load withdraws the old copy; an unverified load is relayed too (readers verify).
    assert (await peer.update("v3", verify_checksum=False))[0] == 202
    status = await peer.wait_settled()
    assert status["version"] == "v3"
    assert status["relay"]["version"] == "v3"
    async with peer.session.get(f"{peer.url}/v1/relay/v2/{shard}", headers=headers) as resp:
        assert resp.status == 404
    async with peer.session.get(f"{peer.url}/v1/relay/v3/manifest.json", headers=headers) as resp:
        assert await resp.read() == (tree.root / "v3" / "manifest.json").read_bytes()


async def test_peer_field_is_validated(tree: Tree, agent_factory: AgentFactory, token_file: Path) -> None:
    client = await static_token_agent(agent_factory, token_file, source=tree.file_uri)
    for peer in ("ftp://h:1", "http://h", "http://h:1/path", 5):
        code, body = await client.update("v2", source={"uri": tree.file_uri, "peer": peer})
        assert (code, body["field"]) == (400, "source.peer"), peer
