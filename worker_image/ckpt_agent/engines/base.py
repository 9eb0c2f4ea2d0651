"""The engine interface shared by the paddle reference engine and the FastDeploy adapter."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ckpt_agent.pause_gate import EngineControl, PauseGate
from ckpt_agent.reader import LoadProgress

if TYPE_CHECKING:
    from ckpt_agent.relay.copy import RelayCopy


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
    # Pull tensor bytes from this peer agent (manifest still from `source_uri`), authenticating
    # with the update request's bearer token; see ckpt_agent.relay.
    peer: str | None = None
    bearer: str | None = field(default=None, repr=False)

    @property
    def must_verify(self) -> bool:
        """Bytes from a peer are untrusted: always verified, whatever the request asked."""
        return self.verify_checksum or self.peer is not None


@dataclass(frozen=True)
class LoadOutcome:
    bytes: int
    checksum_verified: bool
    manifest_digest: str | None
    # The verified copy this agent can now relay to peers (None: it cannot relay this version).
    relay: RelayCopy | None = None
    # The tensor bytes came from `LoadJob.peer` (engines that pull by themselves ignore peers).
    from_peer: bool = False


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
