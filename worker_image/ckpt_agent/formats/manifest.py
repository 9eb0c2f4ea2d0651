"""The checkpoint version manifest as the agent uses it: what a published version holds.

The format, its compatibility rules (format versions, unknown fields) and its validation are
`ckpt_api.manifest`'s; this module turns a validated document into the plain, hashable records
the load pipeline passes around, and encodes them back for `publish`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_api.manifest import (
    CHECKSUM_ALGORITHM,
    FORMAT_VERSION,
    MANIFEST_NAME,
    ManifestError,
    is_valid_file_name,
    parse_document,
    shown,
)

__all__ = [
    "CHECKSUM_ALGORITHM",
    "DEFAULT_MAX_MANIFEST_BYTES",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "ExtraFile",
    "Manifest",
    "OutputReference",
    "TensorEntry",
    "encode_manifest",
    "is_valid_digest",
    "is_valid_file_name",
    "manifest_digest",
    "parse_manifest",
]
# 100k tensors with long names fit in a few tens of MiB; anything bigger is a broken or hostile source.
DEFAULT_MAX_MANIFEST_BYTES = 64 << 20

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
    # None in manifests published before it existed (see `Manifest.sha256_complete`).
    sha256: str | None = None

    @property
    def end(self) -> int:
        return self.offset + self.nbytes

    def to_json(self) -> dict[str, Any]:
        return _with_sha256(
            {
                "name": self.name,
                "dtype": self.dtype,
                "shape": list(self.shape),
                "file": self.file,
                "offset": self.offset,
                "nbytes": self.nbytes,
                "xxh3_128": self.xxh3_128,
            },
            self.sha256,
        )


def _with_sha256(doc: dict[str, Any], sha256: str | None) -> dict[str, Any]:
    # Absent rather than null: the bytes of a manifest without digests stay what they were.
    if sha256 is not None:
        doc["sha256"] = sha256
    return doc


@dataclass(frozen=True)
class ExtraFile:
    """A non-weight file of the version (config, tokenizer, index...), verified whole."""

    name: str
    size: int
    xxh3_128: str
    sha256: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _with_sha256({"size": self.size, "xxh3_128": self.xxh3_128}, self.sha256)


@dataclass(frozen=True)
class OutputReference:
    """What the reference model answers on its fixed input with a version's weights (the
    manifest's `reference`), and how far an output may be from it."""

    outputs: tuple[float, ...]
    atol: float

    def to_json(self) -> dict[str, Any]:
        return {"outputs": list(self.outputs), "atol": self.atol}


@dataclass(frozen=True)
class Manifest:
    version: str
    files: Mapping[str, int]  # shard name -> size in bytes: the files holding tensors
    tensors: tuple[TensorEntry, ...]
    extra_files: Mapping[str, ExtraFile] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    reference: OutputReference | None = None

    @property
    def total_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def sha256_complete(self) -> bool:
        """Every tensor and file has a sha256, so bytes from an untrusted transport (a peer,
        Mooncake: `transport.is_untrusted`) can be checked against it."""
        return all(t.sha256 is not None for t in self.tensors) and all(
            e.sha256 is not None for e in self.extra_files.values()
        )

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
        doc: dict[str, Any] = {
            "format_version": self.format_version,
            "version": self.version,
            "checksum": CHECKSUM_ALGORITHM,
            "total_bytes": self.total_bytes,
            "files": {name: {"size": size} for name, size in sorted(self.files.items())},
            "tensors": [t.to_json() for t in self.tensors],
        }
        if self.format_version >= 2:
            doc["extra_files"] = {name: e.to_json() for name, e in sorted(self.extra_files.items())}
        if self.reference is not None:
            doc["reference"] = self.reference.to_json()
        return doc


def encode_manifest(manifest: Manifest) -> bytes:
    # Deterministic bytes: publishing the same tensors twice gives the same digest.
    return (json.dumps(manifest.to_json(), indent=1, sort_keys=True) + "\n").encode()


def manifest_digest(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def is_valid_digest(value: str) -> bool:
    return bool(_DIGEST.fullmatch(value))


def parse_manifest(raw: bytes, *, expected_version: str | None = None) -> Manifest:
    """Parse and validate a manifest; raises LoadError(InvalidManifest) naming what is wrong."""
    try:
        doc = parse_document(raw)
    except ManifestError as exc:
        message = str(exc)
        if not message.startswith("manifest is not valid JSON"):
            message = f"invalid manifest: {message}"
        raise LoadError(Reason.INVALID_MANIFEST, message) from None
    if expected_version is not None and doc.version != expected_version:
        raise LoadError(
            Reason.INVALID_MANIFEST,
            f"invalid manifest: manifest is for version {shown(doc.version, 128)}, not {expected_version!r}",
        )
    return Manifest(
        version=doc.version,
        files={name: f.size for name, f in doc.files.items()},
        tensors=tuple(
            TensorEntry(t.name, t.dtype, tuple(t.shape), t.file, t.offset, t.nbytes, t.xxh3_128, t.sha256)
            for t in doc.tensors
        ),
        extra_files={
            name: ExtraFile(name, e.size, e.xxh3_128, e.sha256) for name, e in doc.extra_files.items()
        },
        format_version=doc.format_version,
        reference=None
        if doc.reference is None
        else OutputReference(tuple(doc.reference.outputs), doc.reference.atol),
    )
