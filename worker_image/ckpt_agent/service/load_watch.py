"""How long a load may take: a floor on the bytes it moves per second, and the request's deadline.

Per-read timeouts catch a source that stops sending, not one that trickles: a byte a second keeps
every read alive while a streamed load keeps the engine paused and the agent refuses other
loads. So the agent also watches what a load moves: once a whole window has passed, the bytes it
moved over the last window must average at least the floor (`--min-load-rate` over
`--load-rate-window`). The window doubles as the grace period: connecting, the manifest and the
first bytes get a whole window before the rule is first applied. Only the bytes are judged: once
all are in, applying them and the smoke check (which has its own timeout) are local work.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

DEFAULT_MIN_LOAD_RATE = 1 << 20  # bytes/s: a fraction of any link a checkpoint is loaded over
DEFAULT_LOAD_RATE_WINDOW_S = 30.0


@dataclass
class ThroughputFloor:
    """Judges samples of a load's byte count; `floor` 0 judges nothing."""

    floor: float
    window_s: float
    _samples: deque[tuple[float, int]] = field(default_factory=deque)

    def restart(self, now: float, nbytes: int) -> None:
        """A new grace period from `now` (a new attempt, or the source after a slow peer)."""
        self._samples.clear()
        self._samples.append((now, nbytes))

    def too_slow(self, now: float, nbytes: int) -> str | None:
        """Why the load is too slow at `now`, having moved `nbytes` so far; None while it is fast
        enough or a window has not passed yet."""
        samples = self._samples
        samples.append((now, nbytes))
        # Keep the newest sample that is a whole window old: the start of the window judged.
        while len(samples) > 1 and now - samples[1][0] >= self.window_s:
            samples.popleft()
        since, then = samples[0]
        elapsed = now - since
        if self.floor <= 0 or elapsed < self.window_s:
            return None
        rate = (nbytes - then) / elapsed
        if rate >= self.floor:
            return None
        return (
            f"{rate:.0f} bytes/s over the last {elapsed:.0f}s, below the floor of {self.floor:.0f} "
            "bytes/s (--min-load-rate)"
        )


# How long past a request's deadline_seconds a load is stopped.
DEADLINE_GRACE_S = 5.0


def describe_deadline(version: str, seconds: float) -> str:
    return f"the load of {version} did not finish within its deadline_seconds ({seconds:g}s)"
