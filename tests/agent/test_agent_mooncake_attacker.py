"""Issue #32: the Mooncake engine serves every registered region to anyone who reaches its port,
reads and writes alike, with no credential. An attacker here is a raw transfer engine of its
own (what any pod on the network can run) writing into the agents' registered memory; what it
writes must never be served as verified nor applied. And a descriptor cannot send an agent's
engine to another host, and bytes read over Mooncake are checked against the manifest's sha256
whatever the request's verify_checksum says: the source's own registered memory is as writable."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from agent_testkit import (
    RELAY_TOKEN,
    STATIC_TOKEN,
    AgentClient,
    AgentFactory,
    Tree,
    close_to,
    static_token_agent,
    wait_until,
)
from aiohttp import web
from held_source import HeldSource

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.pipeline.pause_gate import LOAD
from ckpt_agent.server.httpserver import AppServer
from ckpt_agent.source.serve import create_source_app
from ckpt_agent.transport.mooncake import runtime
from ckpt_agent.transport.mooncake.client import MooncakeTransport
from ckpt_agent.transport.mooncake.descriptor import Descriptor, parse_descriptor
from ckpt_agent.transport.mooncake.export import directory_exports
from ckpt_api.manifest import MANIFEST_NAME, TensorRecord

GARBAGE = 0x41


class RawMooncake:
    """An unauthorised client: its own engine, no token, only the peer's session address."""

    def __init__(self) -> None:
        from mooncake.engine import TransferEngine

        self._engine = TransferEngine()
        assert self._engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
        self._buffers: list[np.ndarray] = []

    def write(self, session: str, addr: int, nbytes: int) -> int:
        """Write `nbytes` of GARBAGE at `addr` in `session`'s memory; the engine's status."""
        data = np.full(nbytes, GARBAGE, dtype=np.uint8)
        self._buffers.append(data)  # registered until the engine goes
        assert self._engine.register_memory(int(data.ctypes.data), nbytes) == 0
        return int(self._engine.transfer_sync_write(session, int(data.ctypes.data), addr, nbytes))


@pytest.fixture
async def held(tree: Tree, agent_factory: AgentFactory) -> AsyncIterator[HeldSource]:
    source = HeldSource(tree.root)
    await source.start()
    yield source
    await source.stop()


def _mooncake_uri(agent: AgentClient) -> str:
    return "mooncake://127.0.0.1:" + agent.url.rsplit(":", 1)[1]


async def _descriptor(agent: AgentClient, version: str) -> Descriptor:
    headers = {"Authorization": f"Bearer {RELAY_TOKEN}"}
    async with agent.session.get(f"{agent.url}/v1/mooncake/{version}", headers=headers) as resp:
        assert resp.status == 200
        return parse_descriptor(await resp.read())


async def _relayed(agent: AgentClient, version: str, entry: TensorRecord) -> bytes:
    headers = {"Authorization": f"Bearer {STATIC_TOKEN}", "Range": f"bytes={entry.offset}-{entry.end - 1}"}
    async with agent.session.get(f"{agent.url}/v1/relay/{version}/{entry.file}", headers=headers) as resp:
        assert resp.status == 206
        return await resp.read()


def _published(tree: Tree, version: str, entry: TensorRecord) -> bytes:
    return (tree.root / version / entry.file).read_bytes()[entry.offset : entry.end]


async def test_a_write_into_the_mooncake_relay_is_never_served_as_verified(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, held: HeldSource
) -> None:
    """The write lands (Mooncake has no credential), but only in what Mooncake readers read: the
    HTTP relay serves the verified bytes, the agent's weights are untouched, and a Mooncake
    reader catches the written tensor with the manifest's sha256 and takes it from the source."""
    peer = await static_token_agent(agent_factory, token_file, source=tree.file_uri, relay_mooncake="tcp")
    assert (await peer.update("v2", verify_checksum=True))[0] == 202
    assert (await peer.wait_settled())["version"] == "v2"
    descriptor = await _descriptor(peer, "v2")
    entry = held.entries("v2")[0]
    extent = next(e for e in descriptor.files[entry.file].extents if e.file_offset == entry.offset)

    attacker = RawMooncake()
    assert await asyncio.to_thread(attacker.write, descriptor.session, extent.addr, 8) == 0

    assert await _relayed(peer, "v2", entry) == _published(tree, "v2", entry)
    assert close_to(await peer.infer(), tree.expected("v2"))
    reader = await static_token_agent(agent_factory, token_file, source=tree.file_uri)
    assert (await reader.update("v2", source={"uri": tree.file_uri, "peer": _mooncake_uri(peer)}))[0] == 202
    status = await reader.wait_settled()
    assert status["version"] == "v2"
    assert status["last_load"]["fallback_reason"].startswith("ChecksumMismatch")
    assert entry.name in status["last_load"]["fallback_reason"]
    assert close_to(await reader.infer(), tree.expected("v2"))


