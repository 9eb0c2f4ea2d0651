"""`ckpt-rollout serve ROOT`: serve published versions over HTTP.

The URL layout mirrors the directory layout (`/<version>/manifest.json`, `/<version>/<shard>`),
so agents can equally pull from any static file server. Shards go out with Range support and
sendfile (aiohttp's FileResponse), so serving costs no userspace copies.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from ckpt_agent.manifest import MANIFEST_NAME, is_valid_file_name
from ckpt_api.versions import validate_version

ROOT: web.AppKey[Path] = web.AppKey("root", Path)
_FILE_CHUNK = 1 << 20  # used only where sendfile is unavailable (e.g. TLS)


def _not_found(message: str) -> web.Response:
    return web.json_response({"error": "NotFound", "message": message}, status=404)


async def serve_file(request: web.Request) -> web.StreamResponse:
    version = request.match_info["version"]
    name = request.match_info["file"]
    try:
        validate_version(version)
    except ValueError as exc:
        return web.json_response({"error": "InvalidVersion", "message": str(exc)}, status=400)
    if name != MANIFEST_NAME and not is_valid_file_name(name):
        return web.json_response({"error": "InvalidPath", "message": f"bad file name {name!r}"}, status=400)
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


def create_source_app(root: Path) -> web.Application:
    app = web.Application()
    app[ROOT] = root
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/", list_versions)
    app.router.add_get("/{version}/{file}", serve_file)
    return app
