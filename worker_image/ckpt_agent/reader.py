"""Pull a version's manifest and tensor bytes from a transport into caller-chosen buffers,
verifying each tensor's xxh3-128 as its bytes land.

Bytes are read in chunks straight into the destination buffer and hashed chunk by chunk while
still in cache, so verification costs one extra pass over hot memory rather than a second trip
through DRAM. Contiguous tensors of a shard are read through one ranged stream, so small tensors
cost no request round trips.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import xxhash

from ckpt_agent.errors import LoadError, Reason
from ckpt_agent.manifest import Manifest, TensorEntry, manifest_digest, parse_manifest
from ckpt_agent.transport import ByteStream, Transport

DEFAULT_CHUNK_BYTES = 4 << 20
# Gaps between tensors up to this size are read and dropped instead of opening a new range.
_MAX_SKIP = 1 << 20

BufferFor = Callable[[TensorEntry], memoryview]
OnTensor = Callable[[TensorEntry, memoryview], None]


@dataclass
class LoadProgress:
    bytes_total: int = 0
    bytes_done: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes_done += n


@dataclass(frozen=True)
class Run:
    """Tensors of one shard read through a single ranged stream."""

    file: str
    entries: tuple[TensorEntry, ...]

    @property
    def start(self) -> int:
        return self.entries[0].offset

    @property
    def end(self) -> int:
        return self.entries[-1].end

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)


def plan_runs(manifest: Manifest, *, max_run_bytes: int | None = None) -> list[Run]:
    """Group each shard's tensors into ranged reads: contiguous (or nearly) tensors share a run;
    `max_run_bytes` splits long runs so several streams can be read in parallel."""
    runs: list[Run] = []
    for file, entries in manifest.by_file.items():
        current: list[TensorEntry] = []
        size = 0
        for entry in entries:
            gap_too_big = bool(current) and entry.offset - current[-1].end > _MAX_SKIP
            full = max_run_bytes is not None and bool(current) and size + entry.nbytes > max_run_bytes
            if gap_too_big or full:
                runs.append(Run(file, tuple(current)))
                current, size = [], 0
            current.append(entry)
            size += entry.nbytes
        if current:
            runs.append(Run(file, tuple(current)))
    return runs


def fetch_manifest(
    transport: Transport, version: str, *, expected_digest: str | None, max_bytes: int
) -> tuple[Manifest, str]:
    """Fetch, pin-check and parse a manifest; returns it with its digest."""
    manifest, digest, _raw = fetch_manifest_raw(
        transport, version, expected_digest=expected_digest, max_bytes=max_bytes
    )
    return manifest, digest


def fetch_manifest_raw(
    transport: Transport, version: str, *, expected_digest: str | None, max_bytes: int
) -> tuple[Manifest, str, bytes]:
    """`fetch_manifest`, plus the exact bytes (a relaying agent serves them as they were)."""
    raw = transport.fetch_manifest(version, max_bytes)
    digest = manifest_digest(raw)
    if expected_digest is not None and digest != expected_digest:
        raise LoadError(
            Reason.MANIFEST_DIGEST_MISMATCH,
            f"manifest of {version} has digest {digest}, the request pinned {expected_digest}",
        )
    return parse_manifest(raw, expected_version=version), digest, raw


def _check_cancel(cancelled: Callable[[], bool]) -> None:
    if cancelled():
        raise LoadError(Reason.CANCELLED, "load cancelled: the agent is shutting down")


def _skip(stream: ByteStream, nbytes: int, scratch: bytearray) -> None:
    view = memoryview(scratch)
    while nbytes:
        step = min(nbytes, len(scratch))
        stream.readinto(view[:step])
        nbytes -= step


def _read_tensor(
    stream: ByteStream,
    entry: TensorEntry,
    buf: memoryview,
    *,
    verify: bool,
    chunk_bytes: int,
    progress: LoadProgress,
    cancelled: Callable[[], bool],
) -> None:
    # Hashing runs inline, chunk by chunk, while the chunk is still in cache. A helper thread
    # buys nothing here: xxhash holds the GIL, and even a GIL-free hash thread measured no
    # better on 2 cores (memory bandwidth, not CPU, is what the copy and the hash share).
    hasher = xxhash.xxh3_128() if verify else None
    # Transports that move bytes in their own threads (Mooncake) go fastest when handed a whole
    # tensor at once: they split it into slices transferred in parallel; hashing then makes one
    # more pass over memory instead of interleaving with round trips.
    step = entry.nbytes if getattr(stream, "prefers_whole_tensors", False) else chunk_bytes
    for pos in range(0, entry.nbytes, max(step, 1)):
        _check_cancel(cancelled)
        piece = buf[pos : pos + step]
        stream.readinto(piece)
        if hasher is not None:
            hasher.update(piece)
        progress.add(piece.nbytes)
    if hasher is not None and hasher.hexdigest() != entry.xxh3_128:
        raise LoadError(
            Reason.CHECKSUM_MISMATCH,
            f"tensor {entry.name!r} in {entry.file}: xxh3-128 {hasher.hexdigest()} "
            f"!= manifest {entry.xxh3_128}",
            tensor=entry.name,
        )


def read_run(
    transport: Transport,
    version: str,
    run: Run,
    *,
    buffer_for: BufferFor,
    on_tensor: OnTensor,
    verify: bool,
    progress: LoadProgress,
    cancelled: Callable[[], bool],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
) -> None:
    stream = transport.open_range(version, run.file, run.start, run.end)
    try:
        scratch = bytearray()
        cursor = run.start
        for entry in run.entries:
            if entry.offset > cursor:
                scratch = scratch or bytearray(min(_MAX_SKIP, chunk_bytes))
                _skip(stream, entry.offset - cursor, scratch)
            buf = buffer_for(entry)
            _read_tensor(
                stream,
                entry,
                buf,
                verify=verify,
                chunk_bytes=chunk_bytes,
                progress=progress,
                cancelled=cancelled,
            )
            on_tensor(entry, buf)
            cursor = entry.end
    finally:
        stream.close()


def read_runs(
    transport: Transport,
    version: str,
    runs: Sequence[Run],
    *,
    buffer_for: BufferFor,
    on_tensor: OnTensor,
    verify: bool,
    progress: LoadProgress,
    cancelled: Callable[[], bool],
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    parallelism: int = 1,
) -> None:
    """Read every run; with parallelism > 1, runs are read concurrently (buffers must not alias
    and `on_tensor` must be thread-safe). The first failure stops the others and is raised."""
    if parallelism <= 1 or len(runs) <= 1:
        for run in runs:
            read_run(
                transport,
                version,
                run,
                buffer_for=buffer_for,
                on_tensor=on_tensor,
                verify=verify,
                progress=progress,
                cancelled=cancelled,
                chunk_bytes=chunk_bytes,
            )
        return
    stop = threading.Event()

    def worker(run: Run) -> None:
        if stop.is_set() or cancelled():
            return
        try:
            read_run(
                transport,
                version,
                run,
                buffer_for=buffer_for,
                on_tensor=on_tensor,
                verify=verify,
                progress=progress,
                cancelled=lambda: stop.is_set() or cancelled(),
                chunk_bytes=chunk_bytes,
            )
        except BaseException:
            stop.set()
            raise

    with ThreadPoolExecutor(max_workers=parallelism, thread_name_prefix="ckpt-read") as pool:
        futures = [pool.submit(worker, run) for run in runs]
    errors = [f.exception() for f in futures if f.exception() is not None]
    # Report the root cause, not the Cancelled that other readers raised after it.
    errors.sort(key=lambda e: isinstance(e, LoadError) and e.reason == Reason.CANCELLED)
    if errors:
        raise errors[0]  # type: ignore[misc]
    _check_cancel(cancelled)
