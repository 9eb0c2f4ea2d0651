"""Pull a version's manifest and tensor bytes from a transport into caller-chosen buffers,
verifying each tensor's xxh3-128 as its bytes land.

Bytes read through an untrusted transport (`transport.is_untrusted`: a peer, which picks the
bytes it serves, or a Mooncake source, whose served memory anyone reaching its engine can write)
are always verified, and against the manifest's cryptographic digest instead (BLAKE3, or sha256
in a format 2 manifest): the manifest comes from the source, and xxh3 is not collision-resistant.
Those digests run several times slower than xxh3, so only those bytes pay for them.

Bytes are read in chunks straight into the destination buffer and hashed chunk by chunk while
still in cache, so verification costs one extra pass over hot memory rather than a second trip
through DRAM. With verification, streams that say so (`overlaps_hashing`: local files) get a
helper thread that reads the next chunks of a tensor while the caller hashes the ones that
landed: preadv and xxhash both release the GIL, so on two cores the hash hides behind the copy
instead of adding to it.
Contiguous tensors of a shard are read through one ranged stream, so small tensors cost no
request round trips.
With `check_finite`, each floating tensor is also scanned for NaN/Inf (`ckpt_agent.pipeline.finite`) in
the same pass, block by block right after the hash reads it; a hit fails the tensor only once its
checksum has matched, and before `on_tensor` (the apply, or nothing until the staged apply).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.pipeline.finite import FiniteScan, can_hold_non_finite
from ckpt_agent.transport import ByteStream, Transport, is_untrusted
from ckpt_api.manifest import ManifestDocument, StrongDigest, TensorRecord, manifest_digest
from ckpt_source.digests import Hasher, strong_hasher, xxh3_hasher

DEFAULT_CHUNK_BYTES = 4 << 20
# Gaps between tensors up to this size are read and dropped instead of opening a new range.
_MAX_SKIP = 1 << 20
# Non-weight files are held in memory whole (config, tokenizer: kilobytes to tens of MiB); a
# manifest listing a bigger one is refused rather than allocated.
MAX_EXTRA_FILE_BYTES = 1 << 30

BufferFor = Callable[[TensorRecord], memoryview]
OnTensor = Callable[[TensorRecord, memoryview], None]
# (tensor, how many of its bytes are in its buffer so far, unverified): a pipelined relay serves
# them on before the tensor is whole (its readers verify it end to end).
OnLanded = Callable[[TensorRecord, int], None]


@dataclass
class LoadProgress:
    bytes_total: int = 0
    bytes_done: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # A load that left its peer part way: why, and the bytes read until then (the peer's).
    fallback_reason: str | None = None
    bytes_before_fallback: int | None = None

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes_done += n

    def fall_back(self, reason: str) -> None:
        with self._lock:
            self.fallback_reason = reason
            self.bytes_before_fallback = self.bytes_done


@dataclass(frozen=True)
class Run:
    """Tensors of one shard read through a single ranged stream."""

    file: str
    entries: tuple[TensorRecord, ...]

    @property
    def start(self) -> int:
        return self.entries[0].offset

    @property
    def end(self) -> int:
        return self.entries[-1].end

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)


def plan_runs(
    manifest: ManifestDocument,
    *,
    max_run_bytes: int | None = None,
    only: Sequence[TensorRecord] | None = None,
) -> list[Run]:
    """Group each shard's tensors into ranged reads: contiguous (or nearly) tensors share a run;
    `max_run_bytes` splits long runs so several streams can be read in parallel. `only`: just
    these tensors (the rest of a load whose peer failed)."""
    runs: list[Run] = []
    wanted = None if only is None else {e.key for e in only}
    for file, listed in manifest.by_file.items():
        entries = listed if wanted is None else [e for e in listed if e.key in wanted]
        current: list[TensorRecord] = []
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


@dataclass(frozen=True)
class Check:
    """One digest to compare bytes against: the algorithm's name (for messages), a fresh hasher
    and the manifest's value."""

    algorithm: str
    hasher: Hasher
    expected: str

    def mismatch(self, what: str) -> str | None:
        """None when the bytes hashed match; else the message naming both digests."""
        got = self.hasher.hexdigest()
        return None if got == self.expected else f"{what}: {self.algorithm} {got} != manifest {self.expected}"


def check_for(xxh3_128: str, strong: StrongDigest | None, *, untrusted: bool, what: str) -> Check:
    """The digest bytes are checked against: the cryptographic one (BLAKE3 or sha256) for an
    untrusted transport's, xxh3-128 for the others'. Untrusted bytes without a cryptographic digest
    to check are refused (a ChecksumMismatch, so a load from a peer falls back to the source): the
    manifest predates them, and xxh3 alone cannot stop a forgery. (`pull.open_version` refuses
    such a manifest before any byte moves.)"""
    if not untrusted:
        return Check("xxh3-128", xxh3_hasher(), xxh3_128)
    if strong is None:
        raise LoadError(
            Reason.CHECKSUM_MISMATCH,
            f"{what}: the manifest gives no blake3 or sha256, which bytes from a peer or over "
            "Mooncake are checked against",
        )
    return Check(strong.algorithm, strong_hasher(strong.algorithm), strong.hexdigest)


