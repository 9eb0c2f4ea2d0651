"""What a checkpoint source holds, decided before a byte is copied: shards, other files, skips.

A source is an HF-style directory, one `.safetensors` file, or (see `state_dict`) a saved paddle
state dict. Every check that can refuse the source runs here, on headers and the index only, so
bad input fails in a second, not after copying 100 GB.

Kept from a directory, by name (top level only):
- `*.safetensors`: the shards. With an index, exactly the shards it names (others are skipped
  with a warning: loaders read only what the index names).
- every other regular file: config, generation config, tokenizer files, the index, chat
  templates, README… (`extra_files`), byte for byte. Symlinks count as the file they point to
  (a Hugging Face cache snapshot is all symlinks into `../../blobs`).
Skipped, each with a warning saying why: hidden files, sub-directories, broken symlinks, files
that are not regular (fifos, sockets), names a version cannot hold (`is_valid_file_name`), a
`manifest.json` (publish writes its own), and weights in another format (`*.bin`, `*.pt`,
`*.pdparams`, … and their `*.index.json`): publish converts nothing, and a loader given both
formats may pick the wrong one. A `*.safetensors` with an unsafe name is an error, not a skip:
dropping weights would publish a different model.

Index rules (`*.safetensors.index.json`, at most one): every shard it names exists; every tensor
it maps lives in that shard and nowhere else; every tensor of those shards is in it. Its
`metadata.total_size` only gets a warning when it disagrees: loaders do not use it, and the index
is kept byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckpt_api.manifest import MANIFEST_NAME, is_valid_file_name, shard_rank
from ckpt_source.safetensors_format import StoredTensor, read_header

INDEX_SUFFIX = ".safetensors.index.json"
GENERATED_INDEX = "model.safetensors.index.json"
# Weights (and their indexes) in formats publish does not convert.
OTHER_WEIGHT_SUFFIXES = (
    ".bin",
    ".pt",
    ".pth",
    ".ckpt",
    ".pdparams",
    ".pdopt",
    ".pkl",
    ".pickle",
    ".h5",
    ".msgpack",
    ".gguf",
    ".onnx",
    ".npz",
    ".npy",
    ".ot",
    ".tflite",
)


class PublishError(Exception):
    """Bad input or a failed publish: one line, naming the file."""


@dataclass(frozen=True)
class SourceFile:
    name: str  # its name in the version
    path: Path  # where it is read from (a symlink's target is what gets linked or copied)
    size: int


@dataclass(frozen=True)
class SourceShard(SourceFile):
    tensors: tuple[StoredTensor, ...] = ()


@dataclass
class SourcePlan:
    shards: list[SourceShard] = field(default_factory=list)
    extras: list[SourceFile] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    index: str | None = None  # the index among `extras`, if the source has one
    state_dict: Path | None = None  # a paddle state dict to write out as shards instead

    @property
    def tensor_bytes(self) -> int:
        return sum(t.nbytes for s in self.shards for t in s.tensors)


def shard_header(path: Path, name: str | None = None) -> tuple[StoredTensor, ...]:
    """The tensors of a safetensors file, or a PublishError naming the file."""
    try:
        return tuple(read_header(path))
    except ValueError as exc:
        detail = str(exc).removeprefix(f"{path.name}: ")
        raise PublishError(f"{path}: {detail}") from None
    except OSError as exc:
        raise PublishError(f"{path}: cannot read ({exc.strerror or exc})") from None


def plan_file(src: Path) -> SourcePlan:
    """One `.safetensors` file: the version's only shard, under its own name."""
    if not is_valid_file_name(src.name):
        raise PublishError(f"{src}: {src.name!r} is not a name a version can hold (letters, digits, '._-')")
    size = src.stat().st_size
    return SourcePlan(shards=[SourceShard(src.name, src, size, shard_header(src))])


def _skip_reason(entry: Path) -> str | None:
    """Why a directory entry is not published, or None to keep it."""
    name = entry.name
    if name.startswith("."):
        return "hidden file"
    if entry.is_symlink() and not entry.exists():
        return "broken symlink"
    if entry.is_dir():
        return "sub-directory (a version holds top-level files only)"
    if not entry.is_file():
        return "not a regular file"
    if name == MANIFEST_NAME:
        return "publish writes the version's own manifest.json"
    lowered = name.lower()
    if lowered.endswith(OTHER_WEIGHT_SUFFIXES):
        return "weights in another format (publish takes safetensors only)"
    if lowered.endswith(".index.json") and not lowered.endswith(INDEX_SUFFIX):
        return "index of weights in another format"
    if not is_valid_file_name(name):
        return "name not allowed in a version (letters, digits, '.', '_', '-'; no '..')"
    return None


