"""A follower pod of a multi-node replica (SGLang `--nnodes`, vLLM's headless workers, a
LeaderWorkerSet's workers): its engine ranks have no API of their own; they read each version
from this node's disk when the replica's leader asks its engine to load it. The agent here stages
every version it is asked for into the staging directory, exactly as the leader's agent does (the
same `<staging root>/<version>` path on every node, where the ranks read it), and stops there:
its load succeeds once the version is staged and verified, and the operator calls the leader only
when every follower's has.

It keeps the versions a request names in `retain` (what the leader may restore while the replica
switches: the version the replica serves, and for a rollback the one it is leaving) beside the
newest, so a failed switch can go back on every rank. A request for a kept version takes the kept
copy again instead of pulling it (a rollback is then instant on followers)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_agent.engines.base import LoadJob, LoadOutcome
from ckpt_agent.engines.disk_staged import DiskStagedEngine, DiskWeights, staged_directory
from ckpt_agent.pipeline.pause_gate import PausedFlag, PauseGate
from ckpt_agent.pipeline.reader import LoadProgress
from ckpt_agent.pipeline.relay_copy import RelayCopy
from ckpt_agent.pipeline.sequence import Load
from ckpt_agent.pipeline.smoke import Verdict, skipped
from ckpt_agent.pipeline.staging_dir import StagedDirectory
from ckpt_api.agent_api import HealthCheckRequest
from ckpt_api.manifest import ReferenceRecord

log = logging.getLogger(__name__)


@dataclass
class _Kept:
    directory: StagedDirectory
    digest: str | None
    verified: bool


class MemberEngine(PausedFlag, DiskStagedEngine):
    name = "member"
    label = "the replica's engine"
    stages_only = True

    def __init__(self, staging_root: Path, **staging: Any) -> None:
        # No URL: nothing here is ever called; the leader's agent drives the replica's engine.
        super().__init__("http://127.0.0.1:9", staging_root, **staging)
        self._kept: dict[str, _Kept] = {}
        self._live_digest: str | None = None
        self._live_verified = False

    async def start(self) -> None:
        self._probed = True  # nothing to probe: no engine API on this pod
        self._boot_unreloadable = "a follower holds no engine of its own"
        await super().start()

    async def probe(self, limit_s: float) -> tuple[DiskWeights | None, str | None]:
        return None, "a follower holds no engine of its own"

    async def apply(self, weights: DiskWeights) -> None:
        """Staged is all a follower does: its node's ranks read the directory when the leader's
        engine loads it."""

    async def confirm(self, weights: DiskWeights) -> None:
        """The staged directory was verified as it was written; the leader confirms the engine."""

    async def smoke(self, check: HealthCheckRequest, reference: ReferenceRecord | None) -> Verdict:
        return skipped("a follower's ranks answer through the replica's leader, which runs the check")

    async def load(self, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
        kept = self._kept.get(job.version)
        if kept is not None and job.manifest_digest in (None, kept.digest):
            return self._take_kept(job, kept, progress)
        outcome = await super().load(job, gate, progress)
        self._live_digest, self._live_verified = outcome.manifest_digest, outcome.checksum_verified
        return outcome

    def staging(self, load: Load) -> StagedDirectory:
        # A kept copy of this version that the request's digest refuses is replaced.
        stale = self._kept.pop(load.job.version, None)
        if stale is not None:
            stale.directory.release()
        return super().staging(load)

    def landed(self, load: Load) -> RelayCopy | None:
        previous = self._live
        self._live = None  # kept or released below, never by the base class
        relay = super().landed(load)
        if previous is not None:
            self._keep(previous, self._live_digest, self._live_verified)
        self._prune(load.job.retain, staged_directory(load).version)
        return relay

    def _take_kept(self, job: LoadJob, kept: _Kept, progress: LoadProgress) -> LoadOutcome:
        del self._kept[job.version]
        if self._live is not None:
            self._keep(self._live, self._live_digest, self._live_verified)
        self._live, self._weights_unknown = kept.directory, False
        self._live_digest, self._live_verified = kept.digest, kept.verified
        self._prune(job.retain, job.version)
        progress.bytes_total = progress.bytes_done = 0
        log.info("%s was still staged at %s: taken again, nothing pulled", job.version, kept.directory.path)
        return LoadOutcome(bytes=0, checksum_verified=kept.verified, manifest_digest=kept.digest)

    def _keep(self, directory: StagedDirectory, digest: str | None, verified: bool) -> None:
        old = self._kept.pop(directory.version, None)
        if old is not None and old.directory is not directory:
            old.directory.release()
        self._kept[directory.version] = _Kept(directory, digest, verified)

    def _prune(self, retain: tuple[str, ...], live: str) -> None:
        for version in [v for v in self._kept if v not in retain or v == live]:
            self._kept.pop(version).directory.release()

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "staging": str(self.staged_path()),
            "kept": sorted(self._kept),
        }
