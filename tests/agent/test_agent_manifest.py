"""Manifest parsing/validation, digests and read planning: pure functions, table-driven."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from agent_testkit import Tree

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.pipeline.reader import plan_runs
from ckpt_api.manifest import (
    CHECKSUM_ALGORITHM,
    FORMAT_VERSION,
    ManifestDocument,
    ShardRecord,
    TensorRecord,
    encode_manifest,
    manifest_digest,
)


def _doc() -> dict[str, Any]:
    return {
        "format_version": 1,
        "version": "v9",
        "checksum": "xxh3-128",
        "total_bytes": 24,
        "files": {"a.safetensors": {"size": 64}},
        "tensors": [
            {"name": "w", "dtype": "F32", "shape": [2, 2], "file": "a.safetensors", "offset": 16,
             "nbytes": 16, "xxh3_128": "0" * 32},
            {"name": "b", "dtype": "F16", "shape": [4], "file": "a.safetensors", "offset": 32,
             "nbytes": 8, "xxh3_128": "f" * 32},
        ],
    }  # fmt: skip


def _with(path: str, value: Any) -> dict[str, Any]:
    doc = copy.deepcopy(_doc())
    target: Any = doc
    keys = path.split(".")
    for key in keys[:-1]:
        target = target[int(key)] if isinstance(target, list) else target[key]
    last = keys[-1]
    if value is _DELETE:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return doc


_DELETE = object()


def test_valid_manifest_parses_and_orders_tensors_by_file_offset() -> None:
    manifest = parse_manifest(json.dumps(_doc()).encode(), expected_version="v9")
    assert manifest.version == "v9"
    assert [t.name for t in manifest.by_file["a.safetensors"]] == ["w", "b"]
    assert manifest.total_bytes == 24
    assert manifest.largest_tensor_bytes == 16


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        (_with("format_version", FORMAT_VERSION + 1), "format_version"),
        (_with("checksum", "sha256"), "checksum"),
        (_with("version", "v8"), "not 'v9'"),
        (_with("files", []), "files must be an object"),
        (_with("files", {"../x": {"size": 1}}), "unsafe shard file name"),
        (_with("files", {"manifest.json": {"size": 1}}), "unsafe shard file name"),
        (_with("tensors.0.dtype", "F33"), "unknown dtype"),
        (_with("tensors.0.shape", [2, -2]), "shape dimension"),
        (_with("tensors.0.shape", [2, True]), "shape dimension"),
        (_with("tensors.0.nbytes", 15), "does not match"),
        (_with("tensors.0.offset", 60), "past the size"),
        (_with("tensors.0.file", "b.safetensors"), "not listed"),
        (_with("tensors.0.xxh3_128", "XYZ"), "32 lowercase hex"),
        (_with("tensors.0.name", _DELETE), "name must be a non-empty string"),
        (_with("tensors.1.name", "w"), "listed twice"),
        (_with("tensors.1.offset", 20), "overlap"),
        (_with("tensors", {"w": 1}), "tensors must be a list"),
    ],
)
def test_invalid_manifests_are_rejected_with_a_reason(doc: dict[str, Any], fragment: str) -> None:
    with pytest.raises(LoadError) as info:
        parse_manifest(json.dumps(doc).encode(), expected_version="v9")
    assert info.value.reason == Reason.INVALID_MANIFEST
    assert fragment in info.value.message


@pytest.mark.parametrize("raw", [b"", b"not json", b"\xff\xfe", b"[]", b"null"])
def test_garbage_is_an_invalid_manifest(raw: bytes) -> None:
    with pytest.raises(LoadError) as info:
        parse_manifest(raw)
    assert info.value.reason == Reason.INVALID_MANIFEST


def test_encoding_round_trips_and_digest_is_sha256_of_the_bytes(tree: Tree) -> None:
    raw = (tree.root / "v1" / "manifest.json").read_bytes()
    assert manifest_digest(raw) == tree.digests["v1"]
    manifest = parse_manifest(raw, expected_version="v1")
    assert encode_manifest(manifest) == raw
    assert manifest_digest(raw).startswith("sha256:")
    assert len(manifest_digest(raw)) == 71


def _entry(name: str, offset: int, nbytes: int, file: str = "a") -> TensorRecord:
    return TensorRecord(
        name=name, dtype="U8", shape=(nbytes,), file=file, offset=offset, nbytes=nbytes, xxh3_128="0" * 32
    )


def test_plan_runs_groups_contiguous_tensors_and_splits_on_gaps_and_size() -> None:
    manifest = ManifestDocument(
        format_version=FORMAT_VERSION,
        version="v",
        checksum=CHECKSUM_ALGORITHM,
        files={"a": ShardRecord(size=10 << 20), "b": ShardRecord(size=100)},
        tensors=(
            _entry("a0", 0, 10),
            _entry("a1", 10, 10),
            _entry("a2", 30, 10),  # small gap: same run
            _entry("a3", 5 << 20, 10),  # big gap: new run
            _entry("b0", 0, 50, "b"),
        ),
    )
    runs = plan_runs(manifest)
    assert [[e.name for e in r.entries] for r in runs] == [["a0", "a1", "a2"], ["a3"], ["b0"]]
    split = plan_runs(manifest, max_run_bytes=15)
    assert [[e.name for e in r.entries] for r in split] == [["a0"], ["a1"], ["a2"], ["a3"], ["b0"]]


SECRET = "hunter2"
PAGE = f"<html><body>internal admin page, password {SECRET}</body></html>"


@pytest.mark.parametrize(
    "doc",
    [
        _with("format_version", PAGE),
        _with("format_version", SECRET),
        _with("format_version", {"token": SECRET}),
        _with("version", PAGE),
        _with("files", {PAGE: {"size": 1}}),
        _with("tensors.0.dtype", PAGE),
        _with("tensors.0.file", PAGE),
        # A tensor may be called anything; one called so and also wrong is named by its index.
        {**_with("tensors.0.nbytes", 15), "tensors": [{**_doc()["tensors"][0], "name": PAGE, "nbytes": 15}]},
    ],
    ids=["format-page", "format-short", "format-object", "version", "file", "dtype", "tensor-file", "tensor"],
)
def test_a_replys_text_is_not_repeated_in_the_message(doc: dict[str, Any]) -> None:
    """A "manifest" fetched from the wrong address may be any page; its message reaches the CR's
    status, so it names what is wrong and repeats only short name-like values, never prose or
    markup (and no string given where a number belongs)."""
    with pytest.raises(LoadError) as info:
        parse_manifest(json.dumps(doc).encode(), expected_version="v9")
    assert info.value.reason == Reason.INVALID_MANIFEST
    assert "internal admin page" not in info.value.message
    assert "<html>" not in info.value.message
    if "format_version" in doc and doc["format_version"] != 1:
        assert SECRET not in info.value.message
        assert "unsupported format_version" in info.value.message
