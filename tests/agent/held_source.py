"""A source that sends a version's tensor bytes only as far as the test allows: a load from it
stays running, tensor by tensor, until the test lets it go on (pipelined relay tests need a peer
that is still loading, without racing a fast source)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

from aiohttp import web

from ckpt_agent.formats.manifest import parse_manifest
from ckpt_agent.server.httpserver import AppServer
from ckpt_agent.source.serve import create_source_app
from ckpt_api.manifest import MANIFEST_NAME, TensorRecord

_PIECE = 1 << 16
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HeldSource:
    """`ckpt-rollout serve`'s app for `root`, except that each shard's bytes go out only up to
    the end of the tensors `allow` let through (nothing at first), all of them after `release`;
    `break_streams` makes the source fail: held reads are cut mid-body, new ones too."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._allowed: dict[tuple[str, str], int] = {}
        self._released = False
        self._broken = False
        self._changed = asyncio.Condition()
        app = create_source_app(root)
        app.middlewares.append(self._hold)
        self._server = AppServer(app, "127.0.0.1", 0)

    async def start(self) -> str:
        await self._server.start()
        return self._server.url

    @property
    def url(self) -> str:
        return self._server.url

    async def stop(self) -> None:
        await self.break_streams()
        await self._server.stop()

    def entries(self, version: str) -> list[TensorRecord]:
        """The version's tensors in the order a load reads them (by shard, then offset)."""
        manifest = parse_manifest((self.root / version / MANIFEST_NAME).read_bytes())
        return sorted(manifest.tensors, key=lambda e: (e.file, e.offset))

    async def allow(self, version: str, entry: TensorRecord) -> None:
        """Let `entry`'s shard go out up to the end of `entry` (and so every tensor before it)."""
        key = (version, entry.file)
        async with self._changed:
            self._allowed[key] = max(self._allowed.get(key, 0), entry.end)
            self._changed.notify_all()

    async def release(self) -> None:
        async with self._changed:
            self._released = True
            self._changed.notify_all()

    async def break_streams(self) -> None:
        async with self._changed:
            self._broken = True
            self._changed.notify_all()

    def _limit(self, version: str, file: str) -> int | None:
        """How far `file` may be sent now; None once the source is broken."""
        if self._broken:
            return None
        return 1 << 62 if self._released else self._allowed.get((version, file), 0)

    @web.middleware
    async def _hold(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Shards of published versions are held; the rest (manifests, non-weight files, bad
        names) is served by the app as it is."""
        version, name = request.match_info.get("version"), request.match_info.get("file")
        if version is None or name is None:
            return await handler(request)
        manifest_path = self.root / version / MANIFEST_NAME
        path = self.root / version / name
        if name == MANIFEST_NAME or not manifest_path.is_file() or not path.is_file():
            return await handler(request)
        if name not in parse_manifest(manifest_path.read_bytes()).files:
            return await handler(request)
        return await self._held(request, version, name, path.read_bytes())

    def _may_send(self, version: str, file: str, pos: int) -> bool:
        limit = self._limit(version, file)
        return limit is None or limit > pos

    async def _held(self, request: web.Request, version: str, name: str, data: bytes) -> web.StreamResponse:
        wanted = request.http_range
        start, stop = wanted.start or 0, len(data) if wanted.stop is None else min(wanted.stop, len(data))
        resp = web.StreamResponse(status=206)
        resp.content_length = stop - start
        resp.headers["Content-Range"] = f"bytes {start}-{stop - 1}/{len(data)}"
        await resp.prepare(request)
        pos = start
        while pos < stop:
            async with self._changed:
                await self._changed.wait_for(partial(self._may_send, version, name, pos))
                limit = self._limit(version, name)
            if limit is None:
                # Headers are out: the reader sees its stream end early, as from a failing source.
                if request.transport is not None:
                    request.transport.close()
                return resp
            upto = min(stop, limit, pos + _PIECE)
            await resp.write(data[pos:upto])
            pos = upto
        await resp.write_eof()
        return resp
