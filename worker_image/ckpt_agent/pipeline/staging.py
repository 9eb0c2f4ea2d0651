"""Where a staged load puts tensors before they go live.

`StagingArea`: one anonymous host arena holding a whole version, tensor by tensor (in-process
engines: the bytes are copied into the live parameters under pause).
`TensorStore` is what a relay copy's Mooncake export needs of it: a buffer per tensor, the memory
regions behind them (the export mirrors their layout, never registering them), and release. The
on-disk staging directory (`staging_dir`) relays over HTTP only.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ckpt_api.manifest import ManifestDocument, TensorRecord

_ALIGN = 64


class TensorStore(Protocol):
    def buffer(self, entry: TensorRecord) -> memoryview: ...

    def regions(self) -> list[memoryview]:
        """The memory every `buffer` lies in."""
        ...

    def release(self) -> None: ...


class StagingArea:
    def __init__(self, manifest: ManifestDocument) -> None:
        self._slots: dict[tuple[str, str], tuple[int, int]] = {}
        cursor = 0
        for entry in manifest.tensors:
            self._slots[entry.key] = (cursor, entry.nbytes)
            cursor += -(-entry.nbytes // _ALIGN) * _ALIGN
        # np.empty: pages are only committed as tensors land, and large arenas get huge pages.
        self._arena = np.empty(max(cursor, 1), dtype=np.uint8)
        self._view = self._arena.data

    def buffer(self, entry: TensorRecord) -> memoryview:
        start, nbytes = self._slots[entry.key]
        return self._view[start : start + nbytes]

    def regions(self) -> list[memoryview]:
        return [self._view]

    def release(self) -> None:
        # Drops this object's references only: a relay read still holding a slice keeps the
        # arena alive until it finishes.
        self._view = memoryview(b"")
        self._arena = np.empty(0, dtype=np.uint8)
