"""Adapter for a co-located SGLang server, through its native HTTP API as SGLang 0.5.23 defines
it (sglang/srt/entrypoints/http_server.py, managers/io_struct.py, utils/auth.py):

    POST /pause_generation          {"mode": "abort" | "retract" | "in_place"}
    POST /update_weights_from_disk  {"model_path", "weight_version", "flush_cache", "keep_pause",
                                     "load_format"?}
                                    -> 200 {"success": true, "message"} | 400 {"success": false, ...}
    POST /continue_generation       {}
    GET  /model_info                {"model_path", "weight_version", ...}
    GET  /server_info               {**server_args, ..., "load_format", "version"}: the launch
                                    flags, load_format among them, rewritten by each successful
                                    load (what a disk update without one uses); /model_info has
                                    no load_format
    POST /generate                  {"text", "sampling_params": {"max_new_tokens", ...}}
                                    -> {"text", "output_ids", "meta_info": {"finish_reason":
                                        {"type": "stop" | "length" | "abort", ...}, ...}}
                                    (the smoke check after a load; schedule_batch.py FINISH_*)

Every route takes a JSON body (an empty one fails validation, answered 400). With `--api-key`
and/or `--admin-api-key` the server wants `Authorization: Bearer`: the three POST routes take
the admin key when the server has one (then only that key), else the api key; /model_info and
/server_info take the api key when there is one, else nothing.

What a load leaves, per SGLang's own code: refused before any weight is written (no model
loader for the format, no weights at the path, online updates unsupported) the old weights
stay; a failure while loading triggers SGLang's "rollback", which re-reads the *new* path, so
the server usually dies (or holds the new weights, answering 400). The agent therefore restores
the previous version itself (see disk_staged). On success SGLang's `model_path` and
`served_model_name` (what /v1/models lists) become the staged directory, so it must be mounted
at the same path in SGLang's container as in the agent's.

Pause modes: `abort` (default) aborts in-flight requests, so every response comes from one
version and the radix-cache flush after the load succeeds; `retract` requeues them and
recomputes after the load (no lost work, but a response may mix tokens of two versions);
`in_place` keeps their KV cache, which SGLang then refuses to flush (failing the update after
swapping weights), so the agent sends `flush_cache: false` and prefix-cache entries computed by
the old weights outlive the load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.engines.disk_staged import (
    DiskStagedEngine,
    DiskWeights,
    EngineMisconfigured,
    EngineRefused,
    reloadable_boot_path,
)
from ckpt_agent.pipeline.smoke import CALL_GRACE_S
from ckpt_api.agent_api import HealthCheckRequest

PauseMode = Literal["abort", "retract", "in_place"]
PAUSE_MODES: tuple[PauseMode, ...] = get_args(PauseMode)
DEFAULT_PAUSE_MODE: PauseMode = "abort"
_KEEPS_KV: PauseMode = "in_place"

DUMMY_FORMAT = "dummy"
# How SGLang 0.5.23's disk update starts its reply when it gave up before writing any weight
# (model_runner_components/weight_updater.py).
REFUSED_BEFORE_ANY_WEIGHT = (
    "Failed to get model loader",
    "Failed to get weights iterator",
    "Online weight updates are not supported",
)
_WORKER_SEPARATOR = " | "  # several workers' messages in one reply


class SGLangEngine(DiskStagedEngine):
    name = "sglang"
    label = "SGLang"

    def __init__(
        self,
        base_url: str,
        staging_root: Path,
        *,
        load_format: str | None = None,
        pause_mode: str = DEFAULT_PAUSE_MODE,
        api_key: str | None = None,
        admin_api_key: str | None = None,
        **options: Any,
    ) -> None:
        super().__init__(base_url, staging_root, **options)
        if pause_mode not in PAUSE_MODES:
            raise ValueError(f"SGLang pause mode must be one of {PAUSE_MODES}, got {pause_mode!r}")
        self.load_format = load_format
        self._pause_mode = pause_mode
        self._api_key = api_key or None
        self._admin_token = admin_api_key or api_key or None
        self._paused = False  # SGLang has no "is paused" query: we track what we asked for

    async def pause(self) -> None:
        body = {"mode": self._pause_mode}
        await self._http.call(
            "POST", "/pause_generation", body, limit_s=self._control_timeout, token=self._admin_token
        )
        self._paused = True

    async def resume(self) -> None:
        await self._http.call(
            "POST", "/continue_generation", {}, limit_s=self._control_timeout, token=self._admin_token
        )
        self._paused = False

    async def is_paused(self) -> bool:
        return self._paused

    async def probe(self, limit_s: float) -> tuple[DiskWeights | None, str | None]:
        url = self._http.base_url
        status, info = await self._http.call(
            "GET", "/model_info", limit_s=limit_s, ok_statuses=(401, 404), token=self._api_key
        )
        if status == 401:
            raise EngineMisconfigured(
                f"SGLang at {url} refused /model_info (HTTP 401): it runs with --api-key; "
                "give the agent that key with --sglang-api-key-file"
            )
        if status == 404:
            raise EngineMisconfigured(
                f"SGLang at {url} has no /model_info, where SGLang 0.5.23 reports weight_version: "
                "upgrade it (the adapter follows SGLang 0.5.23)"
            )
        if not isinstance(info, dict) or not isinstance(info.get("weight_version"), str):
            raise EngineMisconfigured(f"SGLang at {url}: /model_info has no weight_version: {info!r:.300}")
        boot_format = await self._server_load_format(limit_s)
        if boot_format == DUMMY_FORMAT and self.load_format is None:
            raise EngineMisconfigured(
                f"SGLang at {url} runs --load-format dummy, and a disk update without a load format "
                "uses the server's, which refuses every load (Failed to get model loader): start "
                "the agent with --sglang-load-format auto"
            )
        # An empty body fails SGLang's validation (model_path is required) after its auth
        # middleware has run: a check of the admin key and the route that changes nothing.
        status, _ = await self._http.call(
            "POST",
            "/update_weights_from_disk",
            {},
            limit_s=limit_s,
            ok_statuses=(400, 401, 404, 422),
            token=self._admin_token,
        )
        if status == 401:
            raise EngineMisconfigured(
                f"SGLang at {url} refused the agent's key for its admin routes (HTTP 401): give the "
                "agent --sglang-admin-api-key-file with the server's --admin-api-key (or, when the "
                "server has only --api-key, --sglang-api-key-file)"
            )
        if status not in (400, 422):
            raise EngineMisconfigured(
                f"SGLang at {url} answered HTTP {status} to an update_weights_from_disk without "
                "model_path: not the API of SGLang 0.5.23"
            )
        path = info.get("model_path")
        boot = DiskWeights(info["weight_version"], path if isinstance(path, str) else None, boot_format)
        why = reloadable_boot_path(path)
        if why is None and boot_format == DUMMY_FORMAT:
            why = "SGLang booted with dummy weights"
        return boot, why

    async def _server_load_format(self, limit_s: float) -> str | None:
        # SGLang reports its launch flags, --load-format among them, in /server_info only.
        url = self._http.base_url
        status, info = await self._http.call(
            "GET", "/server_info", limit_s=limit_s, ok_statuses=(404,), token=self._api_key
        )
        if status == 404:
            raise EngineMisconfigured(
                f"SGLang at {url} has no /server_info, where SGLang 0.5.23 reports its load format: "
                "upgrade it (the adapter follows SGLang 0.5.23)"
            )
        load_format = info.get("load_format") if isinstance(info, dict) else None
        return load_format if isinstance(load_format, str) else None

    async def apply(self, weights: DiskWeights) -> None:
        body: dict[str, Any] = {
            "model_path": weights.path,
            "weight_version": weights.version,
            "flush_cache": self._pause_mode != _KEEPS_KV,
            # The agent resumes only after it has confirmed (or restored) a version; without it
            # SGLang lets a retract/in_place pause go when the update ends (io_struct.py:
            # "Whether to keep the scheduler paused after weight update").
            "keep_pause": True,
        }
        if weights.load_format:
            body["load_format"] = weights.load_format
        # A refused load is HTTP 400 with {"success": false, "message"}: read it, do not just raise.
        status, reply = await self._http.call(
            "POST",
            "/update_weights_from_disk",
            body,
            limit_s=self._update_timeout,
            ok_statuses=(400, 401),
            token=self._admin_token,
        )
        if isinstance(reply, dict) and reply.get("success") is True:
            return
        if status == 401:  # refused by SGLang's auth middleware, before the route ran
            raise EngineRefused(f"SGLang refused the agent's admin key (HTTP 401) loading {weights}")
        message = str(reply.get("message") if isinstance(reply, dict) else reply)
        text = f"SGLang failed to load {weights} (HTTP {status}): {message[:500]}"
        # A validation error (its ErrorResponse has no "success") never reached the model.
        unchecked = isinstance(reply, dict) and "success" not in reply
        parts = message.split(_WORKER_SEPARATOR)
        if status == 400 and (
            unchecked or all(p.strip().startswith(REFUSED_BEFORE_ANY_WEIGHT) for p in parts)
        ):
            raise EngineRefused(text)
        raise LoadError(Reason.ENGINE_ERROR, text)

    async def confirm(self, weights: DiskWeights) -> None:
        _, info = await self._http.call(
            "GET", "/model_info", limit_s=self._control_timeout, token=self._api_key
        )
        reported = info.get("weight_version") if isinstance(info, dict) else None
        path = info.get("model_path") if isinstance(info, dict) else None
        if reported != weights.version or (weights.path is not None and path != weights.path):
            raise LoadError(
                Reason.ENGINE_ERROR,
                f"SGLang reports weight_version {reported!r} from {path!r}, expected {weights}",
            )

    async def generate(self, check: HealthCheckRequest) -> tuple[object, object]:
        # Greedy, so a good model answers the same way every time.
        body = {
            "text": check.prompt,
            "sampling_params": {"max_new_tokens": check.max_tokens, "temperature": 0},
        }
        _, reply = await self._http.call(
            "POST", "/generate", body, limit_s=check.timeout_seconds + CALL_GRACE_S, token=self._api_key
        )
        if not isinstance(reply, dict):
            return None, None
        meta = reply.get("meta_info")
        finish = meta.get("finish_reason") if isinstance(meta, dict) else None
        return reply.get("text"), finish.get("type") if isinstance(finish, dict) else finish

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "pause_mode": self._pause_mode, "load_format": self.load_format}
