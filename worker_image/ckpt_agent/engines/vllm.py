"""Adapter for a co-located vLLM server started with VLLM_SERVER_DEV_MODE=1, through the
endpoints vLLM documents for RL weight updates:

    POST /pause?mode=abort&clear_cache=true   pause generation, abort in-flight requests and
                                              drop KV/prefix cache (stale after new weights)
    POST /collective_rpc  {"method": "reload_weights", "kwargs": {"weights_path": <dir>}}
                          every worker reloads its weights in place from the directory
                          -> 200 {"results": [...]} (one entry per worker)
    POST /resume                              resume generation (always sent after a pause)
    GET  /is_paused                           {"is_paused": bool}

vLLM has no weight-version query: success is the 200 of the reload with a result from every
worker. The agent stages (pulls + verifies) the version into a local directory first.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckpt_agent.engines.base import LoadJob
from ckpt_agent.engines.disk_staged import DiskStagedEngine, EngineHttp
from ckpt_agent.errors import LoadError, Reason


class VLLMEngine(DiskStagedEngine):
    name = "vllm"

    def __init__(
        self,
        base_url: str,
        staging_root: Path,
        *,
        control_timeout: float = 30.0,
        update_timeout: float = 1800.0,
        **staging: Any,
    ) -> None:
        super().__init__(staging_root, **staging)
        self._http = EngineHttp(base_url, "vLLM")
        self._control_timeout = control_timeout
        self._update_timeout = update_timeout

    async def start(self) -> None:
        await self._http.start()

    async def close(self) -> None:
        await self._http.close()

    async def pause(self) -> None:
        params = {"mode": "abort", "clear_cache": "true"}
        await self._http.call("POST", "/pause", params=params, limit_s=self._control_timeout)

    async def resume(self) -> None:
        await self._http.call("POST", "/resume", limit_s=self._control_timeout)

    async def is_paused(self) -> bool:
        _, body = await self._http.call("GET", "/is_paused", limit_s=self._control_timeout)
        if not isinstance(body, dict) or not isinstance(body.get("is_paused"), bool):
            raise LoadError(Reason.ENGINE_ERROR, f"vLLM /is_paused returned {body!r}")
        return bool(body["is_paused"])

    async def apply(self, job: LoadJob, path: Path) -> None:
        body = {"method": "reload_weights", "kwargs": {"weights_path": str(path)}}
        _, reply = await self._http.call("POST", "/collective_rpc", body, limit_s=self._update_timeout)
        results = reply.get("results") if isinstance(reply, dict) else None
        if not isinstance(results, list) or not results:
            raise LoadError(Reason.ENGINE_ERROR, f"vLLM reload_weights of {job.version} returned {reply!r}")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "url": self._http.base_url, "staging": str(self.staged_path())}
