"""A stand-in for an SGLang server, following SGLang's documented native API
(docs/basic_usage/native_api.md, python/sglang/srt/entrypoints/http_server.py):

    POST /pause_generation          {"mode": "abort"|"retract"|"in_place"}       -> 200
    POST /continue_generation       {}                                            -> 200
    POST /update_weights_from_disk  {"model_path", "weight_version"?, "load_format"?, "flush_cache"?}
                                    -> 200 {"success": true, "message"} | 400 {"success": false, "message"};
                                    a failed load keeps the old weights
    GET  /get_model_info            {"model_path", "weight_version", ...}
    GET  /get_weight_version        {"weight_version"}   (older servers; newer ones moved it to /model_info)

It really loads the directory's *.safetensors with the `safetensors` library, so tests see the
exact tensors the engine would hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from aiohttp import web
from safetensors.numpy import load_file

from ckpt_agent.httpserver import AppServer


def load_dir(path: Path) -> dict[str, np.ndarray]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors in {path}")
    tensors: dict[str, np.ndarray] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    return tensors


class SGLangStandIn:
    def __init__(self, weight_version: str = "v1") -> None:
        self.weight_version: str | None = weight_version
        self.model_path = "boot-model"
        self.weights: dict[str, np.ndarray] = {}
        self.paused = False
        self.calls: list[tuple[str, Any]] = []
        self.failing_versions: set[str] = set()
        self.report_version: str | None = None  # a misbehaving engine: reports this instead
        app = web.Application()
        app.router.add_post("/pause_generation", self._pause)
        app.router.add_post("/continue_generation", self._continue)
        app.router.add_post("/update_weights_from_disk", self._update)
        app.router.add_get("/get_model_info", self._model_info)
        app.router.add_get("/get_weight_version", self._weight_version)
        self.server = AppServer(app, "127.0.0.1", 0)

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    async def _pause(self, request: web.Request) -> web.Response:
        self.calls.append(("pause_generation", await request.json()))
        self.paused = True
        return web.json_response({"message": "Generation paused"})

    async def _continue(self, request: web.Request) -> web.Response:
        self.calls.append(("continue_generation", None))
        self.paused = False
        return web.json_response({"message": "Generation continued"})

    async def _update(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.calls.append(("update_weights_from_disk", body))
        version = body.get("weight_version")
        try:
            if version in self.failing_versions:
                raise RuntimeError("CUDA out of memory (stand-in)")
            weights = load_dir(Path(body["model_path"]))
        except Exception as exc:
            message = f"Failed to update weights: {exc}. Rolling back to the original weights."
            return web.json_response({"success": False, "message": message}, status=400)
        self.weights, self.model_path = weights, body["model_path"]
        if version is not None:
            self.weight_version = version
        return web.json_response({"success": True, "message": "Succeeded to update model weights."})

    def _reported(self) -> str | None:
        return self.report_version or self.weight_version

    async def _model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model_path, "weight_version": self._reported()})

    async def _weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self._reported()})
