"""A stand-in for an SGLang 0.5.23 server's control API, rebuilt from that version's code
(sglang/srt/entrypoints/http_server.py, managers/io_struct.py, managers/tokenizer_manager.py,
managers/scheduler_components/weight_updater.py,
model_executor/model_runner_components/weight_updater.py, utils/auth.py):

    POST /pause_generation          {"mode": "abort"|"retract"|"in_place" = "abort"}
    POST /continue_generation       {"torch_empty_cache": bool = true}
    POST /update_weights_from_disk  {"model_path", "load_format"?, "weight_version"?,
                                     "flush_cache" = true, "abort_all_requests" = false,
                                     "keep_pause" = false}
                                    -> 200 {"success": true, "message", "num_paused_requests": 0}
                                     | 400 {"success": false, "message", ...}
    POST /update_weight_version     {"new_version", "abort_all_requests" = true}
    GET  /model_info, /get_model_info   {"model_path", "served_model_name", "weight_version", ...}
                                        (no load_format)
    GET  /server_info, /get_server_info {**server_args, **scheduler_info, "internal_states",
                                         "version"}: "model_path" and "load_format" are the
                                        launch flags until a load succeeds, then that load's
    POST /generate                  {"text", "sampling_params": {"max_new_tokens" = 128, ...}, ...}
                                    -> {"text", "output_ids", "meta_info": {"id", "finish_reason":
                                        {"type": "length", "length"} | {"type": "stop", "matched"}
                                        | {"type": "abort", "message"}, "prompt_tokens",
                                        "completion_tokens", ...}}   (a single text, no stream;
                                    managers/schedule_batch.py FINISH_* to_json)
    GET  /health                    (there is no /get_weight_version in 0.5.23: 404)

keep_pause: SGLang's io_struct.py UpdateWeightFromDiskReqInput declares it "Whether to keep the
scheduler paused after weight update" (default false). tokenizer_manager.py pause_generation
forwards retract/in_place (not abort) to the scheduler, so only those pauses are the scheduler's;
the stand-in ends them at the end of an update without keep_pause. The scheduler-side code that
reads keep_pause was not in the snapshots read (tokenizer_manager.py 001067ff,
scheduler_components/weight_updater.py 00a2ca2e, scheduler_update_weights_mixin.py 018c9109
never read it): this follows the field's declared meaning, not a read handler.

Where load_format is reported was checked against SGLang's http_server.py at commit 9c0549b7
(get_model_info: model_path, tokenizer_path, is_generation; get_server_info:
dataclasses.asdict(server_args) | scheduler_info | internal_states | version): the format is in
the server info only. The tokenizer manager fills an update's missing format from
server_args.load_format and, on success, writes the update's path and format back there
(tokenizer_manager.py _update_model_path_info), so both report the last successful load's.

As in 0.5.23: every body is required JSON, unknown fields are ignored, and a validation error
is 400 (not 422). Auth (only with an api key or an admin api key): the POST routes take the
admin key when there is one, else the api key; /model_info and /server_info take the api key if
there is one;
/health is open; 401 {"error": "Unauthorized"}.

A disk update resolves its load format (none: server_args.load_format, the launch flag or the
last successful load's; "dummy" is refused
with "Failed to get model loader"), points the runner's model path at the request's before any
check, refuses a missing directory ("Failed to get weights iterator", weights untouched), then
writes tensors one by one. A failure while writing runs SGLang's "rollback", which re-reads the
runner's model path, i.e. the *new* directory: if that fails as well the server dies (every
connection then closes unanswered), else it answers 400 holding the new weights. On success the
model path and served model name become the request's path and the weight version, if given,
is recorded; a flush refused because an `in_place` pause kept requests running fails the call
(400) with the new weights in place and only the scheduler's version changed.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Handler

from ckpt_agent.server.httpserver import AppServer
from ckpt_e2e.standins.engine import (
    Generator,
    ModelWeights,
    drop_connection,
    holds_nan,
    iter_tensors,
    weight_files,
)

VERSION = "0.5.23"
PAUSE_MODES = ("abort", "retract", "in_place")
# Modes the tokenizer manager forwards to the scheduler (abort only gates new requests there).
SCHEDULER_PAUSES = ("retract", "in_place")
LOAD_FORMATS = ("auto", "safetensors", "pt", "npcache", "dummy", "sharded_state", "gguf", "bitsandbytes")
ADMIN_ROUTES = {
    "/pause_generation",
    "/continue_generation",
    "/update_weights_from_disk",
    "/update_weight_version",
}
OPEN_PREFIXES = ("/health", "/ready", "/metrics")


class Invalid(Exception):
    """A request body SGLang's validation refuses."""


