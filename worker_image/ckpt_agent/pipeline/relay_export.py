"""Relaying a verified copy over Mooncake: register its memory with this agent's engine and
describe each tensor as one extent at its original shard offset."""

from __future__ import annotations

import threading

from ckpt_agent.pipeline.relay_copy import RelayCopy, RelayGone
from ckpt_agent.transport.mooncake import runtime
from ckpt_agent.transport.mooncake.descriptor import Descriptor, ExportedFile, Extent
from ckpt_agent.transport.mooncake.export import ExportedVersion


class RelayExporter:
    def __init__(self, protocol: runtime.Protocol) -> None:
        self.protocol: runtime.Protocol = protocol
        self._lock = threading.Lock()
        self._exported: dict[int, ExportedVersion] = {}  # id(copy) -> its registration

    def descriptor(self, copy: RelayCopy) -> Descriptor:
        """Blocking (registration pins memory for RDMA)."""
        store = copy.store
        if store is None:
            raise RelayGone(f"{copy.version} is relayed from the live parameters: http only, not mooncake")
        with self._lock:
            exported = self._exported.get(id(copy))
            if exported is None:
                if copy.released:
                    raise RelayGone(f"{copy.version} is no longer relayed")
                exported = self._export(copy)
                self._exported[id(copy)] = exported
                key = id(copy)

                def forget() -> None:
                    with self._lock:
                        gone = self._exported.pop(key, None)
                    if gone is not None:
                        gone.release()

                copy.on_release(forget)
            return exported.descriptor

    def _export(self, copy: RelayCopy) -> ExportedVersion:
        assert copy.store is not None
        engine = runtime.engine_for(self.protocol)
        regions = copy.store.regions()
        addrs: list[int] = []
        try:
            for region in regions:
                addr = runtime.address_of(region)
                engine.register(addr, region.nbytes)
                addrs.append(addr)
        except BaseException:
            for addr in addrs:
                engine.unregister(addr)
            raise
        files = {
            name: ExportedFile(
                copy.manifest.files[name],
                tuple(Extent(e.offset, runtime.address_of(copy.store.buffer(e)), e.nbytes) for e in entries),
            )
            for name, entries in copy.manifest.by_file.items()
        }
        descriptor = Descriptor(copy.manifest_raw, engine.protocol, engine.session, files)
        return ExportedVersion(descriptor, engine, addrs, list(regions))
