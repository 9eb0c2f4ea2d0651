"""Manifest round trips, for any manifest a publisher can write: encode then parse gives the same
manifest and the same bytes again (the digest a rollout pins must not move), and a layout whose
tensors overlap is refused whatever else it holds."""

from __future__ import annotations

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ckpt_agent.common.errors import LoadError
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_api.manifest import (
    CHECKSUM_ALGORITHM,
    DTYPE_BITS,
    FORMAT_VERSION,
    ExtraFileRecord,
    ManifestDocument,
    ShardRecord,
    TensorRecord,
    encode_manifest,
    manifest_digest,
    tensor_nbytes,
)

_HEX32 = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32)
_FILE = st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,20}\Z").filter(
    lambda n: ".." not in n and n != "manifest.json"
)
_TENSOR_NAME = st.text(min_size=1, max_size=24)


@st.composite
def _tensor_layout(draw: st.DrawFn) -> tuple[str, tuple[int, ...]]:
    dtype = draw(st.sampled_from(sorted(DTYPE_BITS)))
    shape = tuple(draw(st.lists(st.integers(0, 6), max_size=3)))
    if DTYPE_BITS[dtype] % 8:
        shape = (*shape, 8)  # sub-byte dtypes must fill whole bytes: a last dimension of 8 does
    return dtype, shape


@st.composite
def manifests(draw: st.DrawFn) -> ManifestDocument:
    names = draw(st.lists(_FILE, min_size=1, max_size=5, unique=True))
    shards, extra_names = names[: max(1, len(names) // 2)], names[max(1, len(names) // 2) :]
    tensor_names = draw(st.lists(_TENSOR_NAME, max_size=8, unique=True))
    ends = dict.fromkeys(shards, 0)
    tensors = []
    for name in tensor_names:
        dtype, shape = draw(_tensor_layout())
        shard = draw(st.sampled_from(shards))
        offset = ends[shard] + draw(st.integers(0, 16))  # publishers may leave gaps (headers)
        nbytes = tensor_nbytes(dtype, shape)
        ends[shard] = offset + nbytes
        tensors.append(
            TensorRecord(
                name=name,
                dtype=dtype,
                shape=shape,
                file=shard,
                offset=offset,
                nbytes=nbytes,
                xxh3_128=draw(_HEX32),
            )
        )
    return ManifestDocument(
        format_version=FORMAT_VERSION,
        version=draw(st.from_regex(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,30}\Z")),
        checksum=CHECKSUM_ALGORITHM,
        files={s: ShardRecord(size=ends[s] + draw(st.integers(0, 64))) for s in shards},
        tensors=tuple(tensors),
        extra_files={
            n: ExtraFileRecord(size=draw(st.integers(0, 2**40)), xxh3_128=draw(_HEX32)) for n in extra_names
        },
    )


@given(manifests())
def test_encode_then_parse_gives_the_same_manifest_and_the_same_bytes(manifest: ManifestDocument) -> None:
    raw = encode_manifest(manifest)
    parsed = parse_manifest(raw, expected_version=manifest.version)
    assert parsed == manifest
    assert manifest_digest(encode_manifest(parsed)) == manifest_digest(raw)


@given(manifests(), st.data())
def test_tensors_that_overlap_are_refused(manifest: ManifestDocument, data: st.DataObject) -> None:
    sized = [t for t in manifest.tensors if t.nbytes > 0]
    pairs = [(a, b) for a in sized for b in sized if a is not b and a.file == b.file]
    assume(pairs)
    first, second = data.draw(st.sampled_from(pairs))
    # model_copy does not validate: how a publisher's overlapping layout is written to be refused.
    moved = second.model_copy(update={"offset": first.offset + data.draw(st.integers(0, first.nbytes - 1))})
    tensors = tuple(moved if t is second else t for t in manifest.tensors)
    files = {**manifest.files, first.file: ShardRecord(size=max(manifest.files[first.file].size, moved.end))}
    with pytest.raises(LoadError, match="overlap"):
        parse_manifest(encode_manifest(manifest.model_copy(update={"tensors": tensors, "files": files})))
