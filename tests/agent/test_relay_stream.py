"""The http relay stream (`server.relay_routes`) against a real aiohttp server, serving a staged
copy (`RelayCopy` over a `StagingArea`) as views of its memory, not copies (issue #33): what it
sends is the shard byte for byte, across tensor and 1 MiB piece boundaries; a copy withdrawn
while a response is being written ends that response early, never with other bytes; and a copy
still loading (pipelined relay) streams a tensor's bytes as they land, not once it is whole."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.formats.synth import ReferenceModelSpec, write_reference_checkpoint
from ckpt_agent.pipeline.relay_copy import RelayCopy
from ckpt_agent.pipeline.staging import StagingArea
from ckpt_agent.server.relay_routes import add_relay_routes
from ckpt_api.manifest import MANIFEST_NAME, ManifestDocument
from ckpt_source.publish import publish

VERSION = "v1"
# Layers of 3 x 1 MiB + 1 KiB (float32 rows of 769): tensors straddle the relay's 1 MiB pieces.
BIG = ReferenceModelSpec(hidden=512, layers=4, outputs=8)
ODD = ReferenceModelSpec(hidden=769, layers=3, outputs=8)


@dataclass
class Served:
    url: str
    copy: RelayCopy
    manifest: ManifestDocument
    shard: str
    expected: bytes  # the shard as a relay serves it: tensor bytes, zeros between them


def _staged_copy(root: Path) -> tuple[RelayCopy, ManifestDocument]:
    raw = (root / VERSION / MANIFEST_NAME).read_bytes()
    manifest = parse_manifest(raw, expected_version=VERSION)
    staging = StagingArea(manifest)
    for entry in manifest.tensors:
        with (root / VERSION / entry.file).open("rb") as f:
            f.seek(entry.offset)
            f.readinto(staging.buffer(entry))
    return RelayCopy.from_store(raw, manifest, staging), manifest


def _as_relayed(shard: bytes, manifest: ManifestDocument, file: str) -> bytes:
    out = bytearray(len(shard))
    for entry in manifest.by_file[file]:
        out[entry.offset : entry.end] = shard[entry.offset : entry.end]
    return bytes(out)


async def _serve(tmp_path: Path, spec: ReferenceModelSpec, *, loading: bool = False) -> AsyncIterator[Served]:
    """``loading``: the copy of a load that has landed nothing yet (the test marks what lands)."""
    write_reference_checkpoint(tmp_path / "src", 7, spec)
    publish(tmp_path / "src", VERSION, tmp_path / "root")
    copy, manifest = _staged_copy(tmp_path / "root")
    if loading:
        assert copy.store is not None
        copy = RelayCopy.in_progress(copy.manifest_raw, manifest, copy.store, asyncio.get_running_loop())
    shard = next(iter(manifest.files))
    expected = _as_relayed((tmp_path / "root" / VERSION / shard).read_bytes(), manifest, shard)
    app = aiohttp.web.Application()
    add_relay_routes(app, lambda: copy, None)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    try:
        yield Served(
            f"http://127.0.0.1:{server.port}/v1/relay/{VERSION}/{shard}", copy, manifest, shard, expected
        )
    finally:
        await server.close()
        copy.release()


@pytest.fixture
async def odd(tmp_path: Path) -> AsyncIterator[Served]:
    async for served in _serve(tmp_path, ODD):
        yield served


@pytest.fixture
async def big(tmp_path: Path) -> AsyncIterator[Served]:
    async for served in _serve(tmp_path, BIG):
        yield served


@pytest.fixture
async def loading(tmp_path: Path) -> AsyncIterator[Served]:
    async for served in _serve(tmp_path, BIG, loading=True):
        yield served


async def test_the_whole_shard_comes_out_byte_for_byte(odd: Served) -> None:
    async with aiohttp.ClientSession() as session, session.get(odd.url) as resp:
        assert resp.status == 200
        body = await resp.read()
    assert len(odd.manifest.by_file[odd.shard]) > 3
    assert body == odd.expected


async def test_ranges_across_tensors_and_pieces_come_out_byte_for_byte(odd: Served) -> None:
    entries = odd.manifest.by_file[odd.shard]
    big_ones = [e for e in entries if e.nbytes > 1 << 20]
    first, last = big_ones[0], big_ones[-1]
    ranges = [
        (0, entries[0].offset + 5),  # header zeros into the first tensor
        (first.offset + 12345, last.offset + 777),  # mid-tensor to mid-tensor, many pieces
        (first.offset + (1 << 20) - 3, first.offset + (1 << 20) + 3),  # across a piece boundary
        (first.end - 1, first.end + 1),  # across a tensor boundary
        (last.offset, len(odd.expected)),  # to the end
    ]
    async with aiohttp.ClientSession() as session:
        for start, end in ranges:
            async with session.get(odd.url, headers={"Range": f"bytes={start}-{end - 1}"}) as resp:
                assert resp.status == 206
                assert resp.headers["Content-Range"] == f"bytes {start}-{end - 1}/{len(odd.expected)}"
                assert await resp.read() == odd.expected[start:end], (start, end)


async def _read_rest(resp: aiohttp.ClientResponse, into: bytearray) -> None:
    # Bounded: a response cut short without closing its connection would leave this read
    # waiting for the rest.
    async with asyncio.timeout(30):
        while chunk := await resp.content.read(1 << 20):
            into += chunk


async def test_a_copy_withdrawn_mid_response_ends_it_without_other_bytes(big: Served) -> None:
    got = bytearray()
    async with aiohttp.ClientSession(read_bufsize=1 << 16) as session, session.get(big.url) as resp:
        assert resp.status == 200
        # Read a little and stop: the server blocks writing once the socket buffers fill,
        # with most of the body still to send.
        got += await resp.content.readexactly(1 << 20)
        big.copy.release()
        with pytest.raises(aiohttp.ClientPayloadError):
            await _read_rest(resp, got)
    assert 1 << 20 <= len(got) < len(big.expected)
    assert got == big.expected[: len(got)]


async def _nothing_more(resp: aiohttp.ClientResponse) -> bool:
    try:
        await asyncio.wait_for(resp.content.readexactly(1), 0.3)
    except TimeoutError:
        return True
    return False


async def test_a_loading_copy_streams_a_tensor_as_its_bytes_land(loading: Served) -> None:
    entries = loading.manifest.by_file[loading.shard]
    first = max(entries, key=lambda e: e.nbytes)
    assert first.nbytes >= 1 << 20
    head = first.offset  # header, then the tensors before it, each landed whole and verified
    for entry in entries:
        if entry.offset < first.offset:
            loading.copy.mark_ready(entry)
    got = bytearray()
    async with aiohttp.ClientSession() as session, session.get(loading.url) as resp:
        assert resp.status == 200
        got += await asyncio.wait_for(resp.content.readexactly(head), 10)
        assert await _nothing_more(resp)  # nothing of `first` landed yet

        loading.copy.mark_landed(first, 300_000)  # not verified: served on all the same
        got += await asyncio.wait_for(resp.content.readexactly(300_000), 10)
        assert await _nothing_more(resp)

        # The load read the tensor again from its start (its peer failed): the stream waits until
        # the bytes it has not sent yet are in again.
        loading.copy.mark_landed(first, 100_000)
        assert await _nothing_more(resp)
        loading.copy.mark_landed(first, first.nbytes - 1)
        got += await asyncio.wait_for(resp.content.readexactly(first.nbytes - 1 - 300_000), 10)
        assert await _nothing_more(resp)

        for entry in entries:
            loading.copy.mark_ready(entry)
        loading.copy.finish()
        await _read_rest(resp, got)
    assert got == loading.expected
