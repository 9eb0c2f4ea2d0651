"""Engines that load a version from a local directory (SGLang, vLLM): the agent pulls and
verifies the version into a staging directory (`staging_dir`: a Hugging Face model directory,
checked loadable before any tensor byte is pulled), then, with traffic paused, asks the engine
to load it and checks the engine reports it. Subclasses speak each engine's API.

Failure truth. Neither engine's load from disk is transactional: a load that fails part way
leaves the engine holding new, mixed or half-initialised weights (SGLang's own "rollback"
re-reads the new path; vLLM's in-place reload has none). So when a load fails once the engine
may have touched its weights, the agent, still holding traffic paused, reloads the version that
was live from its retained staged copy (for the engine's boot weights: the local directory the
engine reported at start-up, if it did), and reports that version live only once the engine
confirms it. If that fails too, or there is nothing to reload, the load fails with
`weights_lost`: the pod's WeightsReady turns False, and the engine is left paused (holder
`weights-lost`) until a load succeeds, because nobody can vouch for what it would serve.
"""

from __future__ import annotations

import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.engines.base import LoadJob, LoadOutcome
from ckpt_agent.engines.engine_http import EngineHttp, timed_generation
from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.pipeline.pause_gate import WEIGHTS_LOST, PauseGate
from ckpt_agent.pipeline.reader import DEFAULT_CHUNK_BYTES, LoadProgress
from ckpt_agent.pipeline.relay_copy import RelayCopy
from ckpt_agent.pipeline.relay_peer import is_peer_fault
from ckpt_agent.pipeline.sequence import Load, run_load
from ckpt_agent.pipeline.smoke import Verdict
from ckpt_agent.pipeline.staging_dir import StagedDirectory, sweep_orphans
from ckpt_api.agent_api import HealthCheckRequest
from ckpt_api.manifest import ManifestDocument, ReferenceRecord

log = logging.getLogger(__name__)

# Holds the engine paused after its weights were lost: neither a load's end nor an operator's
# resume may give traffic back to weights nobody can vouch for; the next successful load does.
WEIGHTS_LOST_HOLDER = WEIGHTS_LOST


class EngineMisconfigured(LoadError):
    """The engine answers but cannot do what the agent needs (a server flag, version, or key is
    missing); refused at start-up when the engine is up then, else before the first load."""

    def __init__(self, message: str) -> None:
        super().__init__(Reason.ENGINE_ERROR, message)


class EngineRefused(LoadError):
    """The engine refused a load at a point its own code reaches before writing any weight."""

    def __init__(self, message: str) -> None:
        super().__init__(Reason.ENGINE_ERROR, message)


@dataclass(frozen=True)
class DiskWeights:
    """Weights on disk as the engine loads them, and the version it reports once it holds them."""

    version: str
    path: str | None  # as the engine sees it; None: unknown
    load_format: str | None = None  # None: the engine's current format

    def __str__(self) -> str:
        return f"{self.version} ({self.path})"


def reloadable_boot_path(path: object) -> str | None:
    """Why the engine's boot weights at `path` cannot be reloaded, or None if they can: only a
    local directory is. A hub id would be fetched again mid-incident, maybe at another revision."""
    if not isinstance(path, str) or not path:
        return "the engine reported no model path"
    if not os.path.isabs(path):
        return f"the engine booted from {path!r}, not a local directory"
    return None


