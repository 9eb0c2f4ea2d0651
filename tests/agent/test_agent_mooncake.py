"""The mooncake:// transport against a real Mooncake transfer engine in TCP mode on 127.0.0.1
(P2P handshake, no metadata server): a source that registers its shards, agents that read
them with batched transfers through a registered bounce buffer into memory never registered."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from agent_testkit import AgentFactory, Tree, close_to, truncate_shard

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.server.httpserver import AppServer
from ckpt_agent.source.serve import create_source_app
from ckpt_agent.transport.mooncake import runtime
from ckpt_agent.transport.mooncake.client import MooncakeTransport
from ckpt_agent.transport.mooncake.export import directory_exports
from ckpt_api.manifest import manifest_digest

MooncakeSource = Callable[[Path], Awaitable[str]]


@pytest.fixture
async def mooncake_source() -> AsyncIterator[MooncakeSource]:
    """`ckpt-rollout serve --mooncake tcp`'s app in-process; returns its mooncake:// URI."""
    servers: list[AppServer] = []

    async def start(root: Path) -> str:
        exports = directory_exports(runtime.engine_for("tcp"), root, DEFAULT_MAX_MANIFEST_BYTES)
        server = AppServer(create_source_app(root, exports), "127.0.0.1", 0)
        await server.start()
        servers.append(server)
        return f"mooncake://127.0.0.1:{server.port}"

    yield start
    for server in servers:
        await server.stop()


@pytest.mark.parametrize("apply_mode", ["staged", "streamed"])
async def test_agent_loads_over_mooncake(
    tree: Tree, agent_factory: AgentFactory, mooncake_source: MooncakeSource, apply_mode: str
) -> None:
    uri = await mooncake_source(tree.root)
    client = await agent_factory(source=uri, initial_version="v1", apply_mode=apply_mode)
    assert (await client.wait_settled())["version"] == "v1"
    assert close_to(await client.infer(), tree.expected("v1"))

    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["checksum_verified"], status["source"]) == ("v2", True, uri)
    assert status["manifest_digest"] == tree.digests["v2"]
    assert close_to(await client.infer(), tree.expected("v2"))


async def test_descriptor_carries_the_exact_manifest(tree: Tree, mooncake_source: MooncakeSource) -> None:
    transport = MooncakeTransport(await mooncake_source(tree.root))

    def check() -> None:  # blocking, like the loader's worker threads
        raw = transport.fetch_manifest("v2", DEFAULT_MAX_MANIFEST_BYTES)
        assert manifest_digest(raw) == tree.digests["v2"]
        with pytest.raises(LoadError) as err:
            transport.fetch_manifest("v404", DEFAULT_MAX_MANIFEST_BYTES)
        assert err.value.reason == Reason.VERSION_NOT_FOUND

    try:
        await asyncio.to_thread(check)
    finally:
        transport.close()


@pytest.mark.parametrize("bounce_bytes", [32 << 20, 64])
async def test_reads_land_through_a_bounce_buffer_in_memory_never_registered(
    tree: Tree, mooncake_source: MooncakeSource, monkeypatch: pytest.MonkeyPatch, bounce_bytes: int
) -> None:
    """The caller's buffer gets the shard's bytes, including ranges that straddle tensors and,
    with a small bounce buffer, reads spanning many of its halves (filled in turn while the
    other is copied out and handed to the caller's hash); and it is never registered with the
    engine (anyone could write it)."""
    import numpy as np

    from ckpt_agent.transport.mooncake import client

    monkeypatch.setattr(client, "BOUNCE_BYTES", bounce_bytes)
    transport = MooncakeTransport(await mooncake_source(tree.root))
    doc = tree.manifest("v2")
    shard = sorted(doc["files"])[0]
    expected = (tree.root / "v2" / shard).read_bytes()
    engine = runtime.engine_for("tcp")

    def check() -> None:
        transport.fetch_manifest("v2", DEFAULT_MAX_MANIFEST_BYTES)
        dest = np.zeros(len(expected), dtype=np.uint8)
        stream = transport.open_range("v2", shard, 0, len(expected))
        try:
            half = len(expected) // 2 + 3  # not on a tensor boundary
            stream.readinto(dest.data[:half])
            assert not engine.covers(int(dest.ctypes.data), 1)
            parts: list[bytes] = []  # what a hash sees: each part once it is in the caller's buffer
            stream.readinto_landed(dest.data[half:], lambda part: parts.append(bytes(part)))
        finally:
            stream.close()
        assert dest.tobytes() == expected
        assert b"".join(parts) == expected[half:]
        assert max(len(p) for p in parts) <= max(bounce_bytes // 2, 1)

    try:
        await asyncio.to_thread(check)
    finally:
        transport.close()


async def test_truncated_shard_fails_the_load_and_keeps_the_old_weights(
    scratch_tree: Tree, agent_factory: AgentFactory, mooncake_source: MooncakeSource
) -> None:
    truncate_shard(scratch_tree.root / "v2")
    uri = await mooncake_source(scratch_tree.root)
    client = await agent_factory(source=uri, initial_version="v1")
    await client.wait_settled()
    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"]) == ("failed", "v1")
    assert status["last_error"]["reason"] == "TruncatedShard"
    assert close_to(await client.infer(), scratch_tree.expected("v1"))


async def test_unreachable_mooncake_source(agent_factory: AgentFactory) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = await agent_factory(source=f"mooncake://127.0.0.1:{port}")
    assert (await client.update("v2"))[0] == 202
    assert (await client.wait_settled())["last_error"]["reason"] == "SourceUnreachable"


@pytest.fixture
def serve_process(tree: Tree) -> Iterator[str]:
    """The real `serve --mooncake tcp` command in its own process."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "ckpt_agent", "serve", str(tree.root), "--port", "0", "--mooncake", "tcp"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        assert match, line
        yield f"mooncake://127.0.0.1:{match.group(1)}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def test_serve_command_serves_mooncake(
    tree: Tree, agent_factory: AgentFactory, serve_process: str
) -> None:
    client = await agent_factory(source=serve_process, initial_version="v1")
    assert (await client.wait_settled())["version"] == "v1"
    assert (await client.update("v3", verify_checksum=True))[0] == 202
    assert (await client.wait_settled())["version"] == "v3"
    assert close_to(await client.infer(), tree.expected("v3"))


async def test_without_the_engine_a_mooncake_source_is_refused_with_the_install_hint(
    agent_factory: AgentFactory, tree: Tree, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a machine without the package or libibverbs sees (the import guard's state)."""
    monkeypatch.setattr(runtime, "_engine_class", None)
    monkeypatch.setattr(runtime, "_import_error", "libibverbs.so.1: cannot open shared object file")
    client = await agent_factory(source=tree.file_uri)
    code, body = await client.update("v2", source={"uri": "mooncake://127.0.0.1:9"})
    assert (code, body["field"]) == (400, "source.uri")
    assert "libibverbs.so.1" in body["message"]
    assert "install-system-deps.sh" in body["message"]
    # A mooncake peer is a peer failure instead: the load falls back to the source.
    code, _ = await client.update("v2", source={"uri": tree.file_uri, "peer": "mooncake://127.0.0.1:9"})
    assert code == 202
    status = await client.wait_settled()
    assert status["version"] == "v2"
    assert "libibverbs.so.1" in status["last_load"]["fallback_reason"]
