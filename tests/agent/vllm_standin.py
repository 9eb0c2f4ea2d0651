"""A stand-in for a vLLM server started with VLLM_SERVER_DEV_MODE=1, following the endpoints
vLLM documents for RL weight updates (docs/training/async_rl.md, docs/features/sleep_mode.md,
vllm/entrypoints/serve/rlhf/api_router.py):

    POST /pause?mode=abort|wait|keep&clear_cache=true|false   -> 200
    POST /resume                                               -> 200
    GET  /is_paused                                            -> 200 {"is_paused": bool}
    POST /collective_rpc {"method": "reload_weights", "kwargs": {"weights_path": dir}}
                         -> 200 {"results": [<one per worker>]}; 500 when a worker fails

`reload_weights` really loads the directory's *.safetensors (like every worker would).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from sglang_standin import load_dir

from ckpt_agent.httpserver import AppServer


class VLLMStandIn:
    def __init__(self, workers: int = 2) -> None:
        self.workers = workers
        self.weights: dict[str, np.ndarray] = {}
        self.paused = False
        self.calls: list[tuple[str, Any]] = []
        self.fail_reload = False
        app = web.Application()
        app.router.add_post("/pause", self._pause)
        app.router.add_post("/resume", self._resume)
        app.router.add_get("/is_paused", self._is_paused)
        app.router.add_post("/collective_rpc", self._collective_rpc)
        self.server = AppServer(app, "127.0.0.1", 0)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    async def _pause(self, request: web.Request) -> web.Response:
        self.calls.append(("pause", dict(request.query)))
        self.paused = True
        return web.json_response({"status": "paused"})

    async def _resume(self, request: web.Request) -> web.Response:
        self.calls.append(("resume", None))
        self.paused = False
        return web.json_response({"status": "resumed"})

    async def _is_paused(self, request: web.Request) -> web.Response:
        return web.json_response({"is_paused": self.paused})

    async def _collective_rpc(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("collective_rpc", body))
        if body.get("method") != "reload_weights":
            return web.json_response({"error": f"unknown method {body.get('method')!r}"}, status=400)
        try:
            if self.fail_reload:
                raise RuntimeError("worker 1: shape mismatch (stand-in)")
            self.weights = load_dir(Path(body["kwargs"]["weights_path"]))
        except Exception as exc:
            return web.json_response({"error": str(exc)}, status=500)
        return web.json_response({"results": [None] * self.workers})
