"""file and http transports against a real published tree and a real `serve` app."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from agent_testkit import Tree, truncate_shard

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.pipeline.reader import LoadProgress, fetch_manifest, plan_runs, read_runs
from ckpt_agent.transport import Transport, check_uri, open_transport
from ckpt_api.manifest import TensorRecord

Source = Callable[[Path], Awaitable[str]]


@pytest.fixture(params=["file", "http"])
async def uri_of(request: pytest.FixtureRequest, source_server: Source) -> Callable[[Path], Awaitable[str]]:
    async def make(root: Path) -> str:
        return f"file://{root}" if request.param == "file" else await source_server(root)

    return make


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _call(transport: Transport, fn: str, *args: object) -> object:
    return await asyncio.to_thread(getattr(transport, fn), *args)


async def test_manifest_and_ranges_match_the_files(
    tree: Tree, uri_of: Callable[[Path], Awaitable[str]]
) -> None:
    transport = open_transport(await uri_of(tree.root))
    raw = await _call(transport, "fetch_manifest", "v2", 1 << 20)
    assert raw == (tree.root / "v2" / "manifest.json").read_bytes()
    manifest = parse_manifest(raw, expected_version="v2")  # type: ignore[arg-type]
    for entry in manifest.tensors:
        buf = np.zeros(entry.nbytes, np.uint8)

        def read(entry: TensorRecord = entry, buf: np.ndarray = buf) -> None:
            # Blocking transport calls run in threads: the in-process server needs the loop.
            stream = transport.open_range("v2", entry.file, entry.offset, entry.end)
            try:
                stream.readinto(buf.data)
            finally:
                stream.close()

        await asyncio.to_thread(read)
        assert buf.tobytes() == (tree.root / "v2" / entry.file).read_bytes()[entry.offset : entry.end]


async def test_parallel_verified_reads_fill_every_tensor(
    tree: Tree, uri_of: Callable[[Path], Awaitable[str]]
) -> None:
    transport = open_transport(await uri_of(tree.root))
    manifest, _ = await asyncio.to_thread(
        fetch_manifest, transport, "v2", expected_digest=tree.digests["v2"], max_bytes=1 << 20
    )
    buffers = {t.name: np.zeros(t.nbytes, np.uint8) for t in manifest.tensors}
    progress = LoadProgress()
    await asyncio.to_thread(
        read_runs,
        transport,
        "v2",
        plan_runs(manifest, max_run_bytes=4096),
        buffer_for=lambda e: buffers[e.name].data,
        on_tensor=lambda e, b: None,
        verify=True,
        progress=progress,
        cancelled=lambda: False,
        chunk_bytes=1000,
        parallelism=3,
    )
    assert progress.bytes_done == manifest.tensor_bytes
    for entry in manifest.tensors:
        assert (
            buffers[entry.name].tobytes()
            == (tree.root / "v2" / entry.file).read_bytes()[entry.offset : entry.end]
        )


async def test_unknown_version(tree: Tree, uri_of: Callable[[Path], Awaitable[str]]) -> None:
    transport = open_transport(await uri_of(tree.root))
    with pytest.raises(LoadError) as info:
        await _call(transport, "fetch_manifest", "nope", 1 << 20)
    assert info.value.reason == Reason.VERSION_NOT_FOUND


async def test_manifest_over_the_cap(tree: Tree, uri_of: Callable[[Path], Awaitable[str]]) -> None:
    transport = open_transport(await uri_of(tree.root))
    with pytest.raises(LoadError) as info:
        await _call(transport, "fetch_manifest", "v1", 100)
    assert info.value.reason == Reason.MANIFEST_TOO_LARGE


async def test_truncated_shard(scratch_tree: Tree, uri_of: Callable[[Path], Awaitable[str]]) -> None:
    shard = truncate_shard(scratch_tree.root / "v2")
    transport = open_transport(await uri_of(scratch_tree.root))
    manifest = parse_manifest((scratch_tree.root / "v2" / "manifest.json").read_bytes())
    last = manifest.by_file[shard][-1]

    def read() -> None:
        stream = transport.open_range("v2", shard, last.offset, last.end)
        try:
            stream.readinto(np.zeros(last.nbytes, np.uint8).data)
        finally:
            stream.close()

    with pytest.raises(LoadError) as info:
        await asyncio.to_thread(read)
    assert info.value.reason == Reason.TRUNCATED_SHARD


@pytest.mark.parametrize("uri", ["http://127.0.0.1:{port}", "file:///nonexistent-ckpt-root"])
async def test_unreachable_source(uri: str) -> None:
    transport = open_transport(uri.format(port=_closed_port()))
    with pytest.raises(LoadError) as info:
        await _call(transport, "fetch_manifest", "v1", 1 << 20)
    assert info.value.reason == Reason.SOURCE_UNREACHABLE


@pytest.mark.parametrize(
    ("uri", "ok"),
    [
        ("http://h:1/p", True),
        ("https://h", True),
        ("file:///x", True),
        ("file://remote/x", False),
        ("mooncake://h:1", True),
        ("mooncake://h", False),
        ("ftp://h", False),
        ("nonsense", False),
    ],
)
def test_check_uri(uri: str, ok: bool) -> None:
    if ok:
        check_uri(uri)
    else:
        with pytest.raises(ValueError, match=r"transport|not a local|not a mooncake"):
            check_uri(uri)


# -- the serve app -----------------------------------------------------------------------------


async def test_serve_supports_ranges_head_and_listing(tree: Tree, source_server: Source) -> None:
    url = await source_server(tree.root)
    shard = sorted(tree.manifest("v1")["files"])[0]
    data = (tree.root / "v1" / shard).read_bytes()
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{url}/v1/{shard}", headers={"Range": "bytes=10-29"}) as resp:
            assert resp.status == 206
            assert await resp.read() == data[10:30]
        async with s.head(f"{url}/v1/{shard}") as resp:
            assert resp.status == 200
            assert int(resp.headers["Content-Length"]) == len(data)
        async with s.get(f"{url}/") as resp:
            assert (await resp.json())["versions"] == ["v1", "v2", "v3"]


@pytest.mark.parametrize(
    ("path", "status"),
    [
        ("/v1/..%2Fv2%2Fmanifest.json", 400),
        ("/..%2F..%2Fetc/passwd", 400),
        ("/v1/.hidden", 400),
        ("/v1/missing.safetensors", 404),
        ("/nope/manifest.json", 404),
    ],
)
async def test_serve_refuses_paths_outside_versions(
    tree: Tree, source_server: Source, path: str, status: int
) -> None:
    url = await source_server(tree.root)
    async with aiohttp.ClientSession() as s, s.get(url + path) as resp:
        assert resp.status == status
