"""What the SGLang and vLLM stand-ins share: model weights that really load from a directory's
*.safetensors, tensor by tensor, remembering where each tensor came from, so a test can tell a
consistent model from a mixed one; faults injected per load attempt; a server that dies; and
what a generation answers (`Generator`, the FastDeploy stand-in's too).

Files are picked as both engines' loaders pick them (vLLM's and SGLang's
`filter_duplicate_safetensors_files`: every *.safetensors, or, when the directory has a
`model.safetensors.index.json`, only the shards its weight map names) and read with the
safetensors library's own parser, raw bytes for every dtype (numpy has no bf16/fp8). A stand-in
started with `model_dir=True` also refuses a directory it could not boot from, which is what a
staged version must be: config.json parsing to an object (the model config both engines read at
start-up through transformers), and for sharded weights an index that names every shard and
maps every tensor to the shard holding it (transformers loads sharded weights only through it).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from aiohttp import web
from safetensors import deserialize, safe_open

from ckpt_source.dtypes import PACKED, numpy_dtype

UNINITIALISED = "<uninitialised>"  # a tensor an interrupted reload left without values


class InjectedFault(RuntimeError):
    pass


INDEX_NAME = "model.safetensors.index.json"


def weight_files(path: str, unmounted: tuple[str, ...] = (), *, model_dir: bool = False) -> list[Path]:
    """The directory's safetensors files, as a loader resolves them (errors like a loader's).
    Paths under `unmounted` do not exist in the engine's container. `model_dir`: also refuse a
    directory that is not a bootable model directory (see the module docstring)."""
    root = Path(path)
    if path.startswith(unmounted) or not root.is_dir():
        raise FileNotFoundError(f"{path} is not a directory")
    every = sorted(root.glob("*.safetensors"))
    files = every
    index = root / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_bytes())["weight_map"]
        named = {root / shard for shard in weight_map.values()}
        files = [f for f in every if f in named]
    if not files:
        raise FileNotFoundError(f"Cannot find any model weights with {path}")
    if model_dir:
        check_model_directory(root, every)
    return files


def check_model_directory(root: Path, shards: list[Path]) -> None:
    config = root / "config.json"
    if not config.is_file():
        raise OSError(f"{root} does not appear to have a file named config.json")
    if not isinstance(json.loads(config.read_bytes()), dict):
        raise ValueError(f"{config} is not a JSON object")
    index = root / INDEX_NAME
    if len(shards) > 1 and not index.is_file():
        raise OSError(f"{root} holds {len(shards)} safetensors shards and no {INDEX_NAME}")
    if not index.is_file():
        return
    weight_map: dict[str, str] = json.loads(index.read_bytes())["weight_map"]
    held: dict[str, str] = {}
    for shard in shards:
        with safe_open(str(shard), "numpy") as f:
            held.update(dict.fromkeys(f.keys(), shard.name))
    wrong = sorted(name for name, shard in weight_map.items() if held.get(name) != shard)
    unindexed = sorted(set(held) - set(weight_map))
    if wrong or unindexed:
        raise ValueError(
            f"{INDEX_NAME} does not match the shards: mapped elsewhere or missing {wrong[:4]}, "
            f"not in the index {unindexed[:4]}"
        )


def _array(dtype: str, shape: list[int], data: bytes | bytearray) -> np.ndarray:
    """The tensor's bytes in a numpy array of the same width (raw bits for bf16/fp8)."""
    array = np.frombuffer(bytes(data), dtype=numpy_dtype(dtype))
    return array if dtype in PACKED else array.reshape(shape)


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, np.ndarray]]:
    for f in files:
        tensors: list[tuple[str, dict[str, Any]]] = deserialize(f.read_bytes())  # type: ignore[no-untyped-call]
        for name, info in sorted(tensors, key=lambda item: item[0]):
            yield name, _array(info["dtype"], info["shape"], info["data"])


class ModelWeights:
    """The engine's parameters, each with the path it was last loaded from."""

    def __init__(self, boot_path: str, boot_dir: Path | None) -> None:
        self.tensors: dict[str, np.ndarray | None] = {}
        self.origin: dict[str, str] = {}
        if boot_dir is not None:
            for name, value in iter_tensors(weight_files(str(boot_dir))):
                self.tensors[name], self.origin[name] = value, boot_path
        # Per load attempt (an engine's own retry counts): fail after this many tensors; None
        # lets the attempt through. Attempts beyond the queue succeed.
        self.faults: deque[int | None] = deque()
        self.attempts = 0

    def load(self, path: str, tensors: Iterator[tuple[str, np.ndarray]]) -> None:
        """Write tensors as they come; an injected fault stops part way, leaving a mix."""
        self.attempts += 1
        limit = self.faults.popleft() if self.faults else None
        for written, (name, value) in enumerate(tensors):
            if limit is not None and written == limit:
                raise InjectedFault(f"injected fault after {limit} tensors of {path}")
            self.tensors[name], self.origin[name] = value, path
        if limit is not None:
            raise InjectedFault(f"injected fault at the end of {path}")

    def sources(self) -> frozenset[str]:
        """Where the current values came from: one path for a consistent model."""
        return frozenset(self.origin.values())

    def values(self) -> dict[str, np.ndarray]:
        return {k: v for k, v in self.tensors.items() if v is not None}


def drop_connection(request: web.Request) -> web.Response:
    """What a client of a crashed server sees: the connection closes with no answer."""
    assert request.transport is not None
    request.transport.close()
    return web.Response()


# What a generation's reply may be made to look like: nothing generated, cut off before it
# finished (an abort), or no answer at all (a hung engine, found by the caller's timeout).
GenerationFault = Literal["empty", "unfinished", "hang"]
# A healthy model's greedy continuation of any prompt, one word a token.
ANSWER = (" Paris", ".", " It", " is", " the", " capital", " and", " largest", " city", " of", " France", ".")


def holds_nan(weights: ModelWeights) -> bool:
    """A float parameter holds NaN: the logits are NaN, nothing sensible decodes from them."""
    return any(v.dtype.kind == "f" and bool(np.isnan(v).any()) for v in weights.values().values())


@dataclass
class Generator:
    """A greedy generation as the engines' servers answer one: `max_tokens` tokens of ANSWER,
    finished "length" when the budget cut it and "stop" at its end. Weights holding NaN give
    empty text (every token decodes to nothing); `fault` makes a reply garbage on purpose."""

    fault: GenerationFault | None = None
    requests: list[dict[str, Any]] = field(default_factory=list)  # every generation's body
    # What a hung generation waits for: set by `release`, so the server can stop without
    # waiting out its shutdown grace for a request nobody will read.
    _released: asyncio.Event = field(default_factory=asyncio.Event)

    def release(self) -> None:
        self._released.set()

    async def generate(self, max_tokens: int, nan: bool) -> tuple[str, str, int]:
        """(text, finish reason, tokens)."""
        if self.fault == "hang":
            await self._released.wait()  # the caller's timeout ends it first
        if nan or self.fault == "empty":
            return "", "length", max_tokens
        tokens = ANSWER[:max_tokens]
        finish = "length" if max_tokens < len(ANSWER) else "stop"
        return "".join(tokens), "abort" if self.fault == "unfinished" else finish, len(tokens)
