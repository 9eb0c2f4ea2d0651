"""Adapter for a co-located FastDeploy server, driven through its documented V1 control API:

    POST /v1/pause            stop generation, abort in-flight requests
    POST /v1/update_weights   {"version", "verify_checksum"}: the engine pulls the version
                              itself (load_strategy=rsync); it must already be paused and
                              does not resume by itself
    POST /v1/resume           resume generation
    GET  /v1/is_paused        {"is_paused": bool}

Any 2xx is success; anything else is a failure whose body we quote. The agent always resumes
what it paused. When a source is known the manifest is fetched first, so an unknown version or
a digest mismatch is refused before the engine is paused.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp

from ckpt_agent.engines.base import LoadJob, LoadOutcome
from ckpt_agent.errors import LoadError, Reason
from ckpt_agent.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.pause_gate import LOAD, PauseGate
from ckpt_agent.reader import LoadProgress, fetch_manifest
from ckpt_agent.transport import open_transport

log = logging.getLogger(__name__)


class FastDeployEngine:
    name = "fastdeploy"
    supports_infer = False

    def __init__(
        self,
        base_url: str,
        *,
        control_timeout: float = 30.0,
        update_timeout: float = 1800.0,
        max_manifest_bytes: int = DEFAULT_MAX_MANIFEST_BYTES,
        resume_attempts: int = 3,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._control_timeout = control_timeout
        self._update_timeout = update_timeout
        self._max_manifest = max_manifest_bytes
        self._resume_attempts = resume_attempts
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._session = aiohttp.ClientSession()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(
        self, method: str, path: str, body: dict[str, Any] | None = None, *, limit_s: float
    ) -> Any:
        assert self._session is not None, "engine not started"
        url = self.base_url + path
        try:
            async with self._session.request(
                method, url, json=body, timeout=aiohttp.ClientTimeout(total=limit_s)
            ) as resp:
                text = await resp.text()
                if resp.status // 100 != 2:
                    raise LoadError(
                        Reason.ENGINE_ERROR, f"FastDeploy {path} answered HTTP {resp.status}: {text[:500]}"
                    )
                return await resp.json(content_type=None) if text.strip() else None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise LoadError(Reason.ENGINE_ERROR, f"FastDeploy {path} failed: {exc!r}") from None

    async def pause(self) -> None:
        await self._call("POST", "/v1/pause", limit_s=self._control_timeout)

    async def resume(self) -> None:
        # Resuming is what gives traffic back; retry briefly before declaring the engine stuck.
        for attempt in range(1, self._resume_attempts + 1):
            try:
                await self._call("POST", "/v1/resume", limit_s=self._control_timeout)
                return
            except LoadError:
                if attempt == self._resume_attempts:
                    raise
                log.warning("FastDeploy resume failed (attempt %d), retrying", attempt)
                await asyncio.sleep(0.2 * attempt)

    async def is_paused(self) -> bool:
        body = await self._call("GET", "/v1/is_paused", limit_s=self._control_timeout)
        if not isinstance(body, dict) or not isinstance(body.get("is_paused"), bool):
            raise LoadError(Reason.ENGINE_ERROR, f"FastDeploy /v1/is_paused returned {body!r}")
        return bool(body["is_paused"])

    async def load(self, job: LoadJob, gate: PauseGate, progress: LoadProgress) -> LoadOutcome:
        digest: str | None = None
        nbytes = 0
        if job.source_uri is not None:
            transport = open_transport(job.source_uri)
            try:
                manifest, digest = await asyncio.to_thread(
                    fetch_manifest,
                    transport,
                    job.version,
                    expected_digest=job.manifest_digest,
                    max_bytes=self._max_manifest,
                )
            finally:
                transport.close()
            nbytes = manifest.total_bytes
            progress.bytes_total = nbytes
        updated = False
        try:
            async with gate.hold(LOAD):
                await self._call(
                    "POST",
                    "/v1/update_weights",
                    {"version": job.version, "verify_checksum": job.verify_checksum},
                    limit_s=self._update_timeout,
                )
                updated = True
        except LoadError as exc:
            if updated:
                raise LoadError(
                    Reason.ENGINE_ERROR, f"{job.version} loaded but resuming FastDeploy failed: {exc.message}"
                ) from exc
            raise
        progress.bytes_done = nbytes
        return LoadOutcome(nbytes, job.verify_checksum, digest)

    async def infer(self) -> list[float]:
        raise NotImplementedError("FastDeploy serves its own OpenAI-compatible API")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.base_url}