class Crashed(Exception):
    """The server died while handling the request."""


def _bad_request(message: str) -> web.Response:
    body = {"object": "error", "message": message, "type": "Bad Request", "param": None, "code": 400}
    return web.json_response(body, status=400)


class SGLangStandIn:
    def __init__(
        self,
        *,
        boot_path: str = "Qwen/Qwen3-0.6B",
        boot_dir: Path | None = None,
        weight_version: str = "default",
        load_format: str = "auto",
        api_key: str | None = None,
        admin_api_key: str | None = None,
        model_dir: bool = False,
    ) -> None:
        self._boot = (boot_path, boot_dir, weight_version, load_format)
        self.model_dir = model_dir  # refuse directories it could not boot from (ckpt_e2e.standins.engine)
        self.api_key = api_key
        self.admin_api_key = admin_api_key
        self.calls: list[tuple[str, Any]] = []
        self.auth: list[tuple[str, str | None]] = []  # (path, Authorization header) per request
        self.resumed_with: list[frozenset[str]] = []  # where the weights came from, at each continue
        # The same, each time an update without keep_pause let a retract/in_place pause go.
        self.resumed_by_update: list[frozenset[str]] = []
        self.unmounted: tuple[str, ...] = ()  # paths SGLang's container does not see
        self.crash_on: set[str] = set()  # routes whose call kills the server (a crash at that moment)
        self.generator = Generator()  # what /generate answers (set `fault` for garbage)
        self.boot()
        app = web.Application(middlewares=[self._middleware])
        app.router.add_post("/pause_generation", self._pause)
        app.router.add_post("/continue_generation", self._continue)
        app.router.add_post("/update_weights_from_disk", self._update)
        app.router.add_post("/update_weight_version", self._update_weight_version)
        app.router.add_get("/model_info", self._model_info)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/server_info", self._server_info)
        app.router.add_get("/get_server_info", self._server_info)
        app.router.add_get("/health", self._health)
        app.router.add_post("/generate", self._generate)
        self.app = app  # a subclass may add routes until the server starts
        self.server = AppServer(app, "127.0.0.1", 0)

    def boot(self) -> None:
        """Start (or, after a crash, restart) the server process: boot weights, not paused."""
        boot_path, boot_dir, weight_version, load_format = self._boot
        self.weights = ModelWeights(boot_path, boot_dir)
        self.model_path = self.served_model_name = self.runner_model_path = boot_path
        self.weight_version = self.scheduler_weight_version = weight_version
        self.load_format = load_format
        self.paused: str | None = None  # the pause mode while paused
        self.running_requests = 0  # requests holding KV cache (traffic in flight)
        self.dead = False

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    # -- plumbing --------------------------------------------------------------------------------
    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.dead:
            return drop_connection(request)
        header = request.headers.get("Authorization")
        self.auth.append((request.path, header))
        if not self._allowed(request.path, header):
            return web.json_response({"error": "Unauthorized"}, status=401)
        try:
            return await handler(request)
        except Invalid as exc:
            return _bad_request(str(exc))
        except Crashed:
            return drop_connection(request)

    def _allowed(self, path: str, header: str | None) -> bool:
        if path.startswith(OPEN_PREFIXES):
            return True

        def bearer(key: str) -> bool:
            scheme, _, token = (header or "").partition(" ")
            return scheme.lower() == "bearer" and token == key

        if path in ADMIN_ROUTES:
            key = self.admin_api_key or self.api_key
            return key is None or bearer(key)
        return self.api_key is None or bearer(self.api_key)

    async def _body(self, request: web.Request, route: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
        """The request's JSON object, recorded as a call (even one whose fields fail validation)."""
        if route in self.crash_on:
            self.dead = True
            raise Crashed
        raw = await request.read()
        try:
            body = json.loads(raw)
        except ValueError:
            raise Invalid("Field required: a JSON body") from None
        if not isinstance(body, dict):
            raise Invalid("Input should be an object")
        self.calls.append((route, body))
        for name in required:
            if not isinstance(body.get(name), str):
                raise Invalid(f"Field required: {name}")
        return body

    # -- routes ----------------------------------------------------------------------------------
    async def _pause(self, request: web.Request) -> web.Response:
        body = await self._body(request, "pause_generation")
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise Invalid(f"Input should be 'abort', 'retract' or 'in_place': mode={mode!r}")
        if mode != "in_place":  # aborted, or retracted to the waiting queue with their KV freed
            self.running_requests = 0
        self.paused = mode
        return web.json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def _continue(self, request: web.Request) -> web.Response:
        await self._body(request, "continue_generation")
        self.paused = None
        self.resumed_with.append(self.weights.sources())
        return web.json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def _update(self, request: web.Request) -> web.Response:
        body = await self._body(request, "update_weights_from_disk", required=("model_path",))
        response = self._load(request, body)
        if not self.dead and self.paused in SCHEDULER_PAUSES and not body.get("keep_pause"):
            # The scheduler's pause ends with the update: the requests it held run on whatever
            # the update left loaded, before any continue_generation.
            self.resumed_by_update.append(self.weights.sources())
        return response

    def _load(self, request: web.Request, body: dict[str, Any]) -> web.Response:
        path: str = body["model_path"]
        load_format = body.get("load_format") or self.load_format
        version = body.get("weight_version")
        if body.get("abort_all_requests"):
            self.running_requests = 0
        self.runner_model_path = path  # assigned before any check, never reverted
        if load_format not in LOAD_FORMATS:
            return self._crash(request)  # LoadFormat(...) raises in the scheduler
        if load_format == "dummy":
            return self._refused("Failed to get model loader: <DummyModelLoader>.")
        try:
            files = weight_files(path, self.unmounted, model_dir=self.model_dir)
        except Exception as exc:
            return self._refused(f"Failed to get weights iterator: {exc}.")
        try:
            self.weights.load(path, iter_tensors(files))
        except Exception as exc:
            message = f"Failed to update weights: {exc}.\nRolling back to original weights."
            again = self.runner_model_path
            try:
                self.weights.load(again, iter_tensors(weight_files(again, self.unmounted)))
            except Exception:
                return self._crash(request)  # the rollback's error escapes the scheduler
            return self._refused(message)
        if version is not None:
            self.scheduler_weight_version = version
        if body.get("flush_cache", True) and self.running_requests:
            return self._refused(
                "Weights were updated, but the cache was not flushed because requests are still "
                "running or queued. Retract or finish them, then call /flush_cache."
            )
        self.model_path = self.served_model_name = path
        self.load_format = load_format
        message = "Succeeded to update model weights."
        if version is not None:
            self.weight_version = version
            message += f" Weight version updated to {version}."
        return web.json_response({"success": True, "message": message, "num_paused_requests": 0})

    def _refused(self, message: str) -> web.Response:
        return web.json_response({"success": False, "message": message, "num_paused_requests": 0}, status=400)

    def _crash(self, request: web.Request) -> web.Response:
        self.dead = True  # SIGQUIT to the server's process group
        return drop_connection(request)

    async def _update_weight_version(self, request: web.Request) -> web.Response:
        body = await self._body(request, "update_weight_version", required=("new_version",))
        self.weight_version = self.scheduler_weight_version = body["new_version"]
        version = body["new_version"]
        return web.json_response(
            {"success": True, "message": f"Weight version updated to {version}", "new_version": version}
        )

    async def _model_info(self, request: web.Request) -> web.Response:
        self.calls.append(("model_info", None))
        return web.json_response(
            {
                "model_path": self.model_path,
                "served_model_name": self.served_model_name,
                "tokenizer_path": self._boot[0],
                "is_generation": True,
                "weight_version": self.weight_version,
                "model_type": "stand-in",
            }
        )

    async def _server_info(self, request: web.Request) -> web.Response:
        self.calls.append(("server_info", None))
        return web.json_response(
            {
                "model_path": self.model_path,
                "load_format": self.load_format,
                "internal_states": [{"weight_version": self.scheduler_weight_version}],
                "version": VERSION,
            }
        )

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response()

    async def _generate(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError:
            raise Invalid("Field required: a JSON body") from None
        if not isinstance(body, dict) or not isinstance(body.get("text"), str):
            raise Invalid("Either text, input_ids or input_embeds should be provided.")
        params = body.get("sampling_params") or {}
        max_new = params.get("max_new_tokens", 128)
        self.generator.requests.append(body)
        text, finish, tokens = await self.generator.generate(max_new, holds_nan(self.weights))
        reason: dict[str, Any] = {"type": finish}
        if finish == "length":
            reason["length"] = tokens
        elif finish == "stop":
            reason["matched"] = 151645  # the end-of-text token id
        else:
            reason["message"] = "Abort before prefill"
        meta = {
            "id": uuid.uuid4().hex,
            "finish_reason": reason,
            "prompt_tokens": len(body["text"].split()),
            "completion_tokens": tokens,
            "cached_tokens": 0,
            "weight_version": self.weight_version,
        }
        return web.json_response({"text": text, "output_ids": list(range(tokens)), "meta_info": meta})
