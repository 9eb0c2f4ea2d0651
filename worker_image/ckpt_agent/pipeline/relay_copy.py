"""The copy of the live version an agent can relay, and how it is read back.

Which bytes a peer serves (decided per apply mode):
- staged (default) and disk-staging engines: the staging copy of the load, kept after
  the apply until the next load changes the weights, so also through a load that fails
  before it does (host RAM or the staging directory; served over http, and host RAM over
  mooncake too, from a mirror: `pipeline.relay_export`);
- streamed: re-read from the live parameters, tensor by tensor (http only: no staging copy to
  mirror). A tensor that changed since the load (a new load began) is refused.
Readers verify everything anyway; these rules keep an honest peer from serving torn data.

A staged load asked to relay while it loads (`relayWhileLoading`, pipelined relay) publishes its
copy before the first tensor arrives. Over http a tensor's bytes are served as they land, before
the load verified the tensor: each hop of a chain then adds the time of a piece, not of a whole
tensor, and every reader verifies each tensor end to end anyway (bytes from a peer always are);
a tensor that fails here fails or re-reads this load, and the reader then fails its own check.
What a Mooncake mirror or `?ready=` hands out is only what the load verified (a Mooncake reader
reads registered memory it cannot tell in flight from torn). A reader of bytes not there yet
waits for them (`NotReady`), and a failed load's copy is released.
The version's non-weight files (config, tokenizer, index) are small and kept in memory with the
copy, verified, whatever the apply mode: a peer serves them as it received them.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial

from ckpt_agent.pipeline.staging import StagingArea, TensorStore
from ckpt_api.manifest import ManifestDocument, TensorRecord

ReadTensor = Callable[[TensorRecord], memoryview]


class RelayGone(Exception):
    """The copy can no longer be served (released, or the live weights changed)."""


_PIECE = 1 << 20


@dataclass(frozen=True)
class NotReady:
    """What `iter_range` yields for bytes the load has not verified yet: wait until `ready()`,
    then go on."""

    ready: Callable[[], bool]


class RelayCopy:
    def __init__(
        self,
        manifest_raw: bytes,
        manifest: ManifestDocument,
        read_tensor: ReadTensor,
        *,
        store: TensorStore | None = None,
        source: str = "staging",
        extra_files: Mapping[str, bytes] | None = None,
    ) -> None:
        self.manifest_raw = manifest_raw
        self.manifest = manifest
        self.version = manifest.version
        self.store = store  # what a Mooncake export mirrors, if any (never registered itself)
        # Pieces are views of host memory, taken without blocking: the http stream slices them on
        # its event loop instead of handing each piece to a thread (a live-parameter read takes
        # the engine's lock; a staging directory's pages may have to come from disk).
        self.in_memory = isinstance(store, StagingArea)
        self.source = source
        self.extra_files: Mapping[str, bytes] = dict(extra_files or {})
        self._read_tensor = read_tensor
        self._offsets = {f: [e.offset for e in es] for f, es in manifest.by_file.items()}
        self._lock = threading.Lock()
        self._on_release: list[Callable[[], None]] = []
        self.released = False
        # Copies a Mooncake export keeps (pipeline.relay_export), each fed every verified tensor;
        # held across a copy, so a tensor is in every mirror before any reader learns it is ready.
        self._mirrors: list[Callable[[TensorRecord], None]] = []
        self._mirror_lock = threading.Lock()
        # Pipelined relay: the tensors verified so far, and how waiting readers learn of more.
        self.complete = True
        self.extras_ready = True
        self._ready: set[tuple[str, str]] = set()  # TensorRecord.key
        # Bytes of a tensor in the copy so far, before its verification (pipelined http relay).
        self._landed: dict[tuple[str, str], int] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Future[None] | None = None

    @classmethod
    def in_progress(
        cls,
        manifest_raw: bytes,
        manifest: ManifestDocument,
        store: TensorStore,
        loop: asyncio.AbstractEventLoop,
    ) -> RelayCopy:
        """The copy of a load still running: its non-weight files are served once
        `set_extra_files` gives them, tensors as `mark_ready` adds them."""
        copy = cls.from_store(manifest_raw, manifest, store)
        copy.complete = False
        copy.extras_ready = False
        copy._loop = loop
        return copy

    def set_extra_files(self, files: Mapping[str, bytes]) -> None:
        """The load verified the version's non-weight files."""
        self.extra_files = dict(files)
        self.extras_ready = True
        self._wake()

    def mark_ready(self, entry: TensorRecord) -> None:
        """The load verified `entry` (any thread)."""
        with self._mirror_lock:
            for mirror in self._mirrors:
                mirror(entry)
            with self._lock:
                self._ready.add(entry.key)
        self._wake()

    def mark_landed(self, entry: TensorRecord, nbytes: int) -> None:
        """The first `nbytes` of `entry` are in the copy, not verified yet (any thread). Lower than
        before when the load reads the tensor again (from the source, after its peer failed)."""
        with self._lock:
            self._landed[entry.key] = nbytes
        self._wake()

    def add_mirror(self, mirror: Callable[[TensorRecord], None]) -> None:
        """`mirror(entry)` now for each tensor verified so far, and for each one verified later
        before it is marked ready. Raises RelayGone once the copy is released (the store with it)."""
        with self._mirror_lock:
            if self.released:
                raise self._gone()
            for entry in self.manifest.tensors:
                if self.is_ready(entry):
                    mirror(entry)
            self._mirrors.append(mirror)

    def finish(self) -> None:
        """The load verified every tensor."""
        with self._lock:
            self.complete = True
        self._wake()

    def is_ready(self, entry: TensorRecord) -> bool:
        return self.complete or entry.key in self._ready

    def _available(self, entry: TensorRecord) -> int:
        """How many of `entry`'s bytes may be streamed: all once verified, else those landed."""
        return entry.nbytes if self.is_ready(entry) else self._landed.get(entry.key, 0)

    def ready_between(self, file: str, start: int, end: int) -> bool:
        """Whether every tensor of `file` overlapping [start, end) may be served."""
        return self.complete or all(
            e.key in self._ready
            for e in self.manifest.by_file.get(file, [])
            if e.offset < end and e.end > start
        )

    async def wait_until(self, ready: Callable[[], bool], limit_s: float) -> bool:
        """Wait (on the copy's loop) until `ready()` holds, at most `limit_s` seconds; whether it
        does. Raises RelayGone once the copy is released (its load failed)."""
        deadline = time.monotonic() + limit_s
        while True:
            if self.released:
                raise self._gone()
            if self._loop is None:
                return ready()
            if self._changed is None or self._changed.done():
                self._changed = self._loop.create_future()
            # Checked after the future exists: a tensor marked from now on resolves it.
            if ready():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._changed), left)

    def _has_beyond(self, entry: TensorRecord, position: int) -> bool:
        return self._available(entry) > position

    def _until(self, ready: Callable[[], bool]) -> Iterator[NotReady]:
        """`NotReady` until `ready()` holds (the reader waits in between); RelayGone if the copy is
        released meanwhile."""
        while not ready():
            if self.released:
                raise self._gone()
            yield NotReady(ready)

    def _gone(self) -> RelayGone:
        return RelayGone(f"{self.version} is no longer relayed (its load failed)")

    def _wake(self) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        waiting = self._changed
        if waiting is None or waiting.done():
            # Nobody waits: a reader makes its future before it looks at the copy again, so one
            # that starts waiting after this sees what changed (marked before this call).
            return

        def wake() -> None:
            waiting = self._changed
            if waiting is not None and not waiting.done():
                waiting.set_result(None)

        loop.call_soon_threadsafe(wake)

    @classmethod
    def from_store(
        cls,
        manifest_raw: bytes,
        manifest: ManifestDocument,
        store: TensorStore,
        extra_files: Mapping[str, bytes] | None = None,
    ) -> RelayCopy:
        return cls(manifest_raw, manifest, store.buffer, store=store, extra_files=extra_files)

    def file_size(self, file: str) -> int | None:
        """Size of a shard or an extra file of the version; None for any other name."""
        if file in self.extra_files:
            return len(self.extra_files[file])
        if not self.extras_ready and file in self.manifest.extra_files:
            return self.manifest.extra_files[file].size
        shard = self.manifest.files.get(file)
        return None if shard is None else shard.size

    def iter_range(self, file: str, start: int, end: int) -> Iterator[bytes | memoryview | NotReady]:
        """Bytes [start, end) of `file` in the original shard layout, in pieces of at most 1 MiB;
        bytes between tensors (header, padding) come out as zeros. Blocking. Before a tensor (or
        file) a running load has not verified yet: `NotReady` (pull again once it is).
        A tensor's pieces are views of the copy, not copies: a holder keeps that memory alive,
        and nothing writes a tensor once it is verified (the arena and the staging directory
        are written once; a live-parameter read is a copy already). RelayGone once the copy is
        released, before the next piece."""
        if file in self.manifest.extra_files:
            yield from self._until(lambda: self.extras_ready)
        extra = self.extra_files.get(file)
        if extra is not None:
            view = memoryview(extra)
            for lo in range(start, end, _PIECE):
                yield view[lo : min(end, lo + _PIECE)]
            return
        entries = self.manifest.by_file.get(file, [])
        i = max(bisect.bisect_right(self._offsets.get(file, []), start) - 1, 0)
        pos = start
        while pos < end:
            entry = entries[i] if i < len(entries) else None
            if entry is None or entry.offset >= end:
                yield from _zeros(end - pos)
                return
            if entry.end <= pos:
                i += 1
                continue
            if entry.offset > pos:
                yield from _zeros(entry.offset - pos)
                pos = entry.offset
            hi = min(end, entry.end)
            data: memoryview | None = None
            while pos < hi:
                yield from self._until(partial(self._has_beyond, entry, pos - entry.offset))
                data = data if data is not None else self._tensor(entry)
                # Pieces are views of the copy, written out without copying: a withdrawn copy
                # ends the response here rather than serving on from memory it gave up.
                if self.released:
                    raise self._gone()
                stop = min(hi, pos + _PIECE, entry.offset + self._available(entry))
                if stop <= pos:
                    continue  # the load began this tensor again (its peer failed): wait anew
                yield data[pos - entry.offset : stop - entry.offset]
                pos = stop
            i += 1

    def _tensor(self, entry: TensorRecord) -> memoryview:
        """A view of `entry`'s bytes that stays valid as long as it is held. `release` marks the
        copy released before it lets the store go, so a read that finds the copy still held
        afterwards read the store before it went (a read after gives an empty or failed view)."""
        try:
            data = self._read_tensor(entry)
        except RelayGone:
            raise
        except Exception:
            if self.released:
                raise self._gone() from None
            raise
        if self.released:
            raise self._gone()
        return data

    def on_release(self, fn: Callable[[], None]) -> None:
        """`fn()` once the copy is released (now, if it already is)."""
        with self._lock:
            if not self.released:
                self._on_release.append(fn)
                return
        fn()

    def release(self) -> None:
        # The mirror lock first: a mirror being filled from the store finishes before it goes.
        with self._mirror_lock, self._lock:
            if self.released:
                return
            self.released = True
            hooks, self._on_release = self._on_release, []
            self._mirrors = []
        self._wake()
        for fn in hooks:
            fn()
        if self.store is not None:
            self.store.release()


def _zeros(n: int) -> Iterator[bytes]:
    while n > 0:
        step = min(n, _PIECE)
        yield bytes(step)
        n -= step
