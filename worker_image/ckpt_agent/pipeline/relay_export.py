"""Relaying a verified copy over Mooncake: describe each tensor as one extent at its original
shard offset, in a mirror of the copy that only the engine reads.

The engine serves registered memory to anyone who reaches its port, for reads and writes alike,
with no credential (Mooncake has none). So the staging copy itself is never registered: the
load applies it and the HTTP relay serves it, and a remote write there would reach the engine or
be served as verified. The mirror gets each tensor once the load verified it, before a reader
may read it (`RelayCopy.add_mirror`); a write into it reaches only Mooncake readers, which check
every byte against the source manifest's sha256 and fall back to the source on a mismatch.
Cost: one more copy of the version in host memory, made only once a peer asks for the
descriptor, and one memcpy per tensor.
"""

from __future__ import annotations

import bisect
import threading

import numpy as np

from ckpt_agent.pipeline.relay_copy import RelayCopy, RelayGone
from ckpt_agent.pipeline.staging import TensorStore
from ckpt_agent.transport.mooncake import runtime
from ckpt_agent.transport.mooncake.descriptor import Descriptor, ExportedFile, Extent
from ckpt_agent.transport.mooncake.export import ExportedVersion
from ckpt_api.manifest import TensorRecord


class _Mirror:
    """Memory laid out as `store`'s regions, tensor for tensor."""

    def __init__(self, store: TensorStore) -> None:
        self._store = store
        regions = store.regions()
        self._starts = [runtime.address_of(r) for r in regions]
        self.arrays = [np.empty(max(r.nbytes, 1), dtype=np.uint8) for r in regions]

    def _slot(self, entry: TensorRecord) -> np.ndarray:
        src = runtime.address_of(self._store.buffer(entry))
        i = bisect.bisect_right(self._starts, src) - 1
        off = src - self._starts[i]
        return self.arrays[i][off : off + entry.nbytes]

    def address_of(self, entry: TensorRecord) -> int:
        return int(self._slot(entry).ctypes.data)

    def copy_in(self, entry: TensorRecord) -> None:
        np.copyto(self._slot(entry), np.frombuffer(self._store.buffer(entry), dtype=np.uint8))


class RelayExporter:
    def __init__(self, protocol: runtime.Protocol) -> None:
        self.protocol: runtime.Protocol = protocol
        self._lock = threading.Lock()
        self._exported: dict[int, ExportedVersion] = {}  # id(copy) -> its registration

    def descriptor(self, copy: RelayCopy) -> Descriptor:
        """Blocking (registration pins memory for RDMA; the mirror copies what is verified)."""
        store = copy.store
        if store is None:
            raise RelayGone(f"{copy.version} is relayed from the live parameters: http only, not mooncake")
        with self._lock:
            exported = self._exported.get(id(copy))
            if exported is None:
                if copy.released:
                    raise RelayGone(f"{copy.version} is no longer relayed")
                exported = self._export(copy, store)
                self._exported[id(copy)] = exported
                key = id(copy)

                def forget() -> None:
                    with self._lock:
                        gone = self._exported.pop(key, None)
                    if gone is not None:
                        gone.release()

                copy.on_release(forget)
            return exported.descriptor

    def _export(self, copy: RelayCopy, store: TensorStore) -> ExportedVersion:
        engine = runtime.engine_for(self.protocol)
        mirror = _Mirror(store)
        # Filled before it is registered: no one reads it half-copied.
        copy.add_mirror(mirror.copy_in)
        addrs: list[int] = []
        try:
            for array in mirror.arrays:
                addr = int(array.ctypes.data)
                engine.register(addr, array.nbytes)
                addrs.append(addr)
        except BaseException:
            for addr in addrs:
                engine.unregister(addr)
            raise
        files = {
            name: ExportedFile(
                copy.manifest.files[name].size,
                tuple(Extent(e.offset, mirror.address_of(e), e.nbytes) for e in entries),
            )
            for name, entries in copy.manifest.by_file.items()
        }
        descriptor = Descriptor(copy.manifest_raw, engine.protocol, engine.session, files)
        return ExportedVersion(descriptor, engine, addrs, list(mirror.arrays))
