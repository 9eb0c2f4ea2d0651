"""A zero-cost engine: every load "applies" at once, no weights are pulled or held.

It exists so thousands of agents fit in a few processes (the control-plane bench, scale tests
of the operator): the request handling, the one-load-at-a-time rule, the pause gate, metrics
and the status reports to the CR and the pod all run as for a real engine; only the byte pull,
verification and apply are skipped. It therefore never claims a verified checksum.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ckpt_agent.engines.base import LoadJob, LoadOutcome
from ckpt_agent.pipeline.pause_gate import LOAD, PausedFlag, PauseGate
from ckpt_agent.pipeline.reader import LoadProgress
from ckpt_agent.pipeline.smoke import Verdict, skipped
from ckpt_api.agent_api import HealthCheckRequest
from ckpt_api.manifest import ReferenceRecord


class NullEngine(PausedFlag):
    name = "null"
    supports_infer = False
    checks_while_paused = True  # nothing to probe
    stages_only = False

    def __init__(self, load_seconds: float = 0.0) -> None:
        # Optional simulated apply time, spent paused as a real apply would be.
        self.load_seconds = load_seconds
        self.loads = 0

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def load(self, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
        async with gate.hold(LOAD):
            if self.load_seconds > 0:
                await asyncio.sleep(self.load_seconds)
        self.loads += 1
        progress.bytes_total = progress.bytes_done = 0
        return LoadOutcome(bytes=0, checksum_verified=False, manifest_digest=job.manifest_digest)

    async def infer(self) -> list[float]:
        raise NotImplementedError("the null engine holds no model")

    async def smoke(self, check: HealthCheckRequest, reference: ReferenceRecord | None) -> Verdict:
        return skipped("the null engine holds no model to probe")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "load_seconds": self.load_seconds, "loads": self.loads}
