"""The reader's verified path, over real file sources (read-ahead: for tensors of 2 MiB and
more a helper thread reads the next pieces while the caller hashes) and http sources (inline):
the bytes land whole, a bad byte or a short shard fails the tensor, a cancel stops the read,
and the helper never writes a buffer once the read of it has returned."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
from agent_testkit import Tree, corrupt_tensor, truncate_shard

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.pipeline.reader import (
    MAX_EXTRA_FILE_BYTES,
    LoadProgress,
    plan_runs,
    read_extra_files,
    read_runs,
)
from ckpt_agent.transport import open_transport
from ckpt_api.manifest import ExtraFileRecord, ManifestDocument, TensorRecord
from ckpt_source.safetensors_format import write_file

Source = Callable[[Path], Awaitable[str]]
# Sizes around the read-ahead's bounds: under 2 MiB inline, one chunk split in two, several chunks.
SIZES = {"small": 300_000, "one-chunk": 3 << 20, "chunks": (9 << 20) + 40, "tail": 2 << 20}


@pytest.fixture
def big(tmp_path: Path) -> Tree:
    tree = Tree(tmp_path / "root", tmp_path / "work")
    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(5)
    with (src / "model.safetensors").open("wb") as f:
        write_file(f, [(name, "U8", (n,), memoryview(rng.bytes(n))) for name, n in SIZES.items()])
    tree.add_from_dir("big", src)
    return tree


@pytest.fixture(params=["file", "http"])
async def uri_of(request: pytest.FixtureRequest, source_server: Source) -> Source:
    async def make(root: Path) -> str:
        return f"file://{root}" if request.param == "file" else await source_server(root)

    return make


def _manifest(tree: Tree) -> ManifestDocument:
    return parse_manifest((tree.root / "big" / "manifest.json").read_bytes())


def _expected(tree: Tree, entry: TensorRecord) -> bytes:
    return (tree.root / "big" / entry.file).read_bytes()[entry.offset : entry.end]


def _read(
    uri: str,
    manifest: ManifestDocument,
    *,
    chunk: int,
    cancelled: Callable[[], bool] = lambda: False,
    on_landed: Callable[[TensorRecord, int, memoryview], None] | None = None,
) -> tuple[dict[str, bytes], LoadProgress]:
    """``on_landed``: called with each piece's count as the reader hands it on, and the tensor's
    buffer as it is then."""
    transport = open_transport(uri)
    buffers = {e.name: np.zeros(e.nbytes, np.uint8) for e in manifest.tensors}
    landed: dict[str, bytes] = {}
    progress = LoadProgress()
    try:
        read_runs(
            transport,
            manifest.version,
            plan_runs(manifest),
            buffer_for=lambda e: buffers[e.name].data,
            on_tensor=lambda e, b: landed.__setitem__(e.name, bytes(b)),
            verify=True,
            progress=progress,
            cancelled=cancelled,
            chunk_bytes=chunk,
            on_landed=None if on_landed is None else lambda e, n: on_landed(e, n, buffers[e.name].data),
        )
    finally:
        transport.close()
    return landed, progress


@pytest.mark.parametrize("chunk", [1 << 20, 4 << 20, 16 << 20])
async def test_verified_reads_land_every_byte(big: Tree, uri_of: Source, chunk: int) -> None:
    manifest = _manifest(big)
    landed, progress = await asyncio.to_thread(_read, await uri_of(big.root), manifest, chunk=chunk)
    assert landed == {e.name: _expected(big, e) for e in manifest.tensors}
    assert progress.bytes_done == manifest.tensor_bytes


async def test_a_relaying_read_hands_on_each_piece_before_the_tensor_is_whole(
    big: Tree, uri_of: Source
) -> None:
    """Pipelined relay: the count of a tensor's bytes in its buffer, piece by piece (at most
    256 KiB each, so a chain's hop waits for a piece, not a tensor), each time with exactly those
    bytes there."""
    manifest = _manifest(big)
    expected = {e.name: _expected(big, e) for e in manifest.tensors}
    counts: dict[str, list[int]] = {e.name: [] for e in manifest.tensors}

    def on_landed(entry: TensorRecord, n: int, buf: memoryview) -> None:
        assert bytes(buf[:n]) == expected[entry.name][:n]
        counts[entry.name].append(n)

    landed, _ = await asyncio.to_thread(
        _read, await uri_of(big.root), manifest, chunk=4 << 20, on_landed=on_landed
    )
    assert landed == expected
    for entry in manifest.tensors:
        steps = np.diff([0, *counts[entry.name]])
        assert counts[entry.name][-1] == entry.nbytes, entry.name
        assert (steps > 0).all(), (entry.name, counts[entry.name])
        assert (steps <= 256 << 10).all(), (entry.name, counts[entry.name])


@pytest.mark.parametrize("tensor", ["one-chunk", "chunks"])
async def test_a_bad_byte_in_a_read_ahead_tensor_is_caught(big: Tree, uri_of: Source, tensor: str) -> None:
    corrupt_tensor(big.root / "big", tensor)
    with pytest.raises(LoadError) as err:
        await asyncio.to_thread(_read, await uri_of(big.root), _manifest(big), chunk=1 << 20)
    assert (err.value.reason, err.value.tensor) == (Reason.CHECKSUM_MISMATCH, tensor)


async def test_a_short_shard_fails_in_the_read_ahead_thread_and_is_raised(big: Tree, uri_of: Source) -> None:
    truncate_shard(big.root / "big", keep_fraction=0.5)  # ends inside "chunks"
    with pytest.raises(LoadError) as err:
        await asyncio.to_thread(_read, await uri_of(big.root), _manifest(big), chunk=1 << 20)
    assert err.value.reason in (Reason.TRUNCATED_SHARD, Reason.SOURCE_UNREACHABLE)


async def test_a_cancel_stops_the_read_and_leaves_no_reader_behind(big: Tree) -> None:
    manifest = _manifest(big)
    calls = 0

    def cancelled() -> bool:
        nonlocal calls
        calls += 1
        return calls > 6  # part way through the first read-ahead tensor, in 256 KiB pieces

    with pytest.raises(LoadError) as err:
        await asyncio.to_thread(_read, big.file_uri, manifest, chunk=256 << 10, cancelled=cancelled)
    assert err.value.reason == Reason.CANCELLED
    assert [t.name for t in threading.enumerate() if t.name.startswith("ckpt-readahead")] == []


def test_an_oversized_extra_file_is_refused_before_anything_is_allocated(big: Tree) -> None:
    manifest = _manifest(big)
    huge = ExtraFileRecord(size=MAX_EXTRA_FILE_BYTES + 1, xxh3_128="0" * 32)
    with pytest.raises(LoadError) as err:
        read_extra_files(
            open_transport(big.file_uri),
            manifest.model_copy(update={"extra_files": {"tokenizer.json": huge}}),
            cancelled=lambda: False,
        )
    assert err.value.reason == Reason.INVALID_MANIFEST
    assert "tokenizer.json" in err.value.message
