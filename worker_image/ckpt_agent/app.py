"""The agent's HTTP API (FastDeploy V1 control names plus status, infer and metrics)."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from ckpt_agent.auth import Authenticator, auth_middleware, bearer_token
from ckpt_agent.engines.base import EngineUnavailable
from ckpt_agent.errors import LoadError, RequestError
from ckpt_agent.relay.export import RelayExporter
from ckpt_agent.relay.http import add_relay_routes
from ckpt_agent.service import AgentService
from ckpt_agent.update_request import RolloutRef, parse_rollout, parse_update_request

log = logging.getLogger(__name__)

SERVICE: web.AppKey[AgentService] = web.AppKey("service", AgentService)
# Update bodies are tiny; refusing big ones early keeps a misbehaving client cheap.
MAX_BODY_BYTES = 64 << 10

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as exc:
        return web.json_response(exc.to_json(), status=exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response({"error": exc.reason, "message": exc.text or exc.reason}, status=exc.status)
    except EngineUnavailable as exc:
        return web.json_response({"error": "EngineUnavailable", "message": str(exc)}, status=503)
    except LoadError as exc:
        # Only engine control calls (pause/resume on a remote engine) get here.
        return web.json_response({"error": exc.reason, "message": exc.message}, status=502)


async def _json_body(request: web.Request) -> object:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(f"body is not valid JSON: {exc}", field="body") from None


async def _pause_state(service: AgentService) -> web.Response:
    paused = await service.engine.is_paused()
    return web.json_response({"is_paused": paused, "paused_by": service.gate.holders})


async def update_weights(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    body: object = None
    try:
        body = await _json_body(request)
        req = parse_update_request(body)
    except RequestError as exc:
        service.reject(exc, *_version_and_rollout(body))
        raise
    reply = service.request_update(req, bearer_token(request.headers.get("Authorization")))
    return web.json_response(reply.body, status=reply.status)


def _version_and_rollout(body: object) -> tuple[object, RolloutRef | None]:
    """What a refused body says about itself, for reporting an invalid version to its CR."""
    if not isinstance(body, dict):
        return None, None
    try:
        rollout = parse_rollout(body.get("rollout"))
    except RequestError:
        rollout = None
    return body.get("version"), rollout


async def pause(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    await service.pause()
    return web.json_response(
        {"is_paused": await service.engine.is_paused(), "paused_by": service.gate.holders}
    )


async def resume(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    await service.resume()
    return web.json_response(
        {"is_paused": await service.engine.is_paused(), "paused_by": service.gate.holders}
    )


async def is_paused(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return web.json_response(
        {"is_paused": await service.engine.is_paused(), "paused_by": service.gate.holders}
    )


async def status(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE].status())


async def infer(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if not service.engine.supports_infer:
        raise RequestError(
            f"engine {service.engine.name} does not serve /v1/infer", reason="NotSupported", status=404
        )
    output = await service.engine.infer()
    return web.json_response({"version": service.live.version if service.live else None, "output": output})


async def metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    # From the pause holders, not the engine: a scrape must not fail when a remote engine is down.
    service.metrics.paused.set(1 if service.gate.holders else 0)
    return web.Response(body=service.metrics.render(), headers={"Content-Type": service.metrics.content_type})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"ok": True})


def create_app(
    service: AgentService, authenticator: Authenticator | None, relay_exporter: RelayExporter | None = None
) -> web.Application:
    """`authenticator=None` turns auth off; callers must ask for that explicitly (`--no-auth`).
    `relay_exporter`: serve the relay copy over Mooncake too (http relay is always there)."""

    def rejected(reason: str) -> None:
        service.metrics.auth_failures.labels(reason).inc()

    app = web.Application(
        middlewares=[error_middleware, auth_middleware(authenticator, rejected)],
        client_max_size=MAX_BODY_BYTES,
    )
    app[SERVICE] = service
    app.router.add_post("/v1/update_weights", update_weights)
    app.router.add_post("/v1/pause", pause)
    app.router.add_post("/v1/resume", resume)
    app.router.add_get("/v1/is_paused", is_paused)
    app.router.add_get("/v1/status", status)
    app.router.add_post("/v1/infer", infer)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    add_relay_routes(app, lambda: service.relay, relay_exporter)

    async def on_startup(_app: web.Application) -> None:
        await service.start()

    async def on_cleanup(_app: web.Application) -> None:
        await service.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
