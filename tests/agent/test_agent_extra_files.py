"""A version's non-weight files (config, tokenizer, index...) travel with it: the agent fetches
each one whole over the load's transport (file, http, mooncake: its HTTP side), verifies its
xxh3-128 whatever the request asked, keeps it with the relay copy and serves it to peers; a
damaged or missing one fails the load before any weight changes."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from agent_testkit import SPEC, AgentClient, AgentFactory, Tree, close_to, set_extra_files

from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.server.httpserver import AppServer
from ckpt_agent.source.serve import create_source_app
from ckpt_agent.transport.mooncake import runtime
from ckpt_agent.transport.mooncake.export import directory_exports

# The tokenizer is larger than the relay's 1 MiB pieces and than a read chunk: it is served and
# read in several parts.
EXTRAS = {
    "config.json": b'{"model_type": "reference-mlp", "hidden_size": 32}\n',
    "generation_config.json": b'{"do_sample": false}\n',
    "tokenizer.json": np.random.default_rng(7).bytes(3 << 20 | 123),
}

Source = Callable[[Tree], Awaitable[str]]


@pytest.fixture
def extra_tree(tmp_path: Path) -> Tree:
    """v1 and v2 of the reference model, each with EXTRAS (v2 in two shards)."""
    t = Tree(tmp_path / "root", tmp_path / "work")
    for version, seed, shards in (("v1", 1, 1), ("v2", 2, 2)):
        t.add(version, seed=seed, spec=SPEC, shards=shards)
        t.digests[version] = set_extra_files(t.root / version, dict(EXTRAS))
    return t


@pytest.fixture
async def source_of(
    source_server: Callable[[Path], Awaitable[str]],
) -> AsyncIterator[Callable[[str], Source]]:
    """The source URI of a tree for a transport name: file, http, or mooncake (tcp)."""
    servers: list[AppServer] = []

    def for_transport(transport: str) -> Source:
        async def start(tree: Tree) -> str:
            if transport == "file":
                return tree.file_uri
            if transport == "http":
                return await source_server(tree.root)
            exports = directory_exports(runtime.engine_for("tcp"), tree.root, DEFAULT_MAX_MANIFEST_BYTES)
            server = AppServer(create_source_app(tree.root, exports), "127.0.0.1", 0)
            await server.start()
            servers.append(server)
            return f"mooncake://127.0.0.1:{server.port}"

        return start

    yield for_transport
    for server in servers:
        await server.stop()


async def _loaded(agent_factory: AgentFactory, source: str, version: str, **overrides: Any) -> AgentClient:
    client = await agent_factory(source=source, initial_version=version, initial_verify=False, **overrides)
    status = await client.wait_settled()
    assert status["version"] == version, status["last_error"]
    return client


def published_extras(tree: Tree, version: str) -> dict[str, bytes]:
    """The version's extra files at the source: EXTRAS, plus the index publish writes for
    several shards."""
    return {name: (tree.root / version / name).read_bytes() for name in tree.manifest(version)["extra_files"]}


def _relayed_extras(client: AgentClient) -> dict[str, bytes]:
    relay = client.agent.service.relay
    assert relay is not None
    return dict(relay.extra_files)


@pytest.mark.parametrize("apply_mode", ["staged", "streamed"])
@pytest.mark.parametrize("transport", ["file", "http", "mooncake"])
async def test_extra_files_are_fetched_verified_and_kept_with_the_version(
    extra_tree: Tree,
    agent_factory: AgentFactory,
    source_of: Callable[[str], Source],
    transport: str,
    apply_mode: str,
) -> None:
    source = await source_of(transport)(extra_tree)
    client = await _loaded(agent_factory, source, "v1", apply_mode=apply_mode)
    assert (await client.update("v2", verify_checksum=False))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["manifest_digest"]) == ("v2", extra_tree.digests["v2"])
    assert _relayed_extras(client) == published_extras(extra_tree, "v2")
    assert close_to(await client.infer(), extra_tree.expected("v2"))


@pytest.mark.parametrize("transport", ["file", "http", "mooncake"])
async def test_a_corrupted_extra_file_fails_the_load_and_the_old_weights_keep_serving(
    extra_tree: Tree, agent_factory: AgentFactory, source_of: Callable[[str], Source], transport: str
) -> None:
    source = await source_of(transport)(extra_tree)
    client = await _loaded(agent_factory, source, "v1")
    path = extra_tree.root / "v2" / "tokenizer.json"
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    path.write_bytes(bytes(damaged))

    # verify_checksum false: extra files are verified anyway.
    assert (await client.update("v2", verify_checksum=False))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "v1"
    assert status["last_error"]["reason"] == "ChecksumMismatch"
    assert "tokenizer.json" in status["last_error"]["message"]
    assert close_to(await client.infer(), extra_tree.expected("v1"))
    # Refused before the weights changed: v1 is still relayed, whole, to the next wave's peers
    # (#32 item 13; tests/agent/test_agent_relay_after_failed_load.py).
    relay = client.agent.service.relay
    assert relay is not None, "a load that failed before the weights changed keeps the old relay"
    assert relay.version == "v1"
    assert _relayed_extras(client) == published_extras(extra_tree, "v1")


@pytest.mark.parametrize("transport", ["file", "http", "mooncake"])
async def test_a_missing_extra_file_fails_the_load_naming_it(
    extra_tree: Tree, agent_factory: AgentFactory, source_of: Callable[[str], Source], transport: str
) -> None:
    source = await source_of(transport)(extra_tree)
    client = await _loaded(agent_factory, source, "v1")
    (extra_tree.root / "v2" / "generation_config.json").unlink()
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["last_error"]["reason"]) == ("v1", "TruncatedShard")
    assert "generation_config.json" in status["last_error"]["message"]
    assert close_to(await client.infer(), extra_tree.expected("v1"))


async def test_a_peer_serves_extra_files_under_its_relay_path(
    extra_tree: Tree, agent_factory: AgentFactory, session: Any
) -> None:
    peer = await _loaded(agent_factory, extra_tree.file_uri, "v2")
    async with session.get(f"{peer.url}/v1/relay/v2/tokenizer.json") as resp:
        assert (resp.status, await resp.read()) == (200, EXTRAS["tokenizer.json"])
    async with session.get(f"{peer.url}/v1/relay/v2/config.json", headers={"Range": "bytes=2-11"}) as resp:
        assert (resp.status, await resp.read()) == (206, EXTRAS["config.json"][2:12])
    async with session.get(f"{peer.url}/v1/relay/v2/special_tokens_map.json") as resp:
        assert resp.status == 404


@pytest.mark.parametrize(
    ("peer_mode", "peer_transport"), [("staged", "http"), ("streamed", "http"), ("staged", "mooncake")]
)
async def test_extra_files_are_relayed_by_a_peer(
    extra_tree: Tree, agent_factory: AgentFactory, peer_mode: str, peer_transport: str
) -> None:
    """The peer loaded v2 from the source; the asking agent takes every byte of v2, extra files
    included, from the peer (a mooncake peer serves the extra files over its HTTP relay path)."""
    peer = await _loaded(agent_factory, extra_tree.file_uri, "v2", apply_mode=peer_mode, relay_mooncake="tcp")
    peer_uri = peer.url if peer_transport == "http" else "mooncake://127.0.0.1:" + peer.url.rsplit(":", 1)[1]
    client = await _loaded(agent_factory, extra_tree.file_uri, "v1")
    expected = published_extras(extra_tree, "v2")
    # The source loses v2's files: only the peer can supply them now.
    for name in expected:
        (extra_tree.root / "v2" / name).unlink()

    assert (await client.update("v2", source={"uri": extra_tree.file_uri, "peer": peer_uri}))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "v2", status["last_error"]
    assert (status["last_load"]["peer"], status["last_load"]["fallback_reason"]) == (peer_uri, None)
    assert _relayed_extras(client) == expected


async def test_a_peer_with_a_damaged_extra_file_makes_the_agent_load_from_the_source(
    extra_tree: Tree, agent_factory: AgentFactory
) -> None:
    peer = await _loaded(agent_factory, extra_tree.file_uri, "v2")
    relay = peer.agent.service.relay
    damaged = dict(relay.extra_files)
    damaged["config.json"] = damaged["config.json"].replace(b"32", b"64")
    relay.extra_files = damaged
    client = await _loaded(agent_factory, extra_tree.file_uri, "v1")

    assert (await client.update("v2", source={"uri": extra_tree.file_uri, "peer": peer.url}))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "v2"
    reason = status["last_load"]["fallback_reason"]
    assert reason.startswith("ChecksumMismatch")
    assert "config.json" in reason
    assert _relayed_extras(client) == published_extras(extra_tree, "v2")
