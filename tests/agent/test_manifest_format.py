"""The manifest format (ckpt_api.manifest): its published schema, format versions, unknown
fields, extra files, and the dtype table against the safetensors library itself."""

from __future__ import annotations

import copy
import json
import struct
from pathlib import Path
from typing import Any

import jsonschema_rs
import pytest
from safetensors import safe_open

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_api.manifest import (
    CHECKSUM_ALGORITHM,
    DTYPE_BITS,
    FORMAT_VERSION,
    ExtraFileRecord,
    ManifestDocument,
    ShardRecord,
    StrongDigest,
    TensorRecord,
    encode_manifest,
    is_valid_digest,
    render_schema,
)
from ckpt_source.dtypes import BITS, ITEM_SIZES, PACKED, from_numpy, nbytes_of, numpy_dtype

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "operator" / "ckpt_api" / "manifest.schema.json"


def _doc() -> dict[str, Any]:
    return {
        "format_version": 2,
        "version": "v9",
        "checksum": "xxh3-128",
        "total_bytes": 16,
        "files": {"a.safetensors": {"size": 64}},
        "extra_files": {"config.json": {"size": 10, "xxh3_128": "a" * 32}},
        "tensors": [
            {"name": "w", "dtype": "F32", "shape": [2, 2], "file": "a.safetensors", "offset": 16,
             "nbytes": 16, "xxh3_128": "0" * 32},
        ],
    }  # fmt: skip


def _parse(doc: dict[str, Any]) -> ManifestDocument:
    return parse_manifest(json.dumps(doc).encode(), expected_version="v9")


def _refused(doc: dict[str, Any]) -> str:
    with pytest.raises(LoadError) as info:
        _parse(doc)
    assert info.value.reason == Reason.INVALID_MANIFEST
    return info.value.message


def test_committed_schema_is_what_the_model_generates() -> None:
    assert SCHEMA_FILE.read_text() == render_schema(), "run `make crds` and commit the result"


def test_schema_accepts_what_readers_accept_and_refuses_unsafe_names() -> None:
    validator = jsonschema_rs.validator_for(json.loads(SCHEMA_FILE.read_text()))
    assert validator.is_valid(_doc())
    for name in ("../x", "manifest.json", "a..b", ".hidden", "sub/dir"):
        doc = _doc()
        doc["extra_files"][name] = {"size": 1, "xxh3_128": "0" * 32}
        assert not validator.is_valid(doc), name
        with pytest.raises(LoadError):
            _parse(doc)
    newer = _doc() | {"format_version": FORMAT_VERSION + 1}
    assert not validator.is_valid(newer)


def test_extra_files_parse_into_the_agent_records() -> None:
    manifest = _parse(_doc())
    assert manifest.extra_files == {"config.json": ExtraFileRecord(size=10, xxh3_128="a" * 32)}
    assert manifest.files == {"a.safetensors": ShardRecord(size=64)}
    assert manifest.format_version == 2


def test_unknown_fields_from_a_newer_publisher_are_ignored() -> None:
    doc = _doc()
    doc["provenance"] = {"trainer": "x"}
    doc["files"]["a.safetensors"]["sha256"] = "f" * 64
    doc["extra_files"]["config.json"]["mode"] = 420
    doc["tensors"][0]["sha3_256"] = "e" * 64
    assert _parse(doc) == _parse(_doc())


@pytest.mark.parametrize("algorithm", ["blake3", "sha256"])
def test_a_strong_digest_is_read_when_given_and_optional_for_older_manifests(algorithm: str) -> None:
    doc = _doc()
    doc["tensors"][0][algorithm] = "e" * 64
    doc["extra_files"]["config.json"][algorithm] = "d" * 64
    manifest = _parse(doc)
    assert manifest.tensors[0].strong_digest == (algorithm, "e" * 64)
    assert manifest.extra_files["config.json"].strong_digest == (algorithm, "d" * 64)
    assert manifest.strong_digests_complete
    assert json.loads(encode_manifest(manifest))["tensors"][0][algorithm] == "e" * 64
    older = _parse(_doc())
    assert older.tensors[0].strong_digest is None
    # Absent from what it encodes back to, so an older manifest's bytes (and digest) are unchanged.
    assert algorithm not in json.loads(encode_manifest(older))["tensors"][0]
    assert not older.strong_digests_complete


def test_blake3_is_preferred_where_a_record_carries_both() -> None:
    doc = _doc()
    doc["tensors"][0] |= {"sha256": "a" * 64, "blake3": "b" * 64}
    assert _parse(doc).tensors[0].strong_digest == StrongDigest("blake3", "b" * 64)


def test_one_record_without_a_strong_digest_leaves_the_manifest_incomplete() -> None:
    doc = _doc()
    doc["tensors"][0]["blake3"] = "e" * 64
    assert not _parse(doc).strong_digests_complete, "the extra file has none"
    doc["extra_files"]["config.json"]["sha256"] = "d" * 64
    assert _parse(doc).strong_digests_complete


def test_a_newer_format_version_is_refused_by_name() -> None:
    message = _refused(_doc() | {"format_version": 4})
    assert "unsupported format_version 4" in message
    assert "reads 1 to 3" in message


