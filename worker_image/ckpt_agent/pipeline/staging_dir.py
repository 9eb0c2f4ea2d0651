"""On-disk staging for engines that load a version from a directory (SGLang, vLLM).

The staged `<root>/<version>/` is a Hugging Face model directory, what the engines' loaders
take: every shard, and every non-weight file of the version (config.json, tokenizer and
generation files, `model.safetensors.index.json`) byte for byte as verified. Each shard is
rewritten as a fresh safetensors file whose header is built from the verified manifest (never
copied from the source or a peer: those header bytes carry no checksum), and whose data section
the load fills in place through a shared mapping, tensor by tensor, hashing as it goes. Files
are written under a hidden `.partial` name and renamed to `<staging root>/<version>` only once
every byte is verified, so an engine never sees a half staged version. Use a tmpfs (/dev/shm)
or NVMe path.

Before any tensor byte is pulled, the directory as written (headers final, data not yet) is
checked the way the loaders will read it (`check_loadable`): a version whose index names a
shard or tensor the directory lacks, or whose config does not parse, is refused up front.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import secrets
import shutil
import typing
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_api.manifest import ManifestDocument, TensorRecord
from ckpt_source.safetensors_format import encode_header, read_header

CONFIG_NAME = "config.json"
INDEX_NAME = "model.safetensors.index.json"  # transformers' SAFE_WEIGHTS_INDEX_NAME
# What `save_pretrained` writes; transformers refuses a safetensors file whose format it does not
# know, and this directory is meant to load wherever an HF checkpoint does.
_SHARD_METADATA = {"format": "pt"}
_MAX_LISTED = 8


def _listing(items: list[str]) -> str:
    more = len(items) - _MAX_LISTED
    return ", ".join(items[:_MAX_LISTED]) + (f" and {more} more" if more > 0 else "")


def _json_file(path: Path) -> tuple[object, str | None]:
    try:
        return json.loads(path.read_bytes()), None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, f"{path.name} is not valid JSON ({exc})"


def _index_problems(directory: Path) -> list[str]:
    """What the loaders' index rule (vLLM's and SGLang's `filter_duplicate_safetensors_files`:
    load only the shards the weight map names) would make of `directory`."""
    doc, error = _json_file(directory / INDEX_NAME)
    if error is not None:
        return [error]
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        return [f"{INDEX_NAME} has no weight_map of tensor names to shard files"]
    shards = {p.name for p in directory.glob("*.safetensors")}
    problems = []
    named = set(weight_map.values())
    missing = sorted(named - shards)
    if missing:
        problems.append(f"{INDEX_NAME} names shards the version does not hold: {_listing(missing)}")
    unnamed = sorted(shards - named)
    if unnamed:
        problems.append(
            f"loaders following {INDEX_NAME} would skip shards it does not name: {_listing(unnamed)}"
        )
    held: dict[str, set[str]] = {}
    for shard in sorted(shards & named):
        try:
            held[shard] = {t.name for t in read_header(directory / shard)}
        except ValueError as exc:
            problems.append(str(exc))
    misplaced = sorted(
        f"{tensor!r} (in the index under {shard})"
        for tensor, shard in weight_map.items()
        if shard in held and tensor not in held[shard]
    )
    if misplaced:
        problems.append(f"{INDEX_NAME} maps tensors their shard does not hold: {_listing(misplaced)}")
    return problems


def model_directory_problems(directory: Path) -> list[str]:
    """Why an engine's loader could not load `directory` as a model; empty when it can. A
    directory without config.json is a weights-only version (published from bare shards): the
    engines' in-place loads read only weights and keep the model config they booted with."""
    problems = []
    config = directory / CONFIG_NAME
    if config.is_file():
        doc, error = _json_file(config)
        if error is not None:
            problems.append(error)
        elif not isinstance(doc, dict):
            problems.append(f"{CONFIG_NAME} is not a JSON object")
    if (directory / INDEX_NAME).is_file():
        problems.extend(_index_problems(directory))
    return problems


# Hidden names of a staging in progress and of a live copy moved aside for a reload
# (engines.disk_staged): both are renamed or removed by the load that made them.
_ORPHAN_PATTERNS = (".*.partial-*", ".*.restore-*")


