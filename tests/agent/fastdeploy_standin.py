"""A small stand-in for a FastDeploy server, following FastDeploy's documented V1 control API
(docs/features/weight_update.md, FastDeploy >= 2.6):

    POST /v1/pause            pause generation                              -> 200
    POST /v1/resume           resume generation                             -> 200
    GET  /v1/is_paused        -> 200 {"is_paused": bool}
    POST /v1/update_weights   {"version", "verify_checksum"?, "rsync_config"?}
                              fails unless the engine is paused; never resumes by itself

It records every call so tests can check the agent's sequence. It is the only stand-in in
these tests: everything else is the real thing.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ckpt_agent.httpserver import AppServer


class FastDeployStandIn:
    def __init__(self, version: str = "v1") -> None:
        self.version = version
        self.paused = False
        self.calls: list[tuple[str, Any]] = []
        self.failing_versions: set[str] = set()
        app = web.Application()
        app.router.add_post("/v1/pause", self._pause)
        app.router.add_post("/v1/resume", self._resume)
        app.router.add_get("/v1/is_paused", self._is_paused)
        app.router.add_post("/v1/update_weights", self._update_weights)
        self.server = AppServer(app, "127.0.0.1", 0)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    async def _pause(self, request: web.Request) -> web.Response:
        self.calls.append(("pause", None))
        self.paused = True
        return web.json_response({"is_paused": True})

    async def _resume(self, request: web.Request) -> web.Response:
        self.calls.append(("resume", None))
        self.paused = False
        return web.json_response({"is_paused": False})

    async def _is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": self.paused})

    async def _update_weights(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("update_weights", body))
        if not self.paused:
            return web.json_response({"error": "engine must be paused before update_weights"}, status=400)
        if body.get("version") in self.failing_versions:
            return web.json_response(
                {"error": f"rsync of {body['version']} failed: checksum error"}, status=500
            )
        self.version = body["version"]
        return web.json_response({"version": self.version})