def test_format_version_1_without_extra_files_still_reads_and_encodes_back() -> None:
    doc = _doc() | {"format_version": 1}
    del doc["extra_files"]
    manifest = _parse(doc)
    assert manifest.format_version == 1
    assert manifest.extra_files == {}
    assert "extra_files" not in json.loads(encode_manifest(manifest))


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"extra_files": {"a.safetensors": {"size": 1, "xxh3_128": "0" * 32}}}, "also listed in files"),
        ({"extra_files": {"config.json": {"size": 1}}}, "xxh3_128 must be 32 lowercase hex"),
        ({"extra_files": {"config.json": {"size": -1, "xxh3_128": "0" * 32}}}, "size must be an integer"),
        ({"extra_files": {"x y.json": {"size": 1, "xxh3_128": "0" * 32}}}, "unsafe extra file name"),
        ({"extra_files": []}, "extra_files must be an object"),
        (
            {"extra_files": {"config.json": {"size": 1, "xxh3_128": "0" * 32, "sha256": "F" * 64}}},
            "sha256 must be 64 lowercase hex",
        ),
        (
            {"extra_files": {"config.json": {"size": 1, "xxh3_128": "0" * 32, "blake3": "0" * 63}}},
            "blake3 must be 64 lowercase hex",
        ),
        ({"format_version": "2"}, "unsupported format_version"),
        ({"format_version": True}, "unsupported format_version"),
    ],
)
def test_bad_extra_files_and_versions_are_refused(change: dict[str, Any], fragment: str) -> None:
    assert fragment in _refused(_doc() | change)


def test_packed_dtypes_need_whole_bytes() -> None:
    doc = copy.deepcopy(_doc())
    doc["tensors"][0] |= {"dtype": "F4", "shape": [3], "nbytes": 2}
    assert "not a whole number of bytes" in _refused(doc)
    doc["tensors"][0] |= {"dtype": "F6_E3M2", "shape": [4], "nbytes": 3}
    assert _parse(doc).tensors[0].nbytes == 3


def test_encoding_round_trips_every_field() -> None:
    tensor = TensorRecord(
        name="w",
        dtype="F8_E8M0",
        shape=(4,),
        file="a.safetensors",
        offset=8,
        nbytes=4,
        xxh3_128="1" * 32,
        sha256="3" * 64,
        blake3="5" * 64,
    )
    manifest = ManifestDocument(
        format_version=FORMAT_VERSION,
        version="v9",
        checksum=CHECKSUM_ALGORITHM,
        files={"a.safetensors": ShardRecord(size=64)},
        tensors=(tensor,),
        extra_files={"config.json": ExtraFileRecord(size=3, xxh3_128="2" * 32, blake3="4" * 64)},
    )
    raw = encode_manifest(manifest)
    assert parse_manifest(raw) == manifest
    assert encode_manifest(parse_manifest(raw)) == raw


def _library_accepts(dtype: str, shape: list[int], nbytes: int, tmp: Path) -> bool:
    raw = json.dumps({"t": {"dtype": dtype, "shape": shape, "data_offsets": [0, nbytes]}}).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    path = tmp / "probe.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * nbytes)
    try:
        with safe_open(str(path), "numpy"):
            return True
    except Exception:
        return False


def test_the_dtype_table_is_the_safetensors_librarys(tmp_path: Path) -> None:
    assert set(BITS) == set(DTYPE_BITS)
    for dtype, bits in BITS.items():
        shape = [8, 3]  # 24 elements: whole bytes for every width
        assert nbytes_of(dtype, (8, 3)) == 24 * bits // 8
        assert _library_accepts(dtype, shape, 24 * bits // 8, tmp_path), dtype
        # One byte more than the shape needs is refused by the library as by us.
        assert not _library_accepts(dtype, shape, 24 * bits // 8 + 1, tmp_path), dtype
    assert not _library_accepts("F33", [1], 4, tmp_path)
    assert {"F4", "F6_E2M3", "F6_E3M2"} == PACKED
    assert "F4" not in ITEM_SIZES
    assert ITEM_SIZES["C64"] == 8


@pytest.mark.parametrize(("dtype", "shape"), [("F4", (3,)), ("F6_E2M3", (2,)), ("F6_E3M2", (1, 5))])
def test_packed_shapes_that_do_not_fill_bytes_are_refused_by_both(
    dtype: str, shape: tuple[int, ...], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="whole number of bytes"):
        nbytes_of(dtype, shape)
    bits = BITS[dtype] * shape[-1] * (shape[0] if len(shape) > 1 else 1)
    assert not _library_accepts(dtype, list(shape), -(-bits // 8), tmp_path)


def test_numpy_holders() -> None:
    import numpy as np

    assert numpy_dtype("BF16") == np.dtype("<u2")
    assert numpy_dtype("F8_E8M0") == np.dtype("u1")
    assert numpy_dtype("F4") == np.dtype("u1")
    assert numpy_dtype("C64") == np.dtype("<c8")
    assert from_numpy(np.dtype("complex64")) == "C64"
    with pytest.raises(ValueError, match="no safetensors name"):
        from_numpy(np.dtype("complex128"))


def test_a_digest_with_a_final_newline_is_not_a_digest() -> None:
    digest = "sha256:" + "0" * 64
    assert is_valid_digest(digest)
    assert not is_valid_digest(digest + "\n")