async def test_writes_into_all_registered_memory_mid_load_reach_no_weights(
    tree: Tree, agent_factory: AgentFactory, token_file: Path, held: HeldSource, source_server: Any
) -> None:
    """A reader loads from a Mooncake peer that is itself still loading (pipelined relay). Once
    the reader verified the first tensor, and before either applies anything, the attacker fills
    every region the process's engine has registered (the handshake lists them all) with
    garbage. Neither agent may apply it, nor the peer relay it as verified."""
    plain = await source_server(tree.root)
    peer = await static_token_agent(agent_factory, token_file, source=held.url, relay_mooncake="tcp")
    reader = await static_token_agent(agent_factory, token_file, source=plain)
    assert (await peer.update("v2", source={"uri": held.url, "relayWhileLoading": True}))[0] == 202
    body = {"uri": plain, "peer": _mooncake_uri(peer), "relayWhileLoading": True}
    assert (await reader.update("v2", source=body))[0] == 202
    first = held.entries("v2")[0]
    await held.allow("v2", first)

    async def verified_first() -> bool:
        copy = reader.agent.service.relay
        return copy is not None and copy.version == "v2" and copy.is_ready(first)

    await wait_until(verified_first, 10, "the reader to verify the first tensor from its peer")

    engine = runtime.engine_for("tcp")
    regions = sorted(engine._regions.items())
    assert regions, "the peer's relay and the reader's reads register memory"
    attacker = RawMooncake()
    for addr, (nbytes, _uses) in regions:
        assert await asyncio.to_thread(attacker.write, engine.session, addr, nbytes) == 0

    await held.release()
    for agent in (peer, reader):
        status = await agent.wait_settled()
        assert (status["state"], status["version"]) == ("idle", "v2")
        assert close_to(await agent.infer(), tree.expected("v2"))
    for entry in held.entries("v2"):
        assert await _relayed(peer, "v2", entry) == _published(tree, "v2", entry), entry.name
        assert await _relayed(reader, "v2", entry) == _published(tree, "v2", entry), entry.name


async def _descriptor_server(tree: Tree, session: str) -> AppServer:
    """A Mooncake control endpoint whose descriptor names `session` for the data connection."""
    manifest = (tree.root / "v2" / "manifest.json").read_text()

    async def describe(_request: web.Request) -> web.Response:
        return web.json_response({"manifest": manifest, "protocol": "tcp", "session": session, "files": {}})

    app = web.Application()
    app.router.add_get("/v1/mooncake/v2", describe)
    server = AppServer(app, "127.0.0.1", 0)
    await server.start()
    return server


@pytest.mark.parametrize("session", ["127.0.0.2:15000", "localhost:15000", "10.1.2.3:15000"])
async def test_a_descriptor_naming_another_host_is_refused(tree: Tree, session: str) -> None:
    server = await _descriptor_server(tree, session)
    transport = MooncakeTransport(f"mooncake://127.0.0.1:{server.port}")
    try:
        with pytest.raises(LoadError) as err:
            await asyncio.to_thread(transport.fetch_manifest, "v2", DEFAULT_MAX_MANIFEST_BYTES)
    finally:
        transport.close()
        await server.stop()
    assert err.value.reason == Reason.SOURCE_UNREACHABLE
    assert session in err.value.message
    assert "only at its own host 127.0.0.1" in err.value.message


