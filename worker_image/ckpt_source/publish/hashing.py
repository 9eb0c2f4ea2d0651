"""xxh3-128 and a cryptographic digest (BLAKE3, or sha256 for format 2) of every tensor and every
other file of a version, on all cores.

Both digests come from one pass: each block is hashed by xxh3 and then by the strong digest while
it is still in cache, so the strong digest costs its own compute (BLAKE3 ~5x xxh3's here, sha256
~13x) but no second read of the version. The hashers release the GIL while they hash, so threads
scale. Files are
memory-mapped and hashed in place: reading them into buffers first costs a copy, measured at half
the rate here. A mapped file that shrinks under us kills the process with SIGBUS, which is one
more reason a source must not change while it is published (see `placing`).

Small tensors are grouped into jobs of about `_JOB_BYTES` so 100k-tensor checkpoints do not pay
a thread hand-off per tensor; a big tensor is one job (a hash cannot be split), hashed in steps
so progress moves.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from ckpt_api.manifest import StrongAlgorithm, StrongDigest
from ckpt_source.digests import strong_hasher, xxh3_hasher

_JOB_BYTES = 64 << 20
_STEP = 64 << 20
# Small enough that the bytes xxh3 just read are still in cache for the strong digest.
_BLOCK = 1 << 20
MAX_THREADS = 16


@dataclass(frozen=True)
class Digests:
    xxh3_128: str
    strong: StrongDigest | None


@dataclass(frozen=True)
class Span:
    """Bytes to hash: `nbytes` from `offset` in `file` (a whole extra file is one span)."""

    file: str
    offset: int
    nbytes: int


def default_threads() -> int:
    return max(1, min(MAX_THREADS, len(os.sched_getaffinity(0))))


def _jobs(spans: Sequence[Span]) -> Iterator[list[int]]:
    job: list[int] = []
    size = 0
    for i, span in enumerate(spans):
        if job and (spans[job[0]].file != span.file or size + span.nbytes > _JOB_BYTES):
            yield job
            job, size = [], 0
        job.append(i)
        size += span.nbytes
    if job:
        yield job


def hash_spans(
    directory: Path,
    spans: Sequence[Span],
    *,
    threads: int,
    advance: Callable[[int], None],
    file_done: Callable[[str], None],
    strong: StrongAlgorithm | None = "blake3",
) -> list[Digests]:
    """The digests of each span, in order (`strong=None`: xxh3-128 only). `advance(n)` is called
    from the worker threads as bytes are hashed; `file_done(name)` once every span of a file is."""
    digests = [Digests("", None)] * len(spans)
    remaining: dict[str, int] = {}
    for span in spans:
        remaining[span.file] = remaining.get(span.file, 0) + 1
    with ExitStack() as stack:
        maps: dict[str, mmap.mmap | None] = {}
        for name in remaining:
            path = directory / name
            with path.open("rb") as f:
                size = os.fstat(f.fileno()).st_size
                # mmap cannot map an empty file; an empty file's spans are all empty.
                maps[name] = (
                    stack.enter_context(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)) if size else None
                )
            mapped = maps[name]
            if mapped is not None:
                mapped.madvise(mmap.MADV_SEQUENTIAL)

        def run(job: list[int]) -> list[tuple[int, Digests]]:
            out = []
            mapped = maps[spans[job[0]].file]
            for i in job:
                out.append((i, _hash(mapped, spans[i], advance, strong)))
            return out

        with ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="publish-hash") as pool:
            for done in pool.map(run, _jobs(spans)):
                for i, digest in done:
                    digests[i] = digest
                    name = spans[i].file
                    remaining[name] -= 1
                    if remaining[name] == 0:
                        file_done(name)
    return digests


def _hash(
    mapped: mmap.mmap | None, span: Span, advance: Callable[[int], None], algorithm: StrongAlgorithm | None
) -> Digests:
    hasher = xxh3_hasher()
    strong = None if algorithm is None else strong_hasher(algorithm)

    def digests() -> Digests:
        if algorithm is None or strong is None:
            return Digests(hasher.hexdigest(), None)
        return Digests(hasher.hexdigest(), StrongDigest(algorithm, strong.hexdigest()))

    if mapped is None or span.nbytes == 0:
        return digests()
    if span.offset + span.nbytes > len(mapped):
        raise ValueError(f"{span.file}: bytes {span.offset}..{span.offset + span.nbytes} past its end")
    # Slices of the mapping must be released before it is closed, so each lives in a `with`.
    with memoryview(mapped) as whole:
        pos, end = span.offset, span.offset + span.nbytes
        while pos < end:
            step = min(_STEP, end - pos)
            for lo in range(pos, pos + step, _BLOCK):
                with whole[lo : min(pos + step, lo + _BLOCK)] as part:
                    hasher.update(part)
                    if strong is not None:
                        strong.update(part)
            advance(step)
            pos += step
    return digests()