def sweep_orphans(root: Path) -> list[Path]:
    """Remove what a load killed mid-way (the agent, its pod or the node died) left in `root`:
    at start no load is running, so every such directory is an orphan. Returns what it removed."""
    if not root.is_dir():
        return []
    swept = sorted({p for pattern in _ORPHAN_PATTERNS for p in root.glob(pattern) if p.is_dir()})
    for path in swept:
        shutil.rmtree(path, ignore_errors=True)
    return swept


def _staging_full(root: Path, version: str, needed: int, exc: OSError | None = None) -> LoadError:
    free = shutil.disk_usage(root).free
    why = f" ({exc.strerror})" if exc is not None else ""
    return LoadError(
        Reason.STAGING_FULL,
        f"staging {version} needs {needed} bytes under {root}, which has {free} bytes free{why}",
    )


def _reserve(f: typing.BinaryIO, size: int) -> None:
    """Allocate the file's blocks now: a sparse file would fail only when a mapped write finds
    the disk full, as a SIGBUS that kills the agent."""
    f.truncate(size)
    if size:
        os.posix_fallocate(f.fileno(), 0, size)


class StagedDirectory:
    def __init__(
        self, root: Path, manifest: ManifestDocument, extra_files: Mapping[str, bytes] | None = None
    ) -> None:
        """`extra_files`: the version's verified non-weight files, written as they are."""
        self.version = manifest.version
        self._root = root
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f".{manifest.version}.partial-{secrets.token_hex(4)}"
        self.path.mkdir()
        # Identity of our directory: a later load of the same version replaces `<root>/<version>`,
        # and releasing this (older) copy must not delete that one.
        self._inode = self.path.stat().st_ino
        self._arrays: list[np.ndarray] = []
        self._maps: list[mmap.mmap] = []
        self._where: dict[tuple[str, str], tuple[int, int]] = {}  # TensorRecord.key -> (map, offset)
        extra = dict(extra_files or {})
        needed = manifest.tensor_bytes + sum(len(c) for c in extra.values())
        try:
            if shutil.disk_usage(root).free < needed:
                raise _staging_full(root, manifest.version, needed)
            for name, content in extra.items():
                (self.path / name).write_bytes(content)
            for file, entries in manifest.by_file.items():
                header, relative = encode_header(
                    [(e.name, e.dtype, e.shape, e.nbytes) for e in entries], metadata=_SHARD_METADATA
                )
                offsets = {e.key: len(header) + off for e, off in zip(entries, relative, strict=True)}
                size = len(header) + sum(e.nbytes for e in entries)
                with (self.path / file).open("w+b") as f:
                    try:
                        _reserve(f, size)
                    except OSError as exc:
                        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                            raise
                        raise _staging_full(root, manifest.version, needed, exc) from None
                    f.write(header)
                    f.flush()
                    mapped = mmap.mmap(f.fileno(), size) if size else None
                if mapped is None:
                    continue
                self._maps.append(mapped)
                self._arrays.append(np.frombuffer(mapped, dtype=np.uint8))
                for key, off in offsets.items():
                    self._where[key] = (len(self._maps) - 1, off)
        except BaseException:
            self.release()
            raise

    def check_loadable(self) -> None:
        """Raise LoadError(IncompatibleCheckpoint) unless the directory loads as a model."""
        problems = model_directory_problems(self.path)
        if problems:
            raise LoadError(
                Reason.INCOMPATIBLE_CHECKPOINT,
                f"version {self.version} is not a loadable model directory: " + "; ".join(problems),
            )

    def buffer(self, entry: TensorRecord) -> memoryview:
        index, off = self._where[entry.key]
        return self._arrays[index].data[off : off + entry.nbytes]

    def finish(self) -> Path:
        """Flush and move into place as `<root>/<version>`; the mappings stay (relay reads them)."""
        for mapped in self._maps:
            mapped.flush()
        final = self._root / self.version
        if final.exists():
            shutil.rmtree(final)
        os.replace(self.path, final)
        self.path = final
        return final

    def release(self) -> None:
        self._arrays.clear()
        for mapped in self._maps:
            # A relay reader still holding a view keeps its mapping until it lets go.
            with contextlib.suppress(BufferError):
                mapped.close()
        self._maps.clear()
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_ino == self._inode:
                shutil.rmtree(self.path, ignore_errors=True)
