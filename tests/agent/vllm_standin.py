"""A stand-in for a vLLM 0.33.0 OpenAI server's dev-mode routes (VLLM_SERVER_DEV_MODE=1),
rebuilt from that version's code (vllm/entrypoints/launchers/api_server/routers.py,
entrypoints/rl/online/api_router.py, entrypoints/serve/dev/rpc/api_router.py,
entrypoints/serve/dev/server_info/api_router.py, entrypoints/serve/middleware/authenticate.py,
v1/engine/core.py, model_executor/model_loader/reload/inplace.py and layerwise.py):

    POST /pause?mode=abort|wait|keep&clear_cache=true|false -> {"status": "paused"}
    POST /resume                                  -> {"status": "resumed"}
    GET  /is_paused                               -> {"is_paused": bool}
    POST /collective_rpc {"method", "args"?, "kwargs"?}
                         -> {"results": [<one per worker>]}; a worker's error is a 500
    POST /update_weight_version {"new_version"}   -> {"success": true, "new_version"}
    GET  /weight_info                             -> {"weight_version"} ("default" at start)
    GET  /server_info?config_format=json          -> {"vllm_config": {...}, ...}
    GET  /version, GET /health                    (always present)
    POST /v1/completions {"prompt", "max_tokens" = 16, "model"?, ...}   (always present)
                         -> {"id", "object": "text_completion", "created", "model",
                             "choices": [{"index", "text", "finish_reason", "stop_reason", ...}],
                             "usage"}; an empty prompt is 400
                         (entrypoints/openai/completion/protocol.py CompletionRequest/Response)

Without dev mode the dev routes do not exist (404). `--api-key` guards only /v1 (401
{"error": "Unauthorized"}); the dev routes stay open. While paused (abort or wait) new requests
get 503. Errors use vLLM's envelope {"error": {"message", "type", "param", "code"}}, with file
paths in messages replaced by <path>; bad parameters are 400.

`reload_weights(weights_path=...)` points the worker's model config at the path (never
reverted), takes every layer's values away (layerwise reload), then loads tensors one by one:
a failure part way (an injected fault, or a missing directory, found only once reading starts)
leaves the rest uninitialised and answers 500, the process alive. A completed reload gives
layers that received no weights their old values back. It never changes the weight version.
`weights_path_kwarg=False` plays vLLM <= 0.15 (TypeError), `weight_version_routes=False` a
vLLM before vllm-project/vllm#49040; a `dummy` load format cannot reload (NotImplementedError).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from ckpt_agent.server.httpserver import AppServer
from ckpt_e2e.standins.engine import (
    UNINITIALISED,
    Generator,
    ModelWeights,
    holds_nan,
    iter_tensors,
    weight_files,
)

PAUSE_MODES = ("abort", "wait", "keep")
_PATH = re.compile(r"(?<![\w<])/[\w.\-/]+")


def _error(message: str, status: int, kind: str) -> web.Response:
    body = {"error": {"message": _PATH.sub("<path>", message), "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)


def _worker_failed(exc: BaseException) -> web.Response:
    message = (
        f"Call to collective_rpc method failed: Worker failed with error '{exc}', please check the "
        "stack trace above for the root cause"
    )
    return _error(message, 500, "Internal Server Error")


class VLLMStandIn:
    def __init__(
        self,
        *,
        version: str = "0.33.0",
        dev_mode: bool = True,
        weights_path_kwarg: bool = True,
        weight_version_routes: bool = True,
        boot_path: str = "Qwen/Qwen3-0.6B",
        boot_dir: Path | None = None,
        load_format: str = "auto",
        revision: str | None = None,
        api_key: str | None = None,
        workers: int = 2,
        model_dir: bool = False,
    ) -> None:
        self.model_dir = model_dir  # refuse directories it could not boot from (ckpt_e2e.standins.engine)
        self.version = version
        self.boot_path = boot_path
        self.load_format = load_format
        self.revision = revision
        self.api_key = api_key
        self.workers = workers
        self._weights_path_kwarg = weights_path_kwarg
        self.weights = ModelWeights(boot_path, boot_dir)
        self.worker_model = boot_path  # the workers' model_config.model
        self.weight_version = "default"
        self.paused: str | None = None
        self.prefix_cache_resets = 0
        self.calls: list[tuple[str, Any]] = []
        self.resumed_with: list[frozenset[str]] = []
        self.unmounted: tuple[str, ...] = ()  # paths vLLM's container does not see
        self.generator = Generator()  # what /v1/completions answers (set `fault` for garbage)
        app = web.Application()
        app.router.add_get("/version", self._version)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/completions", self._completions)
        if dev_mode:
            app.router.add_post("/pause", self._pause)
            app.router.add_post("/resume", self._resume)
            app.router.add_get("/is_paused", self._is_paused)
            app.router.add_post("/collective_rpc", self._collective_rpc)
            app.router.add_get("/server_info", self._server_info)
            if weight_version_routes:
                app.router.add_post("/update_weight_version", self._update_weight_version)
                app.router.add_get("/weight_info", self._weight_info)
        self.server = AppServer(app, "127.0.0.1", 0)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    async def _version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self.version})

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _completions(self, request: web.Request) -> web.Response:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if self.api_key is not None and (scheme.lower() != "bearer" or token != self.api_key):
            return web.json_response({"error": "Unauthorized"}, status=401)
        if self.paused in ("abort", "wait"):
            return _error("The engine is paused; retry later", 503, "Service Unavailable")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error("Invalid JSON body", 400, "Bad Request")
        prompt = body.get("prompt") if isinstance(body, dict) else None
        if not prompt:
            return _error(
                "Either prompt or prompt_embeds must be provided and non-empty.", 400, "Bad Request"
            )
        max_tokens = body.get("max_tokens", 16)
        self.generator.requests.append(body)
        text, finish, tokens = await self.generator.generate(max_tokens, holds_nan(self.weights))
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
            "token_ids": None,
            "prompt_logprobs": None,
            "prompt_token_ids": None,
        }
        prompt_tokens = len(str(prompt).split())
        return web.json_response(
            {
                "id": f"cmpl-{uuid.uuid4().hex}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or self.boot_path,
                "choices": [choice],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "total_tokens": prompt_tokens + tokens,
                    "completion_tokens": tokens,
                },
            }
        )

    async def _pause(self, request: web.Request) -> web.Response:
        self.calls.append(("pause", dict(request.query)))
        mode = request.query.get("mode", "abort")
        clear = request.query.get("clear_cache", "true").lower()
        if mode not in PAUSE_MODES or clear not in ("true", "false", "1", "0"):
            return _error(f"invalid query {dict(request.query)}", 400, "Bad Request")
        if clear in ("true", "1") and mode != "keep":
            self.prefix_cache_resets += 1
        self.paused = mode
        return web.json_response({"status": "paused"})

    async def _resume(self, request: web.Request) -> web.Response:
        self.calls.append(("resume", None))
        self.paused = None
        self.resumed_with.append(self.weights.sources())
        return web.json_response({"status": "resumed"})

    async def _is_paused(self, request: web.Request) -> web.Response:
        self.calls.append(("is_paused", None))
        return web.json_response({"is_paused": self.paused is not None})

    async def _collective_rpc(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            return _error("Invalid JSON body", 400, "Bad Request")
        if not isinstance(body, dict) or not isinstance(body.get("method"), str):
            return _error("Request body must be an object with a 'method'", 400, "Bad Request")
        self.calls.append(("collective_rpc", body))
        if body["method"] != "reload_weights":
            return _worker_failed(AttributeError(f"'Worker' object has no attribute {body['method']!r}"))
        kwargs = body.get("kwargs") or {}
        if "weights_path" in kwargs and not self._weights_path_kwarg:
            return _worker_failed(
                TypeError("reload_weights() got an unexpected keyword argument 'weights_path'")
            )
        if self.load_format == "dummy":
            return _worker_failed(NotImplementedError("Model reloading with `dummy` format"))
        if kwargs.get("weights_path") is not None:
            self.worker_model = kwargs["weights_path"]
        try:
            self._reload(self.worker_model)
        except Exception as exc:
            return _worker_failed(exc)
        return web.json_response({"results": [None] * self.workers})

    def _reload(self, path: str) -> None:
        weights = self.weights
        kept, kept_origin = dict(weights.tensors), dict(weights.origin)
        for name in weights.tensors:
            weights.tensors[name], weights.origin[name] = None, UNINITIALISED

        def tensors() -> Any:  # lazy, like vLLM's weights iterator: a bad path fails here
            yield from iter_tensors(weight_files(path, self.unmounted, model_dir=self.model_dir))

        weights.load(path, tensors())
        for name, origin in weights.origin.items():
            if origin == UNINITIALISED:  # finalize: a layer no checkpoint tensor reached
                weights.tensors[name], weights.origin[name] = kept[name], kept_origin[name]

    async def _update_weight_version(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("new_version"), str):
            return _error("Field required: new_version", 400, "Bad Request")
        self.calls.append(("update_weight_version", body))
        self.weight_version = body["new_version"]
        return web.json_response({"success": True, "new_version": self.weight_version})

    async def _weight_info(self, request: web.Request) -> web.Response:
        self.calls.append(("weight_info", None))
        return web.json_response({"weight_version": self.weight_version})

    async def _server_info(self, request: web.Request) -> web.Response:
        self.calls.append(("server_info", dict(request.query)))
        config = {
            "model_config": {"model": self.boot_path, "model_weights": "", "revision": self.revision},
            "load_config": {"load_format": self.load_format},
        }
        if request.query.get("config_format", "text") == "text":
            return web.json_response({"vllm_config": str(config), "vllm_env": {}, "system_env": {}})
        return web.json_response({"vllm_config": config, "vllm_env": {}, "system_env": {}})
