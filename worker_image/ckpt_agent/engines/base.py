"""The engine interface shared by the paddle reference engine and the FastDeploy adapter."""

from __future__ import annotations

from typing import Any, Protocol

# Re-exported: part of this interface, defined below the engines because the load pipeline
# takes and returns them too.
from ckpt_agent.pipeline.load_job import LiveWeights as LiveWeights
from ckpt_agent.pipeline.load_job import LoadJob as LoadJob
from ckpt_agent.pipeline.load_job import LoadOutcome as LoadOutcome
from ckpt_agent.pipeline.pause_gate import EngineControl, PauseGate
from ckpt_agent.pipeline.reader import LoadProgress
from ckpt_agent.pipeline.smoke import Verdict
from ckpt_api.agent_api import HealthCheckRequest
from ckpt_api.manifest import ReferenceRecord


class EngineUnavailable(Exception):
    """The engine cannot serve right now (paused, or no consistent weights)."""


class Engine(EngineControl, Protocol):
    name: str
    supports_infer: bool
    # The smoke check can probe the engine while it is paused to traffic (an in-process forward
    # pass is no traffic): the service then keeps traffic held from the apply until the verdict.
    # False for engines that answer the probe through the very API their pause holds.
    checks_while_paused: bool
    # Loads only stage the version for another pod's engine (a multi-node replica's follower):
    # the only engines a staging call (UpdateWeightsRequest.stage) is for.
    stages_only: bool

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

    async def smoke(self, check: HealthCheckRequest, reference: ReferenceRecord | None) -> Verdict:
        """Probe the weights just loaded (pod not Ready yet; the engine still paused when
        `checks_while_paused`, else resumed): a forward pass, or
        a short generation of `check.prompt`; `reference`: the version manifest's. The caller
        bounds it by `check.timeout_seconds`; a LoadError counts as a failed check."""
        ...

    def describe(self) -> dict[str, Any]: ...
