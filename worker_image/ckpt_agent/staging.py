"""Host staging area for `staged` loads: one arena holding a whole version, tensor by tensor."""

from __future__ import annotations

import numpy as np

from ckpt_agent.manifest import Manifest, TensorEntry

_ALIGN = 64


class StagingArea:
    def __init__(self, manifest: Manifest) -> None:
        self._slots: dict[str, tuple[int, int]] = {}
        cursor = 0
        for entry in manifest.tensors:
            self._slots[entry.name] = (cursor, entry.nbytes)
            cursor += -(-entry.nbytes // _ALIGN) * _ALIGN
        # np.empty: pages are only committed as tensors land, and large arenas get huge pages.
        self._arena = np.empty(max(cursor, 1), dtype=np.uint8)
        self._view = self._arena.data

    def buffer(self, entry: TensorEntry) -> memoryview:
        start, nbytes = self._slots[entry.name]
        return self._view[start : start + nbytes]

    def release(self) -> None:
        self._view.release()
        del self._arena
