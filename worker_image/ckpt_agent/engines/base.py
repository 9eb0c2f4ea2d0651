"""The engine interface shared by the paddle reference engine and the FastDeploy adapter."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Protocol

from ckpt_agent.pause_gate import EngineControl, PauseGate
from ckpt_agent.reader import LoadProgress


@dataclass(frozen=True)
class LiveWeights:
    """The version an engine serves, and where it came from (so it can be restored)."""

    version: str
    source_uri: str | None
    manifest_digest: str | None
    checksum_verified: bool


@dataclass(frozen=True)
class LoadJob:
    version: str
    verify_checksum: bool
    source_uri: str | None
    manifest_digest: str | None
    previous: LiveWeights | None
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class LoadOutcome:
    bytes: int
    checksum_verified: bool
    manifest_digest: str | None


class EngineUnavailable(Exception):
    """The engine cannot serve right now (paused, or no consistent weights)."""


class Engine(EngineControl, Protocol):
    name: str
    supports_infer: bool

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def load(self, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
        """Load `job.version`; pause through `gate` around whatever must not see traffic.

        Raises LoadError; unless it has `weights_lost`, the previous weights are live again.
        """
        ...

    async def infer(self) -> list[float]:
        """Outputs for the engine's deterministic input (reference engine only)."""
        ...

    def describe(self) -> dict[str, Any]: ...