def fetch_manifest(
    transport: Transport, version: str, *, expected_digest: str | None, max_bytes: int
) -> tuple[ManifestDocument, str]:
    """Fetch, pin-check and parse a manifest; returns it with its digest."""
    manifest, digest, _raw = fetch_manifest_raw(
        transport, version, expected_digest=expected_digest, max_bytes=max_bytes
    )
    return manifest, digest


def fetch_manifest_raw(
    transport: Transport, version: str, *, expected_digest: str | None, max_bytes: int
) -> tuple[ManifestDocument, str, bytes]:
    """`fetch_manifest`, plus the exact bytes (a relaying agent serves them as they were)."""
    raw = transport.fetch_manifest(version, max_bytes)
    digest = manifest_digest(raw)
    if expected_digest is not None and digest != expected_digest:
        raise LoadError(
            Reason.MANIFEST_DIGEST_MISMATCH,
            f"manifest of {version} has digest {digest}, the request pinned {expected_digest}",
        )
    return parse_manifest(raw, expected_version=version), digest, raw


def read_extra_files(
    transport: Transport, manifest: ManifestDocument, *, cancelled: Callable[[], bool]
) -> dict[str, bytes]:
    """Every non-weight file of the version (config, tokenizer, index...), whole, each checked
    against its xxh3-128 whatever the load asked: they are small, and an engine reads them as
    they are, so a damaged one would not show up as a wrong weight but as a broken model."""
    files: dict[str, bytes] = {}
    untrusted = is_untrusted(transport)
    for name, extra in sorted(manifest.extra_files.items()):
        _check_cancel(cancelled)
        if extra.size > MAX_EXTRA_FILE_BYTES:
            raise LoadError(
                Reason.INVALID_MANIFEST,
                f"extra file {name} of {manifest.version} is {extra.size} bytes; non-weight files are "
                f"held in memory, up to {MAX_EXTRA_FILE_BYTES} bytes each",
            )
        buf = bytearray(extra.size)
        stream = transport.open_range(manifest.version, name, 0, extra.size)
        try:
            stream.readinto(memoryview(buf))
        finally:
            stream.close()
        what = f"extra file {name} of {manifest.version}"
        check = check_for(extra.xxh3_128, extra.strong_digest, untrusted=untrusted, what=what)
        check.hasher.update(memoryview(buf))
        mismatch = check.mismatch(what)
        if mismatch is not None:
            raise LoadError(Reason.CHECKSUM_MISMATCH, mismatch)
        files[name] = bytes(buf)
    return files


# What a load stopped at a cancel check says; the agent puts its own reason in its place when it
# stopped the load for another (its deadline, POST /v1/cancel_load).
CANCELLED_MESSAGE = "load cancelled: the agent is shutting down"


def _check_cancel(cancelled: Callable[[], bool]) -> None:
    if cancelled():
        raise LoadError(Reason.CANCELLED, CANCELLED_MESSAGE)


def _skip(stream: ByteStream, nbytes: int, scratch: bytearray) -> None:
    view = memoryview(scratch)
    while nbytes:
        step = min(nbytes, len(scratch))
        stream.readinto(view[:step])
        nbytes -= step


# Below this many bytes a tensor is read and hashed inline: handing chunks to the read-ahead
# thread costs tens of microseconds each, more than overlapping saves on small pieces.
_MIN_PIPELINED_BYTES = 2 << 20
_MIN_PIECE_BYTES = 1 << 20
# Pieces of a load that relays as it lands: each hop of a chain starts sending a tensor after
# this many bytes of it (~10 ms at 200 Mbit/s), not after the whole of it.
_RELAY_PIECE_BYTES = 256 << 10


def _pieces(buf: memoryview, step: int) -> list[memoryview]:
    return [buf[pos : pos + step] for pos in range(0, buf.nbytes, max(step, 1))]


class _ReadAhead:
    """Fills a tensor's pieces from the stream in a helper thread, in order, while the caller
    hashes the pieces already filled. It never reads past the tensor: the next tensor's buffer
    may be this one again (streamed mode), still to be applied. One per stream (reads of one
    stream are sequential); `close` joins the thread."""

    def __init__(self, stream: ByteStream) -> None:
        self._stream = stream
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-readahead")

    def read(
        self, pieces: list[memoryview], cancelled: Callable[[], bool]
    ) -> Generator[memoryview, None, None]:
        """Yields each piece once its bytes are in; raises what the read raised."""
        cond = threading.Condition()
        landed = 0
        failure: BaseException | None = None
        stop = threading.Event()

        def fill() -> None:
            nonlocal landed, failure
            try:
                for piece in pieces:
                    if stop.is_set() or cancelled():
                        return
                    self._stream.readinto(piece)
                    with cond:
                        landed += 1
                        cond.notify()
            except BaseException as exc:
                with cond:
                    failure = exc
                    cond.notify()

        future = self._pool.submit(fill)
        try:
            for k, piece in enumerate(pieces):
                with cond:
                    while landed <= k and failure is None:
                        _check_cancel(cancelled)
                        cond.wait(0.5)
                    if landed <= k:
                        assert failure is not None
                        raise failure
                yield piece
        finally:
            # Whatever happened, the buffer is not ours again until the thread stops writing it.
            stop.set()
            future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)


