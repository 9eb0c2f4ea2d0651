"""Adapter for a co-located SGLang server, through its documented native HTTP API:

    POST /pause_generation          {"mode": "abort"}: stop scheduling, abort in-flight requests
    POST /update_weights_from_disk  {"model_path", "weight_version", "load_format"?, "flush_cache"}
                                    -> {"success": bool, "message": str} (400 when not success);
                                    SGLang keeps the old weights when a load fails
    POST /continue_generation       resume scheduling (always sent after a pause)
    GET  /model_info (newer), /get_model_info, /get_weight_version  -> {"weight_version": ...}

The agent stages (pulls + verifies) the version into a local directory first, so SGLang reads
only verified bytes from local disk while paused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_agent.engines.base import LoadJob
from ckpt_agent.engines.disk_staged import DiskStagedEngine, EngineHttp
from ckpt_agent.errors import LoadError, Reason

# Where SGLang reports its weight version, newest API first.
VERSION_PATHS = ("/model_info", "/get_model_info", "/get_weight_version")


class SGLangEngine(DiskStagedEngine):
    name = "sglang"

    def __init__(
        self,
        base_url: str,
        staging_root: Path,
        *,
        load_format: str | None = None,
        control_timeout: float = 30.0,
        update_timeout: float = 1800.0,
        **staging: Any,
    ) -> None:
        super().__init__(staging_root, **staging)
        self._http = EngineHttp(base_url, "SGLang")
        self._load_format = load_format
        self._control_timeout = control_timeout
        self._update_timeout = update_timeout
        self._paused = False  # SGLang has no "is paused" query: we track what we asked for

    async def start(self) -> None:
        await self._http.start()

    async def close(self) -> None:
        await self._http.close()

    async def pause(self) -> None:
        await self._http.call("POST", "/pause_generation", {"mode": "abort"}, limit_s=self._control_timeout)
        self._paused = True

    async def resume(self) -> None:
        await self._http.call("POST", "/continue_generation", {}, limit_s=self._control_timeout)
        self._paused = False

    async def is_paused(self) -> bool:
        return self._paused

    async def apply(self, job: LoadJob, path: Path) -> None:
        body: dict[str, Any] = {"model_path": str(path), "weight_version": job.version, "flush_cache": True}
        if self._load_format:
            body["load_format"] = self._load_format
        # A refused load is HTTP 400 with {"success": false, "message"}: read it, do not just raise.
        status, reply = await self._http.call(
            "POST", "/update_weights_from_disk", body, limit_s=self._update_timeout, ok_statuses=(400,)
        )
        if not isinstance(reply, dict) or reply.get("success") is not True:
            message = reply.get("message") if isinstance(reply, dict) else reply
            raise LoadError(
                Reason.ENGINE_ERROR, f"SGLang refused {job.version} (HTTP {status}): {str(message)[:500]}"
            )

    async def confirm(self, job: LoadJob) -> None:
        reported = await self.weight_version()
        if reported != job.version:
            raise LoadError(
                Reason.ENGINE_ERROR, f"SGLang reports weight_version {reported!r} after loading {job.version}"
            )

    async def weight_version(self) -> str | None:
        for path in VERSION_PATHS:
            status, body = await self._http.call(
                "GET", path, limit_s=self._control_timeout, ok_statuses=(404,)
            )
            if status == 200 and isinstance(body, dict) and "weight_version" in body:
                version = body["weight_version"]
                return None if version is None else str(version)
        raise LoadError(Reason.ENGINE_ERROR, f"SGLang reports no weight_version at any of {VERSION_PATHS}")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "url": self._http.base_url, "staging": str(self.staged_path())}
