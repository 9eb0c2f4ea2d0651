"""The relay endpoints of an agent, under its port and its auth:

    GET /v1/relay/<version>/manifest.json   the original manifest bytes
    GET /v1/relay/<version>/<shard>         shard bytes in the original layout, Range supported
                                            (the layout `HttpTransport` reads)
    GET /v1/relay/<version>/<extra file>    a non-weight file (config, tokenizer, index), as
                                            verified; also how a Mooncake peer serves these
    GET /v1/relay/<version>/<shard>?ready=a-b  {"ready", "complete"}: whether a running load
                                            verified every tensor of bytes [a, b) (waits up to 5 s)
    GET /v1/mooncake/<version>              Mooncake descriptor of the relay copy (when the agent
                                            runs with --relay-mooncake tcp|rdma)

Only the version this agent loaded and verified, while it is live, or the one it loads while
asked to relay it as it loads (its bytes as they land; `?ready=` and Mooncake: verified tensors):
anything else is 404 (the asking agent waits briefly for a peer that may be about to begin, then
falls back to the source); an agent that never relays (its engine keeps no copy, --no-relay, or
no Mooncake relay) answers 410, and the asking agent falls back at once.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable, Iterator

from aiohttp import web

from ckpt_agent.pipeline.relay_copy import NotReady, RelayCopy, RelayGone
from ckpt_agent.pipeline.relay_export import RelayExporter
from ckpt_agent.transport.mooncake.descriptor import Descriptor
from ckpt_api.constants import VERSION_PATTERN
from ckpt_api.manifest import MANIFEST_NAME
from ckpt_api.vocabulary import ErrorCode

log = logging.getLogger(__name__)

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")
_VERSION = re.compile(VERSION_PATTERN)

CurrentCopy = Callable[[], RelayCopy | None]

# How long one wait for a tensor of a running load lasts before it looks again (`?ready=` answers
# then, false); a stream waits as long as the load runs.
READY_WAIT_S = 5.0


def _not_relayable(message: str) -> web.Response:
    return web.json_response({"error": ErrorCode.NOT_RELAYABLE, "message": message}, status=404)


def _copy_for(current: CurrentCopy, version: str) -> RelayCopy | web.Response:
    copy = current()
    if copy is None or copy.released or copy.version != version:
        live = f"relaying {copy.version}" if copy is not None and not copy.released else "relaying nothing"
        return _not_relayable(f"this agent does not relay {version} ({live})")
    return copy


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end) of a single `bytes=a-b` range, clamped to the size; None for no/bad Range."""
    match = _RANGE.fullmatch(header or "")
    if not match:
        return None
    start = int(match.group(1))
    end = int(match.group(2)) + 1 if match.group(2) else size
    return start, min(end, size)


async def _stream(
    request: web.Request, copy: RelayCopy, file: str, start: int, end: int, status: int
) -> web.StreamResponse:
    size = copy.file_size(file) or 0
    pieces: Iterator[bytes | memoryview | NotReady] = copy.iter_range(file, start, end)
    done = object()

    async def next_piece() -> object:
        # Reading a piece may copy from the live parameters under the engine lock or fault in a
        # staging file's pages: off-loop, unless the copy is in host memory.
        while True:
            piece = next(pieces, done) if copy.in_memory else await asyncio.to_thread(next, pieces, done)
            if not isinstance(piece, NotReady):
                return piece
            # A tensor the running load has not verified yet: wait here, on the loop (no thread
            # held), as long as the load lives; the reader's own timeout bounds its wait.
            await copy.wait_until(piece.ready, READY_WAIT_S)

    try:
        piece = await next_piece()
    except RelayGone as exc:
        return _not_relayable(str(exc))
    resp = web.StreamResponse(status=status)
    resp.content_length = end - start
    resp.content_type = "application/octet-stream"
    if status == 206:
        resp.headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    await resp.prepare(request)
    try:
        while piece is not done:
            assert isinstance(piece, bytes | memoryview)
            # The view itself: the transport sends from it (or copies what the socket did not
            # take), and holds it, so the copy's memory outlives the write.
            await resp.write(piece)
            piece = await next_piece()
        await resp.write_eof()
    except ConnectionResetError:
        pass  # the reader went away (e.g. it found a bad checksum and fell back)
    except RelayGone as exc:
        # Headers are out: cut the body short, the reader sees a truncated shard and falls back.
        log.info("relay of %s/%s stopped: %s", copy.version, file, exc)
        if request.transport is not None:
            request.transport.close()
    return resp