class DiskStagedEngine:
    name = "disk-staged"
    label = "the engine"
    supports_infer = False
    # The check generates through the server's own API, which its pause holds back.
    checks_while_paused = False
    stages_only = False
    pulls_weights_itself = False
    # The engine's own /health would route traffic to weights nobody can vouch for.
    pauses_lost_weights = True
    relays_while_staging = False  # the relay serves the staged directory once the load lands

    def __init__(
        self,
        base_url: str,
        staging_root: Path,
        *,
        control_timeout: float = 30.0,
        update_timeout: float = 1800.0,
        probe_timeout: float = 5.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES,
        parallelism: int = 1,
        relay: bool = True,
        ranks: frozenset[int] | None = None,
    ) -> None:
        self.staging_root = staging_root
        self.ranks = ranks
        self._http = EngineHttp(base_url, self.label)
        self._control_timeout = control_timeout
        self._update_timeout = update_timeout
        self._probe_timeout = probe_timeout
        self.chunk_bytes = chunk_bytes
        self.max_manifest_bytes = max_manifest_bytes
        self.parallelism = parallelism
        self._relay = relay
        self.load_format: str | None = None  # what staged versions are loaded with (None: engine's)
        self._live: StagedDirectory | None = None  # the staged copy of the live version
        self._live_format: str | None = None
        self._probed = False
        # What the engine served before the agent's first load, and why it cannot be reloaded
        # (None: it can).
        self._boot: DiskWeights | None = None
        self._boot_unreloadable: str | None = "the engine was not probed"
        self._weights_unknown = False  # a load lost them; only a successful load clears this

    # -- what an engine subclass provides --------------------------------------------------------
    async def probe(self, limit_s: float) -> tuple[DiskWeights | None, str | None]:
        """Check the engine can do what the agent needs (raise EngineMisconfigured if not);
        return what it serves now and why that cannot be reloaded (None: it can)."""
        raise NotImplementedError

    async def apply(self, weights: DiskWeights) -> None:
        """Make the engine load `weights` and record its version (called with traffic paused)."""
        raise NotImplementedError

    async def confirm(self, weights: DiskWeights) -> None:
        """Raise LoadError unless the engine reports it holds `weights` (called paused)."""
        raise NotImplementedError

    async def pause(self) -> None:
        raise NotImplementedError

    async def generate(self, check: HealthCheckRequest) -> tuple[object, object]:
        """(text, finish reason) of a short generation of `check.prompt` through the engine's
        own generation endpoint; LoadError if it does not answer one."""
        raise NotImplementedError

    # -- Engine ------------------------------------------------------------------------------
    async def start(self) -> None:
        for orphan in sweep_orphans(self.staging_root):
            log.info("removed %s, left by a load that never finished", orphan)
        await self._http.start()
        try:
            await self._ensure_probed(self._probe_timeout)
        except EngineMisconfigured:
            await self._http.close()
            raise
        except LoadError as exc:
            # Not up, or not ready (a sidecar engine may take minutes to load its model): the
            # first load checks it again.
            log.warning("%s; checking it again before the first load", exc.message)
        except BaseException:
            await self._http.close()
            raise

    async def close(self) -> None:
        await self._http.close()

    async def infer(self) -> list[float]:
        raise NotImplementedError(f"{self.name} serves its own API")

    async def smoke(self, check: HealthCheckRequest, reference: ReferenceRecord | None) -> Verdict:
        return await timed_generation(self.generate(check))

    async def load(self, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
        try:
            return await run_load(self, job, gate, progress)
        except LoadError as exc:
            # The service would take any other failure to mean the previous weights still
            # serve; after a loss that is false until a load succeeds. A peer fault stays as it
            # is so that the service retries from the source.
            if not self._weights_unknown or exc.weights_lost or (job.peer is not None and is_peer_fault(exc)):
                raise
            raise LoadError(
                exc.reason,
                f"{exc.message}; {self.label}'s weights are still unknown since an earlier load lost them",
                tensor=exc.tensor,
                weights_lost=True,
            ) from exc

    # -- LoadSteps -------------------------------------------------------------------------------
    async def prepare(self, job: LoadJob) -> None:
        # Before pulling any byte: a misconfigured or absent engine fails the load cheaply.
        await self._ensure_probed(self._control_timeout)

    def check(self, manifest: ManifestDocument) -> None:
        pass  # the staged directory is checked loadable before any tensor byte is pulled

    def staging(self, load: Load) -> StagedDirectory:
        self._move_live_copy_aside(load.job.version)
        staged = StagedDirectory(self.staging_root, load.document, load.extra)
        try:
            # Headers and extra files are final already: a directory the engine could not load
            # is refused before a tensor byte is pulled, and the engine is never called.
            staged.check_loadable()
        except BaseException:
            staged.release()
            raise
        return staged

    def staged(self, load: Load) -> None:
        staged_directory(load).finish()

    async def apply_load(self, load: Load) -> None:
        if self._weights_unknown:
            try:
                # The gate may still count the engine paused (weights-lost) while it restarted,
                # unpaused, since: pause it for real before touching its weights.
                await self.pause()
            except LoadError as exc:
                raise self._lost(exc, "pausing it failed") from exc
        target = self._weights(load)
        await self.apply(target)
        await self.confirm(target)

    def landed(self, load: Load) -> RelayCopy | None:
        staged = staged_directory(load)
        previous, self._live = self._live, staged
        self._live_format, self._weights_unknown = self.load_format, False
        if previous is not None:
            previous.release()
        # The engine owns the live staging directory (released when the next load lands); the
        # relay only reads it, so withdrawing the relay must not delete it.
        return (
            RelayCopy(load.raw, load.document, staged.buffer, extra_files=load.extra) if self._relay else None
        )

    def lost(self) -> None:
        self._forget_live()

    def _weights(self, load: Load) -> DiskWeights:
        return DiskWeights(load.job.version, str(staged_directory(load).path), self.load_format)

    async def _ensure_probed(self, limit_s: float) -> None:
        if not self._probed:
            self._boot, self._boot_unreloadable = await self.probe(limit_s)
            self._probed = True

    async def restore(self, load: Load, failure: LoadError) -> LoadError:
        if failure.weights_lost:  # nothing was touched that a reload could put right
            return failure
        if self._weights_unknown:
            return self._lost(failure, "its weights were already unknown")
        previous = self._previous()
        reloadable = self._live is not None or self._boot_unreloadable is None
        restore = previous if reloadable and previous is not None else None
        if restore is None:
            if isinstance(failure, EngineRefused) and await self._reports(previous):
                return failure
            return self._lost(failure, f"nothing to restore ({self._boot_unreloadable})")
        log.warning("loading failed (%s); restoring %s", failure.message, restore)
        try:
            await self.apply(restore)
            await self.confirm(restore)
        except LoadError as exc:
            # Refused twice before any weight was written: what served before still does. (A
            # refusal of the restore alone says nothing of what the failed load left.)
            both_refused = isinstance(failure, EngineRefused) and isinstance(exc, EngineRefused)
            if both_refused and await self._reports(restore):
                return failure
            return self._lost(failure, f"restoring {restore} failed too: {exc.message}")
        log.info("restored %s", restore)
        return LoadError(
            failure.reason,
            f"{failure.message}; restored {restore.version} from {restore.path} and {self.label} confirms it",
            tensor=failure.tensor,
        )

    def _previous(self) -> DiskWeights | None:
        """What the engine served before this load: the live staged copy, else its boot weights."""
        if self._live is not None:
            return DiskWeights(self._live.version, str(self._live.path), self._live_format)
        return self._boot

    async def _reports(self, weights: DiskWeights | None) -> bool:
        if weights is None:
            return False
        try:
            await self.confirm(weights)
        except LoadError as exc:
            log.warning("%s", exc.message)
            return False
        return True

    def _lost(self, failure: LoadError, why: str) -> LoadError:
        return LoadError(
            failure.reason,
            f"{failure.message}; {why}; {self.label} may hold partial weights",
            tensor=failure.tensor,
            weights_lost=True,
        )

    def _forget_live(self) -> None:
        self._weights_unknown = True
        if self._live is not None:
            self._live.release()
            self._live = None

    def _move_live_copy_aside(self, version: str) -> None:
        """A load of the live version stages into the live copy's place: keep the copy (the
        restore point) under another name until the load has landed."""
        live = self._live
        if live is None or live.path != self.staging_root / version:
            return
        aside = self.staging_root / f".{version}.restore-{secrets.token_hex(4)}"
        os.replace(live.path, aside)
        live.path = aside

    def staged_path(self) -> Path | None:
        return self._live.path if self._live is not None else None

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "url": self._http.base_url,
            "staging": str(self.staged_path()),
            "boot": None if self._boot is None else str(self._boot),
            "weights_unknown": self._weights_unknown,
        }


def staged_directory(load: Load) -> StagedDirectory:
    """The directory `load` staged into (a disk engine always stages into one)."""
    assert isinstance(load.staging, StagedDirectory), "a disk engine stages into a directory"
    return load.staging
