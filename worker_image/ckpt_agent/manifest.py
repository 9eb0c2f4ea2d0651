"""The checkpoint version manifest: what a published version holds, tensor by tensor.

Layout of a version directory (and of the served tree, so any static file server is a source):

    <root>/<version>/manifest.json
    <root>/<version>/<shard>.safetensors

The manifest lists every tensor with its file, byte offset, size and xxh3-128 checksum. Its
own sha256 (over the exact bytes served) is what `source.manifestDigest` pins.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ckpt_agent.dtypes import ITEM_SIZES, nbytes_of
from ckpt_agent.errors import LoadError, Reason

FORMAT_VERSION = 1
CHECKSUM_ALGORITHM = "xxh3-128"
MANIFEST_NAME = "manifest.json"
# 100k tensors with long names fit in a few tens of MiB; anything bigger is a broken or hostile source.
DEFAULT_MAX_MANIFEST_BYTES = 64 << 20

_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")
_XXH3_128 = re.compile(r"^[0-9a-f]{32}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str
    offset: int
    nbytes: int
    xxh3_128: str

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "file": self.file,
            "offset": self.offset,
            "nbytes": self.nbytes,
            "xxh3_128": self.xxh3_128,
        }


@dataclass(frozen=True)
class Manifest:
    version: str
    files: Mapping[str, int]  # shard name -> size in bytes
    tensors: tuple[TensorEntry, ...]
    format_version: int = FORMAT_VERSION
    _by_name: dict[str, TensorEntry] = field(default_factory=dict, compare=False, repr=False)

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def largest_tensor_bytes(self) -> int:
        return max((t.nbytes for t in self.tensors), default=0)

    @cached_property
    def by_file(self) -> dict[str, list[TensorEntry]]:
        """Tensors of each shard in offset order: the order they are read in."""
        groups: dict[str, list[TensorEntry]] = {}
        for t in self.tensors:
            groups.setdefault(t.file, []).append(t)
        for entries in groups.values():
            entries.sort(key=lambda t: t.offset)
        return dict(sorted(groups.items()))

    def to_json(self) -> dict[str, Any]:
        return {
            "format_version": self.format_version,
            "version": self.version,
            "checksum": CHECKSUM_ALGORITHM,
            "total_bytes": self.total_bytes,
            "files": {name: {"size": size} for name, size in sorted(self.files.items())},
            "tensors": [t.to_json() for t in self.tensors],
        }


def encode_manifest(manifest: Manifest) -> bytes:
    # Deterministic bytes: publishing the same tensors twice gives the same digest.
    return (json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n").encode()


def manifest_digest(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def is_valid_digest(value: str) -> bool:
    return bool(_DIGEST.match(value))


def is_valid_file_name(name: str) -> bool:
    return bool(_FILE_NAME.match(name)) and ".." not in name and name != MANIFEST_NAME


class _Invalid(ValueError):
    pass


def _require(cond: bool, message: str) -> None:
    if not cond:
        raise _Invalid(message)


def _int(value: object, what: str, *, minimum: int = 0) -> int:
    _require(isinstance(value, int) and not isinstance(value, bool), f"{what} must be an integer")
    assert isinstance(value, int)
    _require(value >= minimum, f"{what} must be >= {minimum}")
    return value


def _str(value: object, what: str) -> str:
    _require(isinstance(value, str) and bool(value), f"{what} must be a non-empty string")
    assert isinstance(value, str)
    return value


def _parse_tensor(obj: object, index: int, files: Mapping[str, int]) -> TensorEntry:
    where = f"tensors[{index}]"
    _require(isinstance(obj, dict), f"{where} must be an object")
    assert isinstance(obj, dict)
    name = _str(obj.get("name"), f"{where}.name")
    where = f"tensor {name!r}"
    _require(len(name) <= 1024, f"{where}: name longer than 1024 characters")
    dtype = _str(obj.get("dtype"), f"{where}.dtype")
    _require(dtype in ITEM_SIZES, f"{where}: unknown dtype {dtype!r}")
    raw_shape = obj.get("shape")
    _require(isinstance(raw_shape, list) and len(raw_shape) <= 16, f"{where}: shape must be a list")
    assert isinstance(raw_shape, list)
    shape = tuple(_int(d, f"{where}: shape dimension") for d in raw_shape)
    file = _str(obj.get("file"), f"{where}.file")
    _require(file in files, f"{where}: file {file!r} is not listed in files")
    offset = _int(obj.get("offset"), f"{where}.offset")
    nbytes = _int(obj.get("nbytes"), f"{where}.nbytes")
    _require(nbytes == nbytes_of(dtype, shape), f"{where}: nbytes {nbytes} does not match {dtype}{shape}")
    _require(offset + nbytes <= files[file], f"{where}: bytes end past the size of {file}")
    checksum = _str(obj.get("xxh3_128"), f"{where}.xxh3_128")
    _require(bool(_XXH3_128.match(checksum)), f"{where}: xxh3_128 must be 32 lowercase hex digits")
    return TensorEntry(name, dtype, shape, file, offset, nbytes, checksum)


def _parse(doc: object, expected_version: str | None) -> Manifest:
    _require(isinstance(doc, dict), "manifest must be a JSON object")
    assert isinstance(doc, dict)
    fmt = doc.get("format_version")
    _require(fmt == FORMAT_VERSION, f"unsupported format_version {fmt!r} (this agent reads {FORMAT_VERSION})")
    _require(doc.get("checksum") == CHECKSUM_ALGORITHM, f"checksum must be {CHECKSUM_ALGORITHM!r}")
    version = _str(doc.get("version"), "version")
    if expected_version is not None:
        _require(
            version == expected_version, f"manifest is for version {version!r}, not {expected_version!r}"
        )
    raw_files = doc.get("files")
    _require(isinstance(raw_files, dict), "files must be an object")
    assert isinstance(raw_files, dict)
    files: dict[str, int] = {}
    for fname, meta in raw_files.items():
        _require(is_valid_file_name(fname), f"unsafe shard file name {fname!r}")
        _require(isinstance(meta, dict), f"files[{fname!r}] must be an object")
        files[fname] = _int(meta.get("size"), f"files[{fname!r}].size")
    raw_tensors = doc.get("tensors")
    _require(isinstance(raw_tensors, list), "tensors must be a list")
    assert isinstance(raw_tensors, list)
    tensors = tuple(_parse_tensor(obj, i, files) for i, obj in enumerate(raw_tensors))
    by_name: dict[str, TensorEntry] = {}
    for t in tensors:
        _require(t.name not in by_name, f"tensor {t.name!r} is listed twice")
        by_name[t.name] = t
    manifest = Manifest(version=version, files=files, tensors=tensors, _by_name=by_name)
    for fname, entries in manifest.by_file.items():
        for prev, cur in itertools.pairwise(entries):
            _require(cur.offset >= prev.end, f"tensors {prev.name!r} and {cur.name!r} overlap in {fname}")
    return manifest


def parse_manifest(raw: bytes, *, expected_version: str | None = None) -> Manifest:
    """Parse and validate a manifest; raises LoadError(InvalidManifest) naming what is wrong."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LoadError(Reason.INVALID_MANIFEST, f"manifest is not valid JSON: {exc}") from None
    try:
        return _parse(doc, expected_version)
    except _Invalid as exc:
        raise LoadError(Reason.INVALID_MANIFEST, f"invalid manifest: {exc}") from None
