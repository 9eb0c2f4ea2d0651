"""Adapter for a co-located vLLM server started with VLLM_SERVER_DEV_MODE=1, through the dev-mode
routes as vLLM 0.33.0 defines them (vllm/entrypoints/rl/online/api_router.py,
entrypoints/serve/dev/rpc/api_router.py, entrypoints/serve/dev/server_info/api_router.py):

    POST /pause?mode=abort&clear_cache=true   abort in-flight requests, drop the prefix cache;
                                              new requests get 503 until resumed
    POST /collective_rpc  {"method": "reload_weights",
                           "kwargs": {"weights_path": <dir>, "is_checkpoint_format": true}}
                          -> 200 {"results": [<one per worker>]}; a worker's error is a 500
    POST /update_weight_version {"new_version"}   the label vLLM reports (reload never sets it)
    GET  /weight_info                         {"weight_version"}
    POST /resume, GET /is_paused              {"is_paused": bool}
    GET  /version, GET /server_info?config_format=json   (start-up checks, boot weights)
    POST /v1/completions  {"prompt", "max_tokens", "temperature"}   the smoke check after a load
                          -> {"choices": [{"text", "finish_reason", ...}], ...}
                          (entrypoints/openai/completion/protocol.py; "model" may be left out:
                          the served model answers)

Without dev mode none of these routes exist (404). They are unauthenticated even when the
server has `--api-key` (vLLM checks keys only under /v1, /v2, /inference, /cohere): anyone who
reaches the port can reload or pause the engine, so restrict who reaches it (a NetworkPolicy, or
a proxy passing only the inference routes). `weights_path` exists since vLLM 0.16.0 (older
workers raise TypeError, a 500); `/update_weight_version` and `/weight_info` came later
(vllm-project/vllm#49040).

What a load leaves: vLLM reloads in place, layer by layer, with no rollback: a failure part way
leaves some layers new and others uninitialised, while /weight_info still names the old
version. Only the start-up load format is used (a `dummy` server cannot reload from disk). The
agent therefore restores the previous version itself (see disk_staged) and confirms it by the
reload's success on every worker plus the version label it sets: vLLM offers no read-back of
the weights. The served model name does not change.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.engines.disk_staged import (
    DiskStagedEngine,
    DiskWeights,
    EngineMisconfigured,
    EngineRefused,
    reloadable_boot_path,
)
from ckpt_agent.engines.engine_http import completion
from ckpt_api.agent_api import HealthCheckRequest

MIN_VERSION = (0, 16, 0)  # GPUModelRunner.reload_weights(weights_path=...)
DUMMY_FORMAT = "dummy"
PAUSE_PARAMS = {"mode": "abort", "clear_cache": "true"}
# How a worker's error names a call an older vLLM does not know, and a load format it cannot
# reload with: both raised before any weight is touched.
NO_WEIGHTS_PATH = "unexpected keyword argument 'weights_path'"
NO_RELOAD_FOR_FORMAT = "Model reloading with"
_VERSION = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?")

log = logging.getLogger(__name__)


def _minimum_version_error(found: str | None) -> str:
    which = f"vLLM {found}" if found else "this vLLM"
    return (
        f"{which} cannot reload weights from a directory: reload_weights(weights_path=...) needs "
        "vLLM >= 0.16.0 (the adapter follows vLLM 0.33.0)"
    )


def parse_version(text: object) -> tuple[int, int, int] | None:
    match = _VERSION.match(text) if isinstance(text, str) else None
    if match is None:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def _error_text(reply: Any) -> str:
    """The message of vLLM's error envelope {"error": {"message"}} (or {"error": str})."""
    error = reply.get("error") if isinstance(reply, dict) else reply
    if isinstance(error, dict):
        error = error.get("message", error)
    return str(error)


