"""`ckpt-rollout publish`: turn safetensors files or a saved paddle state dict into a version.

Writes `<out>/<version>/` (shards + manifest.json) atomically: everything lands in a hidden
temporary directory that is renamed into place last, so a source never serves a half-written
version, and an existing version is never overwritten.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from ckpt_agent.dtypes import from_numpy
from ckpt_agent.manifest import (
    MANIFEST_NAME,
    Manifest,
    TensorEntry,
    encode_manifest,
    is_valid_file_name,
    manifest_digest,
)
from ckpt_agent.safetensors_format import StoredTensor, read_header, write_file
from ckpt_api.versions import validate_version

DEFAULT_SHARD_BYTES = 4 << 30
_HASH_CHUNK = 16 << 20


class PublishError(Exception):
    pass


def _hash_range(f: Any, offset: int, nbytes: int, scratch: memoryview) -> str:
    hasher = xxhash.xxh3_128()
    f.seek(offset)
    while nbytes:
        step = min(nbytes, scratch.nbytes)
        got = f.readinto(scratch[:step])
        if not got:
            raise PublishError("file shrank while publishing")
        hasher.update(scratch[:got])
        nbytes -= got
    return str(hasher.hexdigest())


def _entries_from_file(path: Path, stored: list[StoredTensor]) -> list[TensorEntry]:
    scratch = memoryview(bytearray(_HASH_CHUNK))
    with path.open("rb") as f:
        return [
            TensorEntry(
                t.name,
                t.dtype,
                t.shape,
                path.name,
                t.offset,
                t.nbytes,
                _hash_range(f, t.offset, t.nbytes, scratch),
            )
            for t in stored
        ]


def _publish_safetensors_dir(src: Path, tmp: Path) -> list[TensorEntry]:
    files = sorted(src.glob("*.safetensors"))
    if not files:
        raise PublishError(f"{src} holds no *.safetensors files")
    entries: list[TensorEntry] = []
    for path in files:
        if not is_valid_file_name(path.name):
            raise PublishError(f"shard name {path.name!r} is not a safe file name")
        try:
            stored = read_header(path)
        except (ValueError, KeyError, TypeError) as exc:
            raise PublishError(f"{path.name}: not a readable safetensors file ({exc})") from None
        # The shard is copied byte for byte, so its offsets stay valid (copyfile uses sendfile).
        shutil.copyfile(path, tmp / path.name)
        entries += _entries_from_file(tmp / path.name, stored)
    return entries


def _state_dict_arrays(src: Path) -> list[tuple[str, str, np.ndarray]]:
    import paddle

    from ckpt_agent.engines.reference_model import safetensors_dtype

    state = paddle.load(str(src))
    if not isinstance(state, dict):
        raise PublishError(f"{src} does not hold a state dict (got {type(state).__name__})")
    arrays = []
    for name, value in state.items():
        if isinstance(value, paddle.Tensor):
            # bf16/fp8 come back as same-width unsigned ints holding the raw bits: what we store.
            arrays.append((str(name), safetensors_dtype(value), np.ascontiguousarray(value.numpy())))
        elif isinstance(value, np.ndarray):
            arrays.append((str(name), from_numpy(value.dtype), np.ascontiguousarray(value)))
        else:
            raise PublishError(f"state dict entry {name!r} is a {type(value).__name__}, not a tensor")
    return arrays


def _shard(
    arrays: list[tuple[str, str, np.ndarray]], shard_bytes: int
) -> list[list[tuple[str, str, np.ndarray]]]:
    shards: list[list[tuple[str, str, np.ndarray]]] = [[]]
    size = 0
    for item in arrays:
        if shards[-1] and size + item[2].nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += item[2].nbytes
    return shards


def _publish_state_dict(src: Path, tmp: Path, shard_bytes: int) -> list[TensorEntry]:
    shards = _shard(_state_dict_arrays(src), shard_bytes)
    entries: list[TensorEntry] = []
    for index, shard in enumerate(shards):
        name = f"model-{index + 1:05d}-of-{len(shards):05d}.safetensors"
        views = [(n, dtype, tuple(a.shape), a.reshape(-1).view(np.uint8).data) for n, dtype, a in shard]
        with (tmp / name).open("wb") as f:
            placed = write_file(f, views)
        for stored, (_n, _d, _s, data) in zip(placed, views, strict=True):
            checksum = xxhash.xxh3_128_hexdigest(data)
            entries.append(
                TensorEntry(
                    stored.name, stored.dtype, stored.shape, name, stored.offset, stored.nbytes, checksum
                )
            )
    return entries


def _fsync_all(paths: Iterable[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def publish(src: Path, version: str, out_root: Path, *, shard_bytes: int = DEFAULT_SHARD_BYTES) -> str:
    """Publish `src` as `version` under `out_root`; returns the manifest digest."""
    try:
        validate_version(version)
    except ValueError as exc:
        raise PublishError(str(exc)) from None
    final = out_root / version
    if final.exists():
        raise PublishError(f"version {version} already exists at {final}; versions are immutable")
    if not src.exists():
        raise PublishError(f"{src} does not exist")
    out_root.mkdir(parents=True, exist_ok=True)
    tmp = out_root / f".{version}.tmp-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        if src.is_dir():
            entries = _publish_safetensors_dir(src, tmp)
        else:
            entries = _publish_state_dict(src, tmp, shard_bytes)
        names = [e.name for e in entries]
        if len(set(names)) != len(names):
            dupes = sorted({n for n in names if names.count(n) > 1})
            raise PublishError(f"tensor names appear in more than one shard: {dupes[:8]}")
        files = {p.name: p.stat().st_size for p in tmp.iterdir()}
        raw = encode_manifest(Manifest(version=version, files=files, tensors=tuple(entries)))
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
    return manifest_digest(raw)