def _inspect(piece: memoryview, hasher: Hasher | None, scan: FiniteScan | None) -> None:
    if scan is None:
        if hasher is not None:
            hasher.update(piece)
        return
    # One pass: the scan takes each block right after the hash pulled it into cache.
    scan.update(piece, None if hasher is None else hasher.update)


def _read_tensor(
    stream: ByteStream,
    entry: TensorRecord,
    buf: memoryview,
    *,
    verify: bool,
    check_finite: bool,
    chunk_bytes: int,
    progress: LoadProgress,
    cancelled: Callable[[], bool],
    ahead: Callable[[], _ReadAhead],
    untrusted: bool = False,
    on_landed: OnLanded | None = None,
) -> None:
    what = f"tensor {entry.name!r} in {entry.file}"
    checked = verify or untrusted
    check = None
    if checked:
        check = check_for(entry.xxh3_128, entry.strong_digest, untrusted=untrusted, what=what)
    hasher = None if check is None else check.hasher
    scan = FiniteScan(entry.dtype) if check_finite and can_hold_non_finite(entry.dtype) else None
    # Transports that move bytes in their own threads (Mooncake) go fastest when handed a whole
    # tensor at once: they split it into slices transferred in parallel; hashing then makes one
    # more pass over memory instead of interleaving with round trips.
    whole = getattr(stream, "prefers_whole_tensors", False)
    ahead_ok = getattr(stream, "overlaps_hashing", False)
    inspect = hasher is not None or scan is not None
    # Relayed on as it lands: smaller pieces, each handed on before it is hashed.
    most = chunk_bytes if on_landed is None else min(chunk_bytes, _RELAY_PIECE_BYTES)
    done = 0
    if inspect and ahead_ok and entry.nbytes >= _MIN_PIPELINED_BYTES:
        # At least two pieces, so that something overlaps even in a tensor of one chunk.
        step = most if on_landed is not None else min(chunk_bytes, max(entry.nbytes // 2, _MIN_PIECE_BYTES))
        # closing: however this loop ends, the helper has stopped writing `buf` when it does.
        with contextlib.closing(ahead().read(_pieces(buf, step), cancelled)) as landed:
            for piece in landed:
                done += piece.nbytes
                if on_landed is not None:
                    on_landed(entry, done)
                _inspect(piece, hasher, scan)
                progress.add(piece.nbytes)
    else:
        # Streams that copy bytes in part by part (Mooncake's bounce buffer) let the hash run on
        # each part as it lands, while the next is in flight.
        read_landed = getattr(stream, "readinto_landed", None) if inspect else None
        for piece in _pieces(buf, entry.nbytes if whole else most):
            _check_cancel(cancelled)
            if read_landed is not None:
                read_landed(piece, lambda part: _inspect(part, hasher, scan))
            else:
                stream.readinto(piece)
            done += piece.nbytes
            if on_landed is not None:
                on_landed(entry, done)
            if read_landed is None:
                _inspect(piece, hasher, scan)
            progress.add(piece.nbytes)
    mismatch = None if check is None else check.mismatch(what)
    if mismatch is not None:
        raise LoadError(Reason.CHECKSUM_MISMATCH, mismatch, tensor=entry.name)
    # After the checksum: damaged bytes are a ChecksumMismatch, whatever they decode to.
    if scan is not None and scan.found is not None:
        raise LoadError(
            Reason.NON_FINITE_TENSOR,
            f"tensor {entry.name!r} ({entry.dtype}) holds {scan.found.describe()}",
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
    check_finite: bool = False,
    on_landed: OnLanded | None = None,
) -> None:
    stream = transport.open_range(version, run.file, run.start, run.end)
    helper: _ReadAhead | None = None
    untrusted = is_untrusted(transport)

    def ahead() -> _ReadAhead:
        nonlocal helper
        if helper is None:
            helper = _ReadAhead(stream)
        return helper

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
                check_finite=check_finite,
                chunk_bytes=chunk_bytes,
                progress=progress,
                cancelled=cancelled,
                ahead=ahead,
                untrusted=untrusted,
                on_landed=on_landed,
            )
            on_tensor(entry, buf)
            cursor = entry.end
    finally:
        if helper is not None:
            helper.close()
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
    check_finite: bool = False,
    on_landed: OnLanded | None = None,
) -> None:
    """Read every run; with parallelism > 1, runs are read concurrently (buffers must not alias
    and `on_tensor` must be thread-safe). The first failure stops the others and is raised.
    `check_finite`: a floating tensor holding NaN/Inf fails (NonFiniteTensor) before
    `on_tensor` sees it. `on_landed` (thread-safe too): each piece's bytes as they land,
    before the tensor is verified."""
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
                check_finite=check_finite,
                on_landed=on_landed,
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
                check_finite=check_finite,
                on_landed=on_landed,
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
