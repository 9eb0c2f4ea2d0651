"""On-disk staging for engines that load a version from a directory (SGLang, vLLM).

Each shard is rewritten as a fresh safetensors file whose header is built from the verified
manifest (never copied from the source or a peer: those header bytes carry no checksum), and
whose data section the load fills in place through a shared mapping, tensor by tensor, hashing
as it goes. Files are written under a hidden `.partial` name and renamed to
`<staging root>/<version>` only once every byte is verified, so an engine never sees a half
staged version. Use a tmpfs (/dev/shm) or NVMe path.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import secrets
import shutil
import struct
from pathlib import Path

import numpy as np

from ckpt_agent.manifest import Manifest, TensorEntry

_ALIGN = 8  # safetensors recommends an 8-byte aligned data section


def _header(entries: list[TensorEntry]) -> tuple[bytes, dict[str, int], int]:
    """The safetensors header for `entries` packed in order, each tensor's offset in the new
    file, and the file size."""
    doc: dict[str, object] = {}
    cursor = 0
    local: dict[str, int] = {}
    for e in entries:
        doc[e.name] = {"dtype": e.dtype, "shape": list(e.shape), "data_offsets": [cursor, cursor + e.nbytes]}
        local[e.name] = cursor
        cursor += e.nbytes
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % _ALIGN)
    start = 8 + len(raw)
    return struct.pack("<Q", len(raw)) + raw, {n: start + off for n, off in local.items()}, start + cursor


class StagedDirectory:
    def __init__(self, root: Path, manifest: Manifest) -> None:
        self.version = manifest.version
        self._root = root
        root.mkdir(parents=True, exist_ok=True)
        self.path = root / f".{manifest.version}.partial-{secrets.token_hex(4)}"
        self.path.mkdir()
        # Identity of our directory: a later load of the same version replaces `<root>/<version>`,
        # and releasing this (older) copy must not delete that one.
        self._inode = self.path.stat().st_ino
        self._arrays: list[np.ndarray] = []
        self._maps: list[mmap.mmap] = []
        self._where: dict[str, tuple[int, int]] = {}  # tensor -> (map index, offset)
        try:
            for file, entries in manifest.by_file.items():
                header, offsets, size = _header(entries)
                with (self.path / file).open("w+b") as f:
                    f.truncate(size)
                    f.write(header)
                    f.flush()
                    mapped = mmap.mmap(f.fileno(), size) if size else None
                if mapped is None:
                    continue
                self._maps.append(mapped)
                self._arrays.append(np.frombuffer(mapped, dtype=np.uint8))
                for name, off in offsets.items():
                    self._where[name] = (len(self._maps) - 1, off)
        except BaseException:
            self.release()
            raise

    def buffer(self, entry: TensorEntry) -> memoryview:
        index, off = self._where[entry.name]
        return self._arrays[index].data[off : off + entry.nbytes]

    def regions(self) -> list[memoryview]:
        return [a.data for a in self._arrays]

    def finish(self) -> Path:
        """Flush and move into place as `<root>/<version>`; the mappings stay (relay reads them)."""
        for mapped in self._maps:
            mapped.flush()
        final = self._root / self.version
        if final.exists():
            shutil.rmtree(final)
        os.replace(self.path, final)
        self.path = final
        return final

    def release(self) -> None:
        self._arrays.clear()
        for mapped in self._maps:
            # A relay reader still holding a view keeps its mapping until it lets go.
            with contextlib.suppress(BufferError):
                mapped.close()
        self._maps.clear()
        with contextlib.suppress(FileNotFoundError):
            if self.path.stat().st_ino == self._inode:
                shutil.rmtree(self.path, ignore_errors=True)
