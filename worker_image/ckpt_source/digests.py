"""The hashers behind a manifest's digests, for the publisher that writes them and the agent that
checks bytes against them: one place that knows which library computes which name.

Each hasher's `update` releases the GIL on large inputs (xxhash, hashlib, blake3), so threads
hashing different tensors run on different cores.
"""

from __future__ import annotations

import hashlib
from typing import Protocol

import blake3
import xxhash

from ckpt_api.manifest import StrongAlgorithm


class Hasher(Protocol):
    def update(self, data: memoryview, /) -> object: ...

    def hexdigest(self) -> str: ...


def xxh3_hasher() -> Hasher:
    return xxhash.xxh3_128()


def strong_hasher(algorithm: StrongAlgorithm) -> Hasher:
    """A fresh hasher for a manifest's cryptographic digest (`ckpt_api.manifest.StrongDigest`)."""
    if algorithm == "blake3":
        return blake3.blake3()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")
