"""Serving side: register a version's bytes with this process's engine and describe them.

A source (`ckpt-rollout serve --mooncake tcp|rdma`) maps each shard file copy-on-write and
registers the mapping: over TCP the engine reads straight from the page cache; for RDMA the
kernel pins the pages (and breaks copy-on-write into anonymous memory once, on registration).
A relaying agent registers its verified staging copy instead (see `ckpt_agent.pipeline`).

Eviction never frees memory under a read in flight: memory is unregistered first (new reads
are refused by the engine) and unmapped only after a grace period.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.transport.mooncake.descriptor import Descriptor, ExportedFile, Extent
from ckpt_agent.transport.mooncake.runtime import MooncakeEngine
from ckpt_api.manifest import MANIFEST_NAME

log = logging.getLogger(__name__)

RELEASE_GRACE_SECONDS = 10.0


def release_later(release: Callable[[], None], delay: float = RELEASE_GRACE_SECONDS) -> None:
    timer = threading.Timer(delay, release)
    timer.daemon = True
    timer.start()


class ExportedVersion:
    """Registered memory for one version; `release` unregisters now and frees after a grace."""

    def __init__(self, descriptor: Descriptor, engine: MooncakeEngine, addrs: list[int], keep: list[object]):
        self.descriptor = descriptor
        self._engine = engine
        self._addrs = addrs
        self._keep = keep  # the buffers behind `addrs`: alive until released

    def release(self, grace: float = RELEASE_GRACE_SECONDS) -> None:
        for addr in self._addrs:
            self._engine.unregister(addr)
        self._addrs = []
        keep, self._keep = self._keep, []

        def free() -> None:
            maps = [obj for obj in keep if isinstance(obj, mmap.mmap)]
            keep.clear()  # drops the arrays that export the mappings first
            for mapped in maps:
                # Still viewed somewhere: unmapped when that view goes.
                with contextlib.suppress(BufferError):
                    mapped.close()

        if grace > 0:
            release_later(free, grace)
        else:
            free()


def export_directory(engine: MooncakeEngine, version_dir: Path, max_manifest_bytes: int) -> ExportedVersion:
    """Map and register every shard of a published version directory.

    Raises FileNotFoundError if the version has no manifest, LoadError if the manifest is bad.
    """
    with (version_dir / MANIFEST_NAME).open("rb") as f:
        raw = f.read(max_manifest_bytes + 1)
    manifest = parse_manifest(raw[:max_manifest_bytes], expected_version=version_dir.name)
    files: dict[str, ExportedFile] = {}
    addrs: list[int] = []
    keep: list[object] = []
    try:
        for name in manifest.files:
            try:
                fd = os.open(version_dir / name, os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                continue  # readers report the shard missing
            try:
                size = os.fstat(fd).st_size
                if size == 0:
                    files[name] = ExportedFile(0, ())
                    continue
                mapped = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
            finally:
                os.close(fd)
            array = np.frombuffer(mapped, dtype=np.uint8)
            addr = int(array.ctypes.data)
            keep.extend([array, mapped])  # the array first: it holds an export of the mapping
            engine.register(addr, size)
            addrs.append(addr)
            files[name] = ExportedFile(size, (Extent(0, addr, size),))
    except BaseException:
        ExportedVersion(Descriptor(raw, engine.protocol, engine.session, files), engine, addrs, keep).release(
            0
        )
        raise
    descriptor = Descriptor(raw, engine.protocol, engine.session, files)
    return ExportedVersion(descriptor, engine, addrs, keep)


class ExportCache:
    """The last `keep` versions a source exported, least recently used evicted first."""

    def __init__(self, make: Callable[[str], ExportedVersion], keep: int = 4) -> None:
        self._make = make
        self._keep = keep
        self._lock = threading.Lock()
        self._versions: OrderedDict[str, ExportedVersion] = OrderedDict()

    def descriptor(self, version: str) -> Descriptor:
        with self._lock:
            exported = self._versions.get(version)
            if exported is None:
                exported = self._make(version)
                self._versions[version] = exported
                while len(self._versions) > self._keep:
                    old, evicted = self._versions.popitem(last=False)
                    log.info("mooncake: releasing %s (keeping the last %d versions)", old, self._keep)
                    evicted.release()
            self._versions.move_to_end(version)
            return exported.descriptor

    def close(self) -> None:
        with self._lock:
            for exported in self._versions.values():
                exported.release(0)
            self._versions.clear()


def directory_exports(
    engine: MooncakeEngine, root: Path, max_manifest_bytes: int, keep: int = 4
) -> ExportCache:
    return ExportCache(lambda version: export_directory(engine, root / version, max_manifest_bytes), keep)
