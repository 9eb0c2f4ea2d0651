"""A FastDeploy server stand-in, rebuilt from FastDeploy's code at upstream commit
c1b7c083da606ed7f3ac35c2f905dc904f1163b2 (entrypoints/openai/api_server.py routes,
engine/request.py ControlResponse, engine/common_engine.py `_control_*` handlers,
rl/dynamic_weight_manager.py, entrypoints/openai/middleware.py AuthenticationMiddleware):

    POST /v1/pause            re-entrant; result null
    POST /v1/resume           re-entrant; result null
    GET  /v1/is_paused        result {"is_paused": bool}
    POST /v1/update_weights   {"version"?, "verify_checksum"?}: 500 unless paused; synchronous:
                              answers once every tensor-parallel rank has loaded, result one
                              {sync_cost, update_cost, total_cost, version, rank} per rank;
                              never resumes
    POST /v1/completions      OpenAI-compatible (entrypoints/openai/protocol.py CompletionRequest,
                              CompletionResponse): {"prompt", "max_tokens"?, "model" = "default"}
                              -> {"id", "object": "text_completion", "created", "model",
                              "choices": [{"index", "text", "finish_reason", ...}], "usage"}

Every answer is the envelope {request_id: "control-<uuid4>", status, error_message, result}
with HTTP status = its code ("Success" on success). A wrong `version` / `verify_checksum` type
is a bare 400 {"error": "Invalid parameter type", "message"}; a body that is not JSON a 500 in
FastDeploy's global-handler shape; a missing `version` falls back to version.yaml
(`boot_version`), else 500. With API keys (`--api-key`), every /v1 path wants
`Authorization: Bearer <key>` (401 {"error": "Unauthorized"}). Control calls run one at a time,
as FastDeploy's engine runs them inline on one thread.

Each rank holds a version; a version listed in `failures` fails on the ranks named there,
leaving those ranks half-written (a mix, as FastDeploy's in-place writes leave) while the others
load it; `stale_ranks` answer success but keep their old weights; `silent_ranks[version]`
load that version but their result is missing from the reply (a rank whose answer was lost);
versions in `nan_versions` hold NaN weights (a generation then decodes empty text). Every engine
call is recorded in order, so tests can check the agent's sequence (generations are kept apart,
in `generator.requests`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ckpt_agent.server.httpserver import AppServer, serve_until_signalled
from ckpt_e2e.standins.engine import Generator

PAUSE_REQUIRED = "Pause LLM Engine first before calling updating weights"
NO_VERSION = (
    "rsync model version not set, please set it in 1) {model_version}/version.yaml "
    "or 2) interface arguments 'version'"
)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class MidLoadFailure:
    """A version whose load fails on `ranks` after they began writing it."""

    ranks: frozenset[int] = frozenset({0})
    message: str = "Invalid new_state_dict, update parameters failed"


def _half(old: str, new: str) -> str:
    return f"partial({old}->{new})"


class FastDeployStandIn:
    def __init__(
        self,
        version: str = "v1",
        *,
        tp: int = 1,
        api_keys: Sequence[str] = (),
        boot_version: str | None = None,
        port: int = 0,
    ) -> None:
        self.ranks: list[str] = [version] * tp  # what each rank's parameters hold
        self.paused = False
        self.boot_version = boot_version  # <model_dir>/version.yaml's step
        self.calls: list[tuple[str, Any]] = []
        self.failures: dict[str, MidLoadFailure] = {}
        self.stale_ranks: set[int] = set()
        self.silent_ranks: dict[str, set[int]] = {}
        self.nan_versions: set[str] = set()
        self.generator = Generator()  # what /v1/completions answers (set `fault` for garbage)
        # False: every pause is undone at once, as by another client's resume behind our back.
        self.pause_holds = True
        # Set by a test: update_weights waits for it (a load in progress, without sleeping).
        self.hold_update: asyncio.Event | None = None
        self.update_started = asyncio.Event()
        # Envelope fields left out of every control reply: c1b7c08 always writes all four, but
        # the agent decides on the HTTP status and `status` alone, and this checks it does.
        self.omit_fields: set[str] = set()
        self._digests = [hashlib.sha256(k.encode()).digest() for k in api_keys]
        self._engine = asyncio.Lock()
        app = web.Application(middlewares=[self._method_not_allowed, self._auth])
        app.router.add_post("/v1/pause", self._pause)
        app.router.add_post("/v1/resume", self._resume)
        app.router.add_get("/v1/is_paused", self._is_paused)
        app.router.add_post("/v1/update_weights", self._update_weights)
        app.router.add_get("/health", self._health)
        app.router.add_post("/v1/completions", self._completions)
        self.server = AppServer(app, "127.0.0.1", port)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    @property
    def commands(self) -> list[str]:
        """The calls that may change the engine (every one but is_paused queries)."""
        return [name for name in self.names if name != "is_paused"]

    @property
    def version(self) -> str | None:
        """The version every rank holds; None for a mix."""
        return self.ranks[0] if len(set(self.ranks)) == 1 else None

    # -- FastDeploy's HTTP layer ----------------------------------------------------------------
    @web.middleware
    async def _method_not_allowed(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed:
            return web.json_response({"detail": "Method Not Allowed"}, status=405)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self._digests or request.method == "OPTIONS" or not request.path.startswith("/v1"):
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        digest = hashlib.sha256(token.strip().encode()).digest()
        # Every key is compared, in constant time, as FastDeploy's middleware does.
        matches = [secrets.compare_digest(digest, key) for key in self._digests]
        if scheme.lower() != "bearer" or not any(matches):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    def _envelope(self, request_id: str, code: int, message: str | None, result: Any = None) -> web.Response:
        body = {
            "request_id": request_id,
            "status": "success" if code == 200 else "error",
            "error_message": message,
            "result": result,
        }
        for name in self.omit_fields:
            body.pop(name, None)
        return web.json_response(body, status=code)

    async def _control(self, method: str, args: dict[str, Any] | None) -> web.Response:
        request_id = f"control-{uuid.uuid4()}"
        async with self._engine:
            self.calls.append((method, args))
            try:
                result = await getattr(self, f"_control_{method}")(args or {})
            except Exception as exc:
                message = f"Failed to run control method {method}: {request_id} {exc}"
                return self._envelope(request_id, 500, message)
            return self._envelope(request_id, 200, "Success", result)

    async def _pause(self, request: web.Request) -> web.Response:
        return await self._control("pause", None)

    async def _resume(self, request: web.Request) -> web.Response:
        return await self._control("resume", None)

    async def _is_paused(self, request: web.Request) -> web.Response:
        return await self._control("is_paused", None)

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _completions(self, request: web.Request) -> web.Response:
        try:
            body = json.loads(await request.read())
        except ValueError as exc:
            error = {"message": str(exc), "type": "internal_error", "param": None, "code": None}
            return web.json_response({"error": error}, status=500)
        if not isinstance(body, dict) or not body.get("prompt"):
            error = {
                "message": "prompt is required",
                "type": "invalid_request_error",
                "param": None,
                "code": 400,
            }
            return web.json_response({"error": error}, status=400)
        self.generator.requests.append(body)
        nan = any(version in self.nan_versions for version in self.ranks)
        text, finish, tokens = await self.generator.generate(body.get("max_tokens") or 16, nan)
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "reasoning_content": None,
            "finish_reason": finish,
        }
        prompt_tokens = len(str(body["prompt"]).split())
        usage = {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens + tokens,
            "completion_tokens": tokens,
        }
        return web.json_response(
            {
                "id": f"cmpl-{uuid.uuid4()}",
                "object": "text_completion",
                "created": int(time.time()),
                "model": body.get("model") or "default",
                "choices": [choice],
                "usage": usage,
            }
        )

    async def _update_weights(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
            if not isinstance(body, dict):
                raise TypeError(f"'{type(body).__name__}' object has no attribute 'get'")
        except (ValueError, TypeError) as exc:
            error = {"message": str(exc), "type": "internal_error", "param": None, "code": None}
            return web.json_response({"error": error}, status=500)
        args: dict[str, Any] = {}
        for key, kind, word in (("version", str, "a string"), ("verify_checksum", bool, "a boolean")):
            value = body.get(key)
            if value is None:
                continue
            if not isinstance(value, kind):
                return web.json_response(
                    {"error": "Invalid parameter type", "message": f"{key} must be {word}"}, status=400
                )
            args[key] = value
        return await self._control("update_weights", args)

    # -- FastDeploy's engine (EngineService._control_*) -----------------------------------------
    async def _control_pause(self, args: dict[str, Any]) -> None:
        self.paused = self.pause_holds

    async def _control_resume(self, args: dict[str, Any]) -> None:
        self.paused = False

    async def _control_is_paused(self, args: dict[str, Any]) -> dict[str, bool]:
        return {"is_paused": self.paused}

    async def _control_update_weights(self, args: dict[str, Any]) -> list[dict[str, Any]]:
        if not self.paused:
            raise RuntimeError(PAUSE_REQUIRED)
        version = args.get("version") or self.boot_version
        if version is None:
            raise RuntimeError(NO_VERSION)
        started = time.monotonic()
        self.update_started.set()
        if self.hold_update is not None:
            await self.hold_update.wait()
        fault = self.failures.get(version)
        results = []
        for rank, old in enumerate(self.ranks):
            if rank in self.stale_ranks:
                results.append(self._rank(rank, old, started))
            elif fault is not None and rank in fault.ranks:
                self.ranks[rank] = _half(old, version)
            else:
                self.ranks[rank] = version
                if rank not in self.silent_ranks.get(version, set()):
                    results.append(self._rank(rank, version, started))
        if fault is not None and fault.ranks & set(range(len(self.ranks))):
            rank = min(fault.ranks)
            raise RuntimeError(
                f"Error response from ctrl_w2e_rank{rank}_{self.server.port}: Rank: {rank} Failed to run "
                f"control method update_weights: {fault.message}"
            )
        return results

    @staticmethod
    def _rank(rank: int, version: str, started: float) -> dict[str, Any]:
        total = time.monotonic() - started
        return {
            "sync_cost": total / 2,
            "update_cost": total / 2,
            "total_cost": total,
            "version": version,
            "rank": rank,
        }


def main(argv: list[str] | None = None) -> None:
    """`python fastdeploy_standin.py --port 8180 [--api-key K] [--tp 2]`: for FastDeploy's own
    client tests (FD_API_PORT) or by hand."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--port", type=int, default=8180)
    parser.add_argument("--version", default="v1")
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--api-key", action="append", default=[])
    args = parser.parse_args(argv)

    async def run() -> None:
        standin = FastDeployStandIn(args.version, tp=args.tp, api_keys=args.api_key, port=args.port)
        await serve_until_signalled(standin.server, "FastDeploy stand-in listening on")

    asyncio.run(run())


if __name__ == "__main__":
    main()