async def test_a_peer_whose_descriptor_names_another_host_is_left_for_the_source(
    tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    server = await _descriptor_server(tree, "127.0.0.2:15000")
    try:
        reader = await static_token_agent(agent_factory, token_file, source=tree.file_uri)
        peer = f"mooncake://127.0.0.1:{server.port}"
        assert (await reader.update("v2", source={"uri": tree.file_uri, "peer": peer}))[0] == 202
        status = await reader.wait_settled()
    finally:
        await server.stop()
    last = status["last_load"]
    assert (status["version"], last["bytes_from_peer"]) == ("v2", 0)
    assert "only at its own host" in last["fallback_reason"]
    assert close_to(await reader.infer(), tree.expected("v2"))


@pytest.fixture
async def mooncake_source(tree: Tree) -> AsyncIterator[tuple[str, str]]:
    """`ckpt-rollout serve --mooncake tcp` over `tree`, in-process: (mooncake:// URI, its http URL)."""
    exports = directory_exports(runtime.engine_for("tcp"), tree.root, DEFAULT_MAX_MANIFEST_BYTES)
    server = AppServer(create_source_app(tree.root, exports), "127.0.0.1", 0)
    await server.start()
    yield f"mooncake://127.0.0.1:{server.port}", f"http://127.0.0.1:{server.port}"
    await server.stop()


async def _source_descriptor(url: str, version: str) -> Descriptor:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/v1/mooncake/{version}") as resp:
        assert resp.status == 200
        return parse_descriptor(await resp.read())


def _address_of(descriptor: Descriptor, entry: TensorRecord) -> int:
    extent = next(
        e for e in descriptor.files[entry.file].extents if e.file_offset <= entry.offset < e.file_end
    )
    return extent.addr + entry.offset - extent.file_offset


@pytest.mark.parametrize("apply_mode", ["staged", "streamed"])
async def test_a_write_into_a_mooncake_sources_memory_fails_even_an_unverified_load(
    tree: Tree,
    agent_factory: AgentFactory,
    held: HeldSource,
    mooncake_source: tuple[str, str],
    apply_mode: str,
) -> None:
    """The source registers its shard mappings, so an attacker can write them (in the source's
    private copy-on-write pages; the files are untouched). A load over mooncake:// that did not
    ask for verification still checks blake3 and refuses the written tensor: v1 keeps serving."""
    uri, url = mooncake_source
    client = await agent_factory(source=uri, initial_version="v1", apply_mode=apply_mode)
    assert (await client.wait_settled())["version"] == "v1"
    entry = held.entries("v2")[-1]
    descriptor = await _source_descriptor(url, "v2")
    attacker = RawMooncake()
    assert await asyncio.to_thread(attacker.write, descriptor.session, _address_of(descriptor, entry), 8) == 0

    assert (await client.update("v2", verify_checksum=False))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"]) == ("failed", "v1")
    error = status["last_error"]
    assert error["reason"] == "ChecksumMismatch"
    assert entry.name in error["message"]
    assert "blake3" in error["message"]
    assert await client.is_paused() is False
    assert close_to(await client.infer(), tree.expected("v1"))


async def test_an_unverified_mooncake_load_is_verified_and_says_so(
    tree: Tree, agent_factory: AgentFactory, mooncake_source: tuple[str, str]
) -> None:
    uri, _url = mooncake_source
    client = await agent_factory(source=uri)
    assert (await client.update("v2", verify_checksum=False))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], status["checksum_verified"]) == ("idle", "v2", True)
    assert close_to(await client.infer(), tree.expected("v2"))


async def test_a_manifest_without_a_strong_digest_is_refused_over_mooncake_before_the_pause(
    scratch_tree: Tree, agent_factory: AgentFactory
) -> None:
    """Published before blake3 and sha256 existed: nothing to check Mooncake bytes against, so
    the load is refused from the manifest alone (InvalidManifest), the engine never paused."""
    path = scratch_tree.root / "v2" / MANIFEST_NAME
    doc = json.loads(path.read_bytes())
    doc["format_version"] = 2
    for item in [*doc["tensors"], *doc.get("extra_files", {}).values()]:
        del item["blake3"]
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    exports = directory_exports(runtime.engine_for("tcp"), scratch_tree.root, DEFAULT_MAX_MANIFEST_BYTES)
    server = AppServer(create_source_app(scratch_tree.root, exports), "127.0.0.1", 0)
    await server.start()
    try:
        client = await agent_factory(source=f"mooncake://127.0.0.1:{server.port}", initial_version="v1")
        assert (await client.wait_settled())["version"] == "v1"
        assert (await client.update("v2", verify_checksum=False))[0] == 202
        status = await client.wait_settled()
    finally:
        await server.stop()
    assert (status["state"], status["version"]) == ("failed", "v1")
    assert status["last_error"]["reason"] == "InvalidManifest"
    assert "lists no blake3 or sha256" in status["last_error"]["message"]
    assert LOAD not in client.agent.service.gate.held_seconds
    assert close_to(await client.infer(), scratch_tree.expected("v1"))
