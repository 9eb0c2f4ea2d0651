"""Engines that load a version from a local directory (SGLang, vLLM): the agent pulls and
verifies the version into a staging directory (`staging_dir`), then, with traffic paused, asks
the engine to load it, then checks the engine took it. Subclasses speak each engine's API.
"""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import aiohttp

from ckpt_agent.engines.base import LoadJob, LoadOutcome
from ckpt_agent.errors import LoadError, Reason
from ckpt_agent.manifest import DEFAULT_MAX_MANIFEST_BYTES, Manifest
from ckpt_agent.pause_gate import LOAD, PauseGate
from ckpt_agent.reader import DEFAULT_CHUNK_BYTES, LoadProgress
from ckpt_agent.relay.copy import RelayCopy
from ckpt_agent.relay.load import open_version, pull_into
from ckpt_agent.staging_dir import StagedDirectory
from ckpt_agent.transport import Transport

log = logging.getLogger(__name__)


class EngineHttp:
    """JSON calls to the engine's HTTP server; any failure is a LoadError(EngineError)."""

    def __init__(self, base_url: str, label: str) -> None:
        self.base_url = base_url.rstrip("/")
        self._label = label
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        *,
        limit_s: float,
        params: dict[str, str] | None = None,
        ok_statuses: tuple[int, ...] = (),
    ) -> tuple[int, Any]:
        assert self._session is not None, "engine not started"
        try:
            async with self._session.request(
                method,
                self.base_url + path,
                json=body,
                params=params,
                timeout=aiohttp.ClientTimeout(total=limit_s),
            ) as resp:
                text = await resp.text()
                if resp.status // 100 != 2 and resp.status not in ok_statuses:
                    raise LoadError(
                        Reason.ENGINE_ERROR, f"{self._label} {path} answered HTTP {resp.status}: {text[:500]}"
                    )
                return resp.status, _decode(text, strict=resp.status // 100 == 2)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise LoadError(Reason.ENGINE_ERROR, f"{self._label} {path} failed: {exc!r}") from None


def _decode(text: str, *, strict: bool) -> Any:
    """JSON of a reply; an error reply (e.g. a plain-text 404) may be text instead."""
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except ValueError:
        if strict:
            raise
        return text


class DiskStagedEngine:
    name = "disk-staged"
    supports_infer = False

    def __init__(
        self,
        staging_root: Path,
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES,
        parallelism: int = 1,
        relay: bool = True,
    ) -> None:
        self.staging_root = staging_root
        self._chunk = chunk_bytes
        self._max_manifest = max_manifest_bytes
        self._parallelism = parallelism
        self._relay = relay
        self._live: StagedDirectory | None = None  # the staged copy of the live version

    # -- what an engine subclass provides --------------------------------------------------------
    async def apply(self, job: LoadJob, path: Path) -> None:
        """Make the engine load `path` (called with traffic paused)."""
        raise NotImplementedError

    async def confirm(self, job: LoadJob) -> None:
        """Check the engine serves `job.version` (called after resuming)."""

    # -- Engine ------------------------------------------------------------------------------
    async def infer(self) -> list[float]:
        raise NotImplementedError(f"{self.name} serves its own API")

    async def load(self, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
        transport, manifest, digest, raw = await open_version(job, self._max_manifest)
        try:
            progress.bytes_total = manifest.total_bytes
            staged = await asyncio.to_thread(self._stage, transport, manifest, job, progress)
        finally:
            transport.close()
        try:
            async with gate.hold(LOAD):
                await self.apply(job, staged.path)
            await self.confirm(job)
        except BaseException:
            staged.release()
            raise
        previous, self._live = self._live, staged
        if previous is not None:
            previous.release()
        # The engine owns the live staging directory (released when the next load lands); the
        # relay only reads it, so withdrawing the relay must not delete it.
        relay = RelayCopy(raw, manifest, staged.buffer) if self._relay else None
        return LoadOutcome(
            manifest.total_bytes, job.must_verify, digest, relay, from_peer=job.peer is not None
        )

    def _stage(
        self, transport: Transport, manifest: Manifest, job: LoadJob, progress: LoadProgress
    ) -> StagedDirectory:
        staged = StagedDirectory(self.staging_root, manifest)
        try:
            pull_into(
                transport,
                job,
                manifest,
                staged,
                progress,
                chunk_bytes=self._chunk,
                parallelism=self._parallelism,
            )
            staged.finish()
            return staged
        except BaseException:
            staged.release()
            raise

    def staged_path(self) -> Path | None:
        return self._live.path if self._live is not None else None
