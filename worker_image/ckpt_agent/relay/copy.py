"""The copy of the live version an agent can relay, and how it is read back.

Which bytes a peer serves (decided per apply mode):
- staged (default) and disk-staging engines: the staging copy of the load, kept after
  the apply until the next load starts (host RAM or the staging directory; served over http
  and mooncake);
- streamed: re-read from the live parameters, tensor by tensor (http only: no staging copy to
  register). A tensor that changed since the load (a new load began) is refused.
Readers verify everything anyway; these rules keep an honest peer from serving torn data.
The version's non-weight files (config, tokenizer, index) are small and kept in memory with the
copy, verified, whatever the apply mode: a peer serves them as it received them.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable, Iterator, Mapping

from ckpt_agent.manifest import Manifest, TensorEntry
from ckpt_agent.staging import TensorStore

ReadTensor = Callable[[TensorEntry], memoryview]


class RelayGone(Exception):
    """The copy can no longer be served (released, or the live weights changed)."""


_PIECE = 1 << 20


class RelayCopy:
    def __init__(
        self,
        manifest_raw: bytes,
        manifest: Manifest,
        read_tensor: ReadTensor,
        *,
        store: TensorStore | None = None,
        source: str = "staging",
        extra_files: Mapping[str, bytes] | None = None,
    ) -> None:
        self.manifest_raw = manifest_raw
        self.manifest = manifest
        self.version = manifest.version
        self.store = store  # registrable memory, if any (mooncake relay)
        self.source = source
        self.extra_files: Mapping[str, bytes] = dict(extra_files or {})
        self._read_tensor = read_tensor
        self._offsets = {f: [e.offset for e in es] for f, es in manifest.by_file.items()}
        self._lock = threading.Lock()
        self._on_release: list[Callable[[], None]] = []
        self.released = False

    @classmethod
    def from_store(
        cls,
        manifest_raw: bytes,
        manifest: Manifest,
        store: TensorStore,
        extra_files: Mapping[str, bytes] | None = None,
    ) -> RelayCopy:
        return cls(manifest_raw, manifest, store.buffer, store=store, extra_files=extra_files)

    def file_size(self, file: str) -> int | None:
        """Size of a shard or an extra file of the version; None for any other name."""
        if file in self.extra_files:
            return len(self.extra_files[file])
        return self.manifest.files.get(file)

    def iter_range(self, file: str, start: int, end: int) -> Iterator[bytes | memoryview]:
        """Bytes [start, end) of `file` in the original shard layout, in pieces of at most 1 MiB;
        bytes between tensors (header, padding) come out as zeros. Blocking."""
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
            data = self._read_tensor(entry)
            hi = min(end, entry.end)
            for lo in range(pos, hi, _PIECE):
                yield data[lo - entry.offset : min(hi, lo + _PIECE) - entry.offset]
            pos = hi
            i += 1

    def on_release(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._on_release.append(fn)

    def release(self) -> None:
        with self._lock:
            if self.released:
                return
            self.released = True
            hooks, self._on_release = self._on_release, []
        for fn in hooks:
            fn()
        if self.store is not None:
            self.store.release()


def _zeros(n: int) -> Iterator[bytes]:
    while n > 0:
        step = min(n, _PIECE)
        yield bytes(step)
        n -= step
