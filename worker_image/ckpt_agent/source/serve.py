"""`ckpt-rollout serve ROOT`: serve published versions over HTTP.

The URL layout mirrors the directory layout (`/<version>/manifest.json`, `/<version>/<shard>`),
so agents can equally pull from any static file server. Shards go out with Range support and
sendfile (aiohttp's FileResponse), so serving costs no userspace copies.

With `--mooncake tcp|rdma` the same port also answers `GET /v1/mooncake/<version>` (the
manifest plus the addresses of the version's shards, mapped and registered with this process's
Mooncake engine): agents given `mooncake://host:port` then read the bytes with the engine.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from ckpt_agent.common.errors import LoadError
from ckpt_agent.transport.mooncake.export import ExportCache
from ckpt_api.manifest import MANIFEST_NAME, is_valid_file_name
from ckpt_api.versions import validate_version
from ckpt_api.vocabulary import ErrorCode

ROOT: web.AppKey[Path] = web.AppKey("root", Path)
MOONCAKE: web.AppKey[ExportCache] = web.AppKey("mooncake", ExportCache)
_FILE_CHUNK = 1 << 20  # used only where sendfile is unavailable (e.g. TLS)


def _not_found(message: str) -> web.Response:
    return web.json_response({"error": ErrorCode.NOT_FOUND, "message": message}, status=404)


async def serve_file(request: web.Request) -> web.StreamResponse:
    version = request.match_info["version"]
    name = request.match_info["file"]
    try:
        validate_version(version)
    except ValueError as exc:
        return web.json_response({"error": ErrorCode.INVALID_VERSION, "message": str(exc)}, status=400)
    if name != MANIFEST_NAME and not is_valid_file_name(name):
        return web.json_response(
            {"error": ErrorCode.INVALID_PATH, "message": f"bad file name {name!r}"}, status=400
        )
    path = request.app[ROOT] / version / name
    if not path.is_file():
        what = "version" if not path.parent.is_dir() else "file"
        return _not_found(f"{what} not found: {version}/{name}")
    return web.FileResponse(path, chunk_size=_FILE_CHUNK)


async def list_versions(request: web.Request) -> web.Response:
    root = request.app[ROOT]
    versions = (
        sorted(p.name for p in root.iterdir() if (p / MANIFEST_NAME).is_file()) if root.is_dir() else []
    )
    return web.json_response({"versions": versions})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


async def mooncake_descriptor(request: web.Request) -> web.Response:
    version = request.match_info["version"]
    try:
        validate_version(version)
    except ValueError as exc:
        return web.json_response({"error": ErrorCode.INVALID_VERSION, "message": str(exc)}, status=400)
    if not (request.app[ROOT] / version).is_dir():
        return _not_found(f"version not found: {version}")
    try:
        descriptor = await asyncio.to_thread(request.app[MOONCAKE].descriptor, version)
    except FileNotFoundError:
        return _not_found(f"version not found: {version}")
    except LoadError as exc:
        return web.json_response({"error": exc.reason, "message": exc.message}, status=409)
    return web.json_response(descriptor.to_json())


def create_source_app(root: Path, mooncake: ExportCache | None = None) -> web.Application:
    app = web.Application()
    app[ROOT] = root
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", list_versions)
    app.router.add_get("/{version}/{file}", serve_file)
    if mooncake is not None:
        app[MOONCAKE] = mooncake
        app.router.add_get("/v1/mooncake/{version}", mooncake_descriptor)

        async def close(_app: web.Application) -> None:
            mooncake.close()

        app.on_cleanup.append(close)
    return app
