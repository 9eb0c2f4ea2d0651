"""Where a wave's bytes came from (outcomes.transfer_split), from its updated entries."""

from __future__ import annotations

import pytest

from ckpt_api.status import WorkerStatus
from ckpt_rollout.domain.outcomes import transfer_split


def _entry(nbytes: int | None, from_peers: int | None) -> WorkerStatus:
    return WorkerStatus(version="v2", phase="Updated", bytes=nbytes, bytes_from_peers=from_peers)


@pytest.mark.parametrize(
    ("entries", "split"),
    [
        ([], (None, None)),
        ([_entry(None, None)], (None, None)),  # an agent that reports no byte counts
        ([_entry(100, None)], (100, 0)),  # no peer count: all from the source
        ([_entry(100, 100), _entry(100, 0), _entry(100, 40)], (160, 140)),
        # A peer that failed part way: its bad bytes were read twice; never more than the bytes.
        ([_entry(100, 130)], (0, 100)),
        ([_entry(100, 100), _entry(None, 50)], (0, 100)),
    ],
)
def test_transfer_split(entries: list[WorkerStatus], split: tuple[int | None, int | None]) -> None:
    assert transfer_split(entries) == {"bytes_from_source": split[0], "bytes_from_peers": split[1]}
