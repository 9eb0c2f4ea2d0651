"""`ckpt-rollout publish`: turn a checkpoint into a version a source can serve.

A source is an HF-style model directory (sharded with `*.safetensors.index.json`, or one
`model.safetensors`), a single `.safetensors` file, or a saved paddle state dict
(`sources` says what is kept and skipped, and the index rules). The version holds the shards
byte for byte (linked, reflinked or copied: `placing`), every other file of the checkpoint, a
generated `model.safetensors.index.json` when there are several shards and no index, and the
manifest listing every tensor and file with its xxh3-128 and BLAKE3 (`hashing`; `digest="sha256"`
writes a format 2 manifest with sha256 instead, for a fleet whose agents predate format 3).

Atomic: everything lands in a hidden temporary directory next to the version, renamed into place
last, so a source never serves a half-written version, an existing version is never overwritten,
and a failed publish leaves nothing behind.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ckpt_api.manifest import (
    CHECKSUM_ALGORITHM,
    FORMAT_VERSION,
    MANIFEST_NAME,
    ExtraFileRecord,
    ManifestDocument,
    ReferenceRecord,
    ShardRecord,
    StrongAlgorithm,
    StrongDigest,
    TensorRecord,
    encode_manifest,
    manifest_digest,
    shard_rank,
)
from ckpt_api.versions import validate_version
from ckpt_source.publish.hashing import Span, default_threads, hash_spans
from ckpt_source.publish.placing import COPY_METHODS, LINK_METHODS, WRITTEN, place
from ckpt_source.publish.progress import Reporter, Silent
from ckpt_source.publish.sources import (
    GENERATED_INDEX,
    PublishError,
    SourceFile,
    SourcePlan,
    generated_index,
    plan_directory,
    plan_file,
    shard_header,
)
from ckpt_source.publish.state_dict import write_state_dict

__all__ = [
    "DEFAULT_SHARD_BYTES",
    "PublishError",
    "PublishResult",
    "PublishedFile",
    "publish",
    "publish_version",
    "read_reference",
]

DEFAULT_SHARD_BYTES = 4 << 30


@dataclass(frozen=True)
class PublishedFile:
    name: str
    kind: str  # "shard" | "extra"
    bytes: int
    method: str  # hardlink | reflink | copy | written


@dataclass(frozen=True)
class PublishResult:
    version: str
    digest: str
    path: Path
    files: tuple[PublishedFile, ...]
    tensors: int
    seconds: float
    warnings: tuple[str, ...]

    @property
    def bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_json(self) -> dict[str, Any]:
        methods: dict[str, int] = {}
        for f in self.files:
            methods[f.method] = methods.get(f.method, 0) + 1
        return {
            "version": self.version,
            "digest": self.digest,
            "path": str(self.path),
            "files": [
                {"name": f.name, "kind": f.kind, "bytes": f.bytes, "method": f.method} for f in self.files
            ],
            "tensors": self.tensors,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "gbps": round(self.bytes / self.seconds / 1e9, 3) if self.seconds > 0 else None,
            "link_methods": dict(sorted(methods.items())),
            "warnings": list(self.warnings),
        }


def publish(
    src: Path,
    version: str,
    out_root: Path,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    link: bool = False,
    reference: ReferenceRecord | None = None,
    digest: StrongAlgorithm = "blake3",
) -> str:
    """Publish `src` as `version` under `out_root`; returns the manifest digest."""
    return publish_version(
        src, version, out_root, shard_bytes=shard_bytes, link=link, reference=reference, digest=digest
    ).digest


def read_reference(path: Path) -> ReferenceRecord:
    """A `--reference` file: {outputs, atol} as the manifest's `reference` holds it; PublishError
    naming what is wrong."""
    try:
        record = ReferenceRecord.model_validate_json(path.read_bytes())
    except OSError as exc:
        raise PublishError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "the file"
        raise PublishError(f"{path}: not a reference {{outputs, atol}}: {where}: {first['msg']}") from None
    return record


def publish_version(
    src: Path,
    version: str,
    out_root: Path,
    *,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    link: bool = False,
    methods: Sequence[str] | None = None,
    threads: int | None = None,
    reporter: Reporter | None = None,
    reference: ReferenceRecord | None = None,
    digest: StrongAlgorithm = "blake3",
) -> PublishResult:
    """Publish `src` as `version` under `out_root`.

    `link` places source files with a hard link where it can (see `placing`); `methods` overrides
    the order tried (e.g. `("copy",)` to always copy). `reference`: the reference model's
    outputs with these weights, for the manifest (see `ckpt_api.manifest.ReferenceRecord`).
    `digest`: the cryptographic digest of every tensor and file; "sha256" writes format 2, which
    agents older than format 3 read.
    PublishError for bad input, one line naming the file; nothing is left under `out_root` then.
    """
    started = time.monotonic()
    report = reporter or Silent()
    try:
        validate_version(version)
    except ValueError as exc:
        raise PublishError(str(exc)) from None
    final = out_root / version
    if final.exists():
        raise PublishError(f"version {version} already exists at {final}; versions are immutable")
    if not src.exists():
        raise PublishError(f"{src} does not exist")
    order = tuple(methods or (LINK_METHODS if link else COPY_METHODS))
    plan = _plan(src)
    for warning in plan.warnings:
        report.warn(warning)
    out_root.mkdir(parents=True, exist_ok=True)
    tmp = out_root / f".{version}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        files, tensors, extra_files = _build(
            src, tmp, plan, order, shard_bytes, threads or default_threads(), report, digest
        )
        manifest = ManifestDocument(
            format_version=FORMAT_VERSION if digest == "blake3" else 2,
            version=version,
            checksum=CHECKSUM_ALGORITHM,
            files={
                f.name: ShardRecord(size=f.bytes, rank=shard_rank(f.name)) for f in files if f.kind == "shard"
            },
            tensors=tuple(tensors),
            extra_files=extra_files,
            reference=reference,
        )
        raw = encode_manifest(manifest)
        (tmp / MANIFEST_NAME).write_bytes(raw)
        _fsync_all([*tmp.iterdir(), tmp])
        try:
            # rename() refuses a non-empty target, so a racing publisher cannot be overwritten.
            tmp.rename(final)
        except OSError:
            raise PublishError(
                f"version {version} already exists at {final}; versions are immutable"
            ) from None
        _fsync_all([out_root])
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        report.end()
    return PublishResult(
        version=version,
        digest=manifest_digest(raw),
        path=final,
        files=tuple(files),
        tensors=len(tensors),
        seconds=time.monotonic() - started,
        warnings=tuple(plan.warnings),
    )


def _plan(src: Path) -> SourcePlan:
    try:
        if src.is_dir():
            return plan_directory(src)
        if src.name.endswith(".safetensors"):
            return plan_file(src)
    except OSError as exc:
        raise PublishError(f"{exc.filename or src}: cannot read ({exc.strerror or exc})") from None
    return SourcePlan(state_dict=src)


def _build(
    src: Path,
    tmp: Path,
    plan: SourcePlan,
    order: tuple[str, ...],
    shard_bytes: int,
    threads: int,
    report: Reporter,
    strong: StrongAlgorithm,
) -> tuple[list[PublishedFile], list[TensorRecord], dict[str, ExtraFileRecord]]:
    """Fill `tmp` with the version's files and hash them; the manifest's contents."""
    method: dict[str, str] = {}
    if plan.state_dict is not None:
        names = write_state_dict(plan.state_dict, tmp, shard_bytes)
        shards = [(name, shard_header(tmp / name)) for name in names]
        extras: list[str] = []
        method.update(dict.fromkeys(names, WRITTEN))
        report.begin(sum(t.nbytes for _, tensors in shards for t in tensors))
    else:
        report.begin(plan.tensor_bytes + sum(f.size for f in plan.extras))
        for source in [*plan.shards, *plan.extras]:
            method[source.name] = _place(source, tmp, order, report)
        shards = []
        for shard in plan.shards:
            placed = shard_header(tmp / shard.name)
            if placed != shard.tensors:
                raise PublishError(f"{shard.path}: changed while it was published")
            shards.append((shard.name, placed))
        extras = [f.name for f in plan.extras]
    # A sharded_state checkpoint has no index: each rank reads its files by name, and the ranks'
    # files repeat parameter names, which an index's weight map cannot hold.
    ranked = any(shard_rank(name) is not None for name, _ in shards)
    if len(shards) > 1 and plan.index is None and not ranked:
        index = generated_index(shards)
        (tmp / GENERATED_INDEX).write_bytes(index)
        extras.append(GENERATED_INDEX)
        method[GENERATED_INDEX] = WRITTEN
        report.expect(len(index))
    sizes = {name: (tmp / name).stat().st_size for name in [*(n for n, _ in shards), *extras]}
    spans = [Span(name, t.offset, t.nbytes) for name, tensors in shards for t in tensors]
    spans += [Span(name, 0, sizes[name]) for name in extras]

    def file_done(name: str) -> None:
        report.file_done(name, sizes[name], method[name])

    try:
        digests = hash_spans(
            tmp, spans, threads=threads, advance=report.advance, file_done=file_done, strong=strong
        )
    except (OSError, ValueError) as exc:
        raise PublishError(f"hashing the version failed: {exc}") from None
    for name, tensors in shards:
        if not tensors:
            file_done(name)
    located = [(name, t) for name, tensors in shards for t in tensors]
    tensor_digests, extra_digests = digests[: len(located)], digests[len(located) :]
    tensor_entries = [
        # Validated, not just built: the dtype read from a header is a name, not yet a Dtype.
        TensorRecord.model_validate(
            {
                "name": t.name,
                "dtype": t.dtype,
                "shape": t.shape,
                "file": name,
                "offset": t.offset,
                "nbytes": t.nbytes,
                "xxh3_128": digest.xxh3_128,
                **_strong_field(digest.strong),
            }
        )
        for (name, t), digest in zip(located, tensor_digests, strict=True)
    ]
    extra_files = {
        name: ExtraFileRecord.model_validate(
            {"size": sizes[name], "xxh3_128": digest.xxh3_128, **_strong_field(digest.strong)}
        )
        for name, digest in zip(extras, extra_digests, strict=True)
    }
    files = [PublishedFile(name, "shard", sizes[name], method[name]) for name, _ in shards]
    files += [PublishedFile(name, "extra", sizes[name], method[name]) for name in extras]
    return files, tensor_entries, extra_files


def _strong_field(strong: StrongDigest | None) -> dict[str, str]:
    """A record's cryptographic digest under its algorithm's field name."""
    return {} if strong is None else {strong.algorithm: strong.hexdigest}


def _place(source: SourceFile, tmp: Path, order: tuple[str, ...], report: Reporter) -> str:
    try:
        used = place(source.path, tmp / source.name, order, advance=report.advance, expect=report.expect)
    except OSError as exc:
        raise PublishError(f"{source.path}: cannot place it in the version ({exc.strerror or exc})") from None
    return used


def _fsync_all(paths: Iterable[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
