"""The checkpoint an in-process engine boots from (`--paddle-weights PATH`): what tensors it
holds and their bytes, read from a published version directory (manifest.json, each tensor
checked against its xxh3-128), a Hugging Face model directory (*.safetensors, the shards its
`model.safetensors.index.json` names when it has one, as vLLM's and SGLang's loaders pick
them), or a single .safetensors file. Later versions must match it name for name.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

from ckpt_agent.common.errors import LoadError
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.pipeline.staging_dir import INDEX_NAME
from ckpt_api.manifest import MANIFEST_NAME
from ckpt_source.safetensors_format import read_header


class BootCheckpointError(ValueError):
    """The boot checkpoint cannot be read or held; the agent refuses to start."""


@dataclass(frozen=True)
class BootTensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    path: Path
    offset: int
    nbytes: int
    xxh3_128: str | None = None  # known for a published version

    def read(self) -> bytes:
        with self.path.open("rb") as f:
            data = os.pread(f.fileno(), self.nbytes, self.offset)
        if len(data) != self.nbytes:
            raise BootCheckpointError(f"{self.path}: tensor {self.name!r} runs past the end of the file")
        if self.xxh3_128 is not None and xxhash.xxh3_128(data).hexdigest() != self.xxh3_128:
            raise BootCheckpointError(
                f"{self.path}: tensor {self.name!r} does not match its manifest checksum"
            )
        return data


def _from_file(path: Path) -> Iterator[BootTensor]:
    try:
        stored = read_header(path)
    except ValueError as exc:
        raise BootCheckpointError(str(exc)) from None
    for t in stored:
        yield BootTensor(t.name, t.dtype, t.shape, path, t.offset, t.nbytes)


def _from_version(directory: Path) -> list[BootTensor]:
    try:
        manifest = parse_manifest((directory / MANIFEST_NAME).read_bytes())
    except LoadError as exc:
        raise BootCheckpointError(f"{directory}: {exc.message}") from None
    return [
        BootTensor(t.name, t.dtype, t.shape, directory / t.file, t.offset, t.nbytes, t.xxh3_128)
        for t in manifest.tensors
    ]


def _shards(directory: Path) -> list[Path]:
    files = sorted(directory.glob("*.safetensors"))
    index = directory / INDEX_NAME
    if not index.is_file():
        return files
    try:
        weight_map = json.loads(index.read_bytes())["weight_map"]
        named = set(weight_map.values())
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BootCheckpointError(f"{index}: not a safetensors index ({exc!r})") from None
    missing = sorted(n for n in named if not (directory / n).is_file())
    if missing:
        raise BootCheckpointError(f"{index} names shards that are not there: {', '.join(missing)}")
    return [f for f in files if f.name in named]


def boot_tensors(path: Path) -> list[BootTensor]:
    """The tensors of the checkpoint at `path`, in name order; BootCheckpointError naming what
    is wrong."""
    if path.is_file():
        tensors = list(_from_file(path))
    elif (path / MANIFEST_NAME).is_file():
        tensors = _from_version(path)
    elif path.is_dir():
        shards = _shards(path)
        if not shards:
            raise BootCheckpointError(f"{path} holds no *.safetensors files and no {MANIFEST_NAME}")
        tensors = [t for shard in shards for t in _from_file(shard)]
    else:
        raise BootCheckpointError(f"{path} does not exist")
    seen: dict[str, Path] = {}
    for t in tensors:
        if t.name in seen:
            raise BootCheckpointError(f"tensor {t.name!r} is in both {seen[t.name].name} and {t.path.name}")
        seen[t.name] = t.path
    if not tensors:
        raise BootCheckpointError(f"{path} holds no tensors")
    return sorted(tensors, key=lambda t: t.name)