async def _readiness(copy: RelayCopy, file: str, wanted: str, size: int) -> web.Response:
    """`?ready=<start>-<end>`: whether every tensor of that byte range is verified, answered once
    it is or after READY_WAIT_S. What a Mooncake reader asks before reading registered memory
    that a running load may still be filling (an http reader just streams)."""
    match = re.fullmatch(r"(\d+)-(\d+)", wanted)
    if not match or int(match.group(1)) >= int(match.group(2)):
        return web.json_response(
            {"error": ErrorCode.INVALID_REQUEST, "message": "ready=<start>-<end>, start < end"}, status=400
        )
    start, end = int(match.group(1)), min(int(match.group(2)), size)
    try:
        ready = await copy.wait_until(lambda: copy.ready_between(file, start, end), READY_WAIT_S)
    except RelayGone as exc:
        return _not_relayable(str(exc))
    return web.json_response({"ready": ready, "complete": copy.complete})


def _never(why: str) -> web.Response:
    # 410, not 404: a reader waits for a 404ing peer to begin relaying (it may be called in the
    # same moment), and must not wait for one that never will.
    return web.json_response(
        {"error": ErrorCode.NOT_RELAYABLE, "message": f"this agent does not relay: {why}"}, status=410
    )


def add_relay_routes(
    app: web.Application, current: CurrentCopy, exporter: RelayExporter | None, *, never: str | None = None
) -> None:
    def refused(version: str, why: str | None) -> web.Response | None:
        """404 for a name no version has, then 410 if this agent (or transport) never relays."""
        if not _VERSION.fullmatch(version):
            return _not_relayable(f"{version!r} is not a version name")
        return None if why is None else _never(why)

    async def relay_file(request: web.Request) -> web.StreamResponse:
        version, file = request.match_info["version"], request.match_info["file"]
        if (answer := refused(version, never)) is not None:
            return answer
        copy = _copy_for(current, version)
        if isinstance(copy, web.Response):
            return copy
        if file == MANIFEST_NAME:
            return web.Response(body=copy.manifest_raw, content_type="application/json")
        size = copy.file_size(file)
        if size is None:
            return web.json_response(
                {"error": ErrorCode.NOT_FOUND, "message": f"{version} has no file {file}"}, status=404
            )
        if "ready" in request.query:
            return await _readiness(copy, file, request.query["ready"], size)
        wanted = _parse_range(request.headers.get("Range"), size)
        if wanted is None:
            return await _stream(request, copy, file, 0, size, 200)
        start, end = wanted
        if start >= size or start >= end:
            return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
        return await _stream(request, copy, file, start, end, 206)

    async def mooncake_descriptor(request: web.Request) -> web.Response:
        version = request.match_info["version"]
        why = never or (
            None if exporter is not None else "not over mooncake (start it with --relay-mooncake)"
        )
        if (answer := refused(version, why)) is not None:
            return answer
        assert exporter is not None
        copy = _copy_for(current, version)
        if isinstance(copy, web.Response):
            return copy
        try:
            descriptor: Descriptor = await asyncio.to_thread(exporter.descriptor, copy)
        except RelayGone as exc:
            return _not_relayable(str(exc))
        return web.json_response(descriptor.to_json())

    app.router.add_get("/v1/relay/{version}/{file}", relay_file)
    app.router.add_get("/v1/mooncake/{version}", mooncake_descriptor)