class VLLMEngine(DiskStagedEngine):
    name = "vllm"
    label = "vLLM"

    def __init__(
        self, base_url: str, staging_root: Path, *, api_key: str | None = None, **kwargs: Any
    ) -> None:
        """`api_key`: the server's --api-key, for the smoke check's /v1/completions (the dev-mode
        routes the load uses are not guarded by it)."""
        super().__init__(base_url, staging_root, **kwargs)
        self._api_key = api_key or None

    async def pause(self) -> None:
        await self._http.call("POST", "/pause", params=PAUSE_PARAMS, limit_s=self._control_timeout)

    async def resume(self) -> None:
        await self._http.call("POST", "/resume", limit_s=self._control_timeout)

    async def is_paused(self) -> bool:
        _, body = await self._http.call("GET", "/is_paused", limit_s=self._control_timeout)
        if not isinstance(body, dict) or not isinstance(body.get("is_paused"), bool):
            raise LoadError(Reason.ENGINE_ERROR, f"vLLM /is_paused returned {body!r}")
        return bool(body["is_paused"])

    async def probe(self, limit_s: float) -> tuple[DiskWeights | None, str | None]:
        url = self._http.base_url
        status, _ = await self._http.call("GET", "/is_paused", limit_s=limit_s, ok_statuses=(404,))
        if status == 404:
            raise EngineMisconfigured(
                f"vLLM at {url} has no /is_paused: start it with VLLM_SERVER_DEV_MODE=1 (vLLM serves "
                "its pause, reload and weight-version routes only in dev mode)"
            )
        status, body = await self._http.call("GET", "/version", limit_s=limit_s, ok_statuses=(404,))
        found = body.get("version") if status == 200 and isinstance(body, dict) else None
        parsed = parse_version(found)
        if parsed is not None and parsed < MIN_VERSION:
            raise EngineMisconfigured(_minimum_version_error(str(found)))
        status, info = await self._http.call("GET", "/weight_info", limit_s=limit_s, ok_statuses=(404,))
        if status == 404:
            raise EngineMisconfigured(
                f"vLLM {found or ''} at {url} has no /weight_info and /update_weight_version (added "
                "after 0.16.0, vllm-project/vllm#49040; the adapter follows vLLM 0.33.0): the agent "
                "could not set and confirm the version it loads"
            )
        version = info.get("weight_version") if isinstance(info, dict) else None
        if not isinstance(version, str):
            raise EngineMisconfigured(f"vLLM at {url}: /weight_info returned {info!r:.300}")
        config = await self._startup_config()
        model = config.get("model_config") or {}
        load = config.get("load_config") or {}
        if load.get("load_format") == DUMMY_FORMAT:
            raise EngineMisconfigured(
                f"vLLM at {url} runs --load-format dummy: reload_weights loads with the start-up "
                "format, and dummy cannot load from disk; start vLLM with a disk format (e.g. auto)"
            )
        path = model.get("model")
        why = reloadable_boot_path(path) if config else "vLLM's start-up config is unknown"
        if why is None and (model.get("model_weights") or model.get("revision")):
            why = "vLLM booted from a pulled or pinned model, which a reload by path would not reproduce"
        return DiskWeights(version, path if isinstance(path, str) else None), why

    async def _startup_config(self) -> dict[str, Any]:
        """vllm_config as the API server started (never changed by reloads), or {} if unknown."""
        try:
            status, body = await self._http.call(
                "GET",
                "/server_info",
                params={"config_format": "json"},
                limit_s=self._control_timeout,
                ok_statuses=(404,),
            )
        except LoadError as exc:
            # Only the boot weights' restore needs it (and its system report can be slow).
            log.warning("vLLM /server_info failed, its boot weights count as not reloadable: %s", exc.message)
            return {}
        config = body.get("vllm_config") if status == 200 and isinstance(body, dict) else None
        return config if isinstance(config, dict) else {}

    async def apply(self, weights: DiskWeights) -> None:
        assert weights.path is not None
        body = {
            "method": "reload_weights",
            "kwargs": {"weights_path": weights.path, "is_checkpoint_format": True},
        }
        status, reply = await self._http.call(
            "POST", "/collective_rpc", body, limit_s=self._update_timeout, ok_statuses=(400, 500, 501)
        )
        if status // 100 != 2:
            message = _error_text(reply)
            if NO_WEIGHTS_PATH in message:
                raise EngineRefused(f"{_minimum_version_error(None)}: {message[:300]}")
            if NO_RELOAD_FOR_FORMAT in message:
                raise EngineRefused(f"vLLM cannot reload its load format from disk: {message[:300]}")
            text = f"vLLM reload_weights of {weights} failed (HTTP {status}): {message[:500]}"
            if status == 400:  # the request itself was refused; no worker ran it
                raise EngineRefused(text)
            raise LoadError(Reason.ENGINE_ERROR, text)
        results = reply.get("results") if isinstance(reply, dict) else None
        if not isinstance(results, list) or not results:
            raise LoadError(Reason.ENGINE_ERROR, f"vLLM reload_weights of {weights} returned {reply!r:.300}")
        _, reply = await self._http.call(
            "POST", "/update_weight_version", {"new_version": weights.version}, limit_s=self._control_timeout
        )
        if not isinstance(reply, dict) or reply.get("success") is not True:
            raise LoadError(Reason.ENGINE_ERROR, f"vLLM /update_weight_version returned {reply!r:.300}")

    async def generate(self, check: HealthCheckRequest) -> tuple[object, object]:
        return await completion(self._http, check, self._api_key)

    async def confirm(self, weights: DiskWeights) -> None:
        _, info = await self._http.call("GET", "/weight_info", limit_s=self._control_timeout)
        reported = info.get("weight_version") if isinstance(info, dict) else None
        if reported != weights.version:
            raise LoadError(
                Reason.ENGINE_ERROR, f"vLLM reports weight_version {reported!r}, expected {weights.version}"
            )
