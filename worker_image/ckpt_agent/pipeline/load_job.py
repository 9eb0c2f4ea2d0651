"""What a load is asked to do, the weights it replaces, and what it produced.

These sit below the engines because the load pipeline (`loader`, `relay.load`) takes and returns
them too; `ckpt_agent.engines.base` presents them as part of the engine interface.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckpt_agent.pipeline.relay_copy import RelayCopy
    from ckpt_api.agent_api import HealthCheckRequest
    from ckpt_api.manifest import ReferenceRecord


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
    # with this agent's own relay credential (never the update request's token).
    peer: str | None = None
    bearer: str | None = field(default=None, repr=False)
    # Refuse NaN/Inf in floating tensors (NonFiniteTensor) before anything is applied.
    check_finite: bool = False
    # The smoke check to run once the version is applied (the service runs it; engines ignore it).
    health_check: HealthCheckRequest | None = None
    # Pipelined relay: loaders that can (staged in-process) hand `publish_relay` their copy before
    # the first tensor arrives, and serve its bytes on as they land (readers verify them).
    relay_while_loading: bool = False
    publish_relay: Callable[[RelayCopy], None] | None = field(default=None, repr=False, compare=False)
    # Versions to keep staged beside this one (a multi-node replica's follower: the versions its
    # leader may restore). Engines that keep no staged copies ignore it.
    retain: tuple[str, ...] = ()

    @property
    def must_verify(self) -> bool:
        """Bytes from a peer are untrusted: always verified, whatever the request asked. A pinned
        manifest digest is verified too: the pin covers the manifest, and only checking the bytes
        against it extends the pin to them. (A load relayed while it runs verifies its tensors
        too, but only where it is relayed: see relay.load.pull_into. And whatever this says, bytes
        from an untrusted transport, a Mooncake source too, are: `transport.is_untrusted`.)"""
        return self.verify_checksum or self.peer is not None or self.manifest_digest is not None


@dataclass(frozen=True)
class LoadOutcome:
    bytes: int
    checksum_verified: bool
    manifest_digest: str | None
    # The verified copy this agent can now relay to peers (None: it cannot relay this version).
    relay: RelayCopy | None = None
    # The tensor bytes came from `LoadJob.peer` (engines that pull by themselves ignore peers).
    from_peer: bool = False
    # The version manifest's published outputs, for the smoke check (in-process engines).
    reference: ReferenceRecord | None = None
