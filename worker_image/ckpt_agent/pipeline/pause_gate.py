"""Who holds the engine paused. The engine is paused while anyone holds it (an operator's
explicit `/v1/pause`, a load's apply phase) and resumed when the last holder lets go, so a load
never resumes traffic that an operator paused, and an operator's resume never cuts into an apply."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Protocol

USER = "user"
LOAD = "load"
# Held after a load that left weights nobody can vouch for: the engine stays paused (its own
# /health may still route traffic to it) until a load succeeds; a user's resume does not lift it.
WEIGHTS_LOST = "weights-lost"
# Held from the end of a load's apply until its smoke check decides (and, when it fails, until
# the previous version is back): nobody is served weights that have not passed their checks.
CHECK = "check"


class EngineControl(Protocol):
    async def pause(self) -> None: ...
    async def resume(self) -> None: ...
    async def is_paused(self) -> bool: ...


class PausedFlag:
    """EngineControl for engines with no traffic of their own to hold (null, member): the pause
    is only remembered, for /v1/is_paused."""

    _paused = False

    async def pause(self) -> None:
        self._paused = True

    async def resume(self) -> None:
        self._paused = False

    async def is_paused(self) -> bool:
        return self._paused


class PauseGate:
    def __init__(self, engine: EngineControl) -> None:
        self._engine = engine
        self._holders: set[str] = set()
        self._lock = asyncio.Lock()
        # holder -> who holds the engine in its place once it lets go (see hand_over).
        self._successors: dict[str, str] = {}
        # Seconds each holder spent in hold(), summed until reset: what a load's apply cost in
        # paused time (FastDeploy's update_cost, in a synchronous update_weights answer).
        self.held_seconds: dict[str, float] = {}
        # holder -> what to do once, just before it next takes the gate (see before_acquire).
        self._before: dict[str, Callable[[], None]] = {}

    @property
    def holders(self) -> list[str]:
        return sorted(self._holders)

    def before_acquire(self, holder: str, hook: Callable[[], None] | None) -> None:
        """Call `hook` once, when `holder` next acquires the gate, before the engine is paused
        (None: forget it). Every engine takes LOAD before it changes a weight, so a hook on LOAD
        runs while the weights are still the previous version's."""
        if hook is None:
            self._before.pop(holder, None)
        else:
            self._before[holder] = hook

    async def acquire(self, holder: str) -> None:
        if (hook := self._before.pop(holder, None)) is not None:
            hook()
        async with self._lock:
            if not self._holders:
                await self._engine.pause()
            self._holders.add(holder)

    def hand_over(self, holder: str, successor: str | None) -> None:
        """When `holder` next lets go, `successor` holds the engine paused in its place, with no
        resume between (None: forget it). Whoever arranges it releases `successor`."""
        if successor is None:
            self._successors.pop(holder, None)
        else:
            self._successors[holder] = successor

    async def release(self, holder: str) -> None:
        async with self._lock:
            if holder not in self._holders:
                return
            self._holders.discard(holder)
            successor = self._successors.pop(holder, None)
            if successor is not None:
                self._holders.add(successor)
            if not self._holders:
                await self._engine.resume()

    @asynccontextmanager
    async def hold(self, holder: str) -> AsyncIterator[None]:
        await self.acquire(holder)
        started = time.monotonic()
        try:
            yield
        finally:
            self.held_seconds[holder] = self.held_seconds.get(holder, 0.0) + time.monotonic() - started
            # Shielded: a cancelled load must still resume the engine it paused.
            await asyncio.shield(self.release(holder))
