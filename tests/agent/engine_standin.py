"""What the SGLang and vLLM stand-ins share: model weights that really load from a directory's
*.safetensors, tensor by tensor, remembering where each tensor came from, so a test can tell a
consistent model from a mixed one; faults injected per load attempt; and a server that dies."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from aiohttp import web
from safetensors.numpy import load_file

UNINITIALISED = "<uninitialised>"  # a tensor an interrupted reload left without values


class InjectedFault(RuntimeError):
    pass


def weight_files(path: str, unmounted: tuple[str, ...] = ()) -> list[Path]:
    """The directory's safetensors files, as a loader resolves them (errors like a loader's).
    Paths under `unmounted` do not exist in the engine's container."""
    root = Path(path)
    if path.startswith(unmounted) or not root.is_dir():
        raise FileNotFoundError(f"{path} is not a directory")
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"Cannot find any model weights with {path}")
    return files


def iter_tensors(files: list[Path]) -> Iterator[tuple[str, np.ndarray]]:
    for f in files:
        yield from sorted(load_file(str(f)).items())


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