def plan_directory(src: Path) -> SourcePlan:
    plan = SourcePlan()
    candidates: list[Path] = []
    for entry in sorted(src.iterdir()):
        if entry.name.endswith(".safetensors") and not entry.name.startswith("."):
            if not is_valid_file_name(entry.name):
                raise PublishError(f"{entry}: a shard name a version cannot hold (letters, digits, '._-')")
            if not entry.is_file():
                raise PublishError(f"{entry}: not a regular file")
            candidates.append(entry)
            continue
        reason = _skip_reason(entry)
        if reason:
            plan.warnings.append(f"skipped {entry.name}: {reason}")
        else:
            plan.extras.append(SourceFile(entry.name, entry, entry.stat().st_size))
    indexes = [f for f in plan.extras if f.name.endswith(INDEX_SUFFIX)]
    if len(indexes) > 1:
        names = ", ".join(f.name for f in indexes)
        raise PublishError(f"{src}: several safetensors indexes ({names}); publish one variant per version")
    if indexes:
        plan.index = indexes[0].name
        named = _index_shards(indexes[0].path, src)
        for path in candidates:
            if path.name not in named:
                plan.warnings.append(f"skipped {path.name}: not named by {plan.index}")
        candidates = [src / name for name in sorted(named)]
    if not candidates:
        others = [w.split(":")[0].removeprefix("skipped ") for w in plan.warnings if "another format" in w]
        hint = f" (found {', '.join(others[:3])}: convert to safetensors first)" if others else ""
        raise PublishError(f"{src}: no weights to publish, no *.safetensors files{hint}")
    plan.shards = [SourceShard(p.name, p, p.stat().st_size, shard_header(p)) for p in candidates]
    _check_unique(plan.shards)
    if indexes:
        _check_index(indexes[0].path, plan)
    return plan


def _load_index(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PublishError(f"{path}: not JSON ({exc})") from None
    weight_map = doc.get("weight_map") if isinstance(doc, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise PublishError(f"{path}: weight_map must be an object of tensor name -> shard file name")
    index: dict[str, Any] = doc
    return index


def _index_shards(path: Path, src: Path) -> set[str]:
    named = set(_load_index(path)["weight_map"].values())
    for name in sorted(named):
        if not is_valid_file_name(name) or not name.endswith(".safetensors"):
            raise PublishError(f"{path}: names shard {name!r}, not a top-level *.safetensors file name")
        shard = src / name
        if not shard.is_file():
            raise PublishError(f"{path}: names shard {name}, which is missing from {src}")
    return named


def _check_unique(shards: list[SourceShard]) -> None:
    """A tensor is in one shard; in a sharded_state checkpoint, in one shard per rank (the ranks'
    files repeat parameter names), a shard without a rank counting for every rank."""
    every: dict[str, str] = {}  # tensor -> shard, for shards without a rank
    by_rank: dict[int, dict[str, str]] = {}
    for shard in shards:
        rank = shard_rank(shard.name)
        for t in shard.tensors:
            if rank is None:
                other = every.get(t.name) or next((m[t.name] for m in by_rank.values() if t.name in m), None)
                every.setdefault(t.name, shard.name)
            else:
                mine = by_rank.setdefault(rank, {})
                other = mine.get(t.name) or every.get(t.name)
                mine.setdefault(t.name, shard.name)
            if other is not None and other != shard.name:
                raise PublishError(
                    f"{shard.path}: tensor {t.name!r} is in more than one shard ({other} and {shard.name})"
                )


def _check_index(path: Path, plan: SourcePlan) -> None:
    doc = _load_index(path)
    weight_map: dict[str, str] = doc["weight_map"]
    held = {t.name: s.name for s in plan.shards for t in s.tensors}
    for tensor, shard in sorted(weight_map.items()):
        actual = held.get(tensor)
        if actual != shard:
            where = f"it is in {actual}" if actual else "no shard it names holds it"
            raise PublishError(f"{path}: maps tensor {tensor!r} to {shard}, but {where}")
    for tensor, shard in sorted(held.items()):
        if tensor not in weight_map:
            raise PublishError(f"{path}: does not list tensor {tensor!r}, which {shard} holds")
    metadata = doc.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    if total is not None and total != plan.tensor_bytes:
        plan.warnings.append(
            f"{path.name}: metadata.total_size is {total}, the shards hold {plan.tensor_bytes} tensor "
            "bytes (kept as is: loaders do not use it)"
        )


def generated_index(shards: list[tuple[str, tuple[StoredTensor, ...]]]) -> bytes:
    """An HF index for shards that came without one (HF's own layout: indent 2, sorted)."""
    weight_map = {t.name: name for name, tensors in shards for t in tensors}
    total = sum(t.nbytes for _, tensors in shards for t in tensors)
    doc = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()
