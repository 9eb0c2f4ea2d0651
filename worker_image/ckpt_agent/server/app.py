"""The agent's HTTP API: FastDeploy's V1 control calls (see ckpt_agent.server.control_api for how they
follow FastDeploy's), plus status, infer, metrics and the relay."""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web

from ckpt_agent.common.errors import LoadError, RequestError
from ckpt_agent.engines.base import EngineUnavailable
from ckpt_agent.pipeline.relay_export import RelayExporter
from ckpt_agent.server import control_api
from ckpt_agent.server.auth import Authenticator, auth_middleware
from ckpt_agent.server.relay_routes import add_relay_routes
from ckpt_agent.server.update_request import (
    RolloutRef,
    parse_cancel_request,
    parse_rollout,
    parse_update_request,
)
from ckpt_agent.service.service import AgentService
from ckpt_api.agent_api import ErrorBody, Health, InferResult, PauseState
from ckpt_api.agent_openapi import OPENAPI_PATH, openapi_document
from ckpt_api.vocabulary import ErrorCode

log = logging.getLogger(__name__)

SERVICE: web.AppKey[AgentService] = web.AppKey("service", AgentService)
SYNC_TIMEOUT: web.AppKey[float] = web.AppKey("sync_timeout", float)
# Update bodies are tiny; refusing big ones early keeps a misbehaving client cheap.
MAX_BODY_BYTES = 64 << 10

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(body: ErrorBody, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body.to_wire(), status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except RequestError as exc:
        return _error(exc.body(), exc.status)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # 405 must keep its Allow header: clients (and schemathesis) learn the methods from it.
        kept = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return _error(ErrorBody(error=exc.reason, message=exc.text or exc.reason), exc.status, kept)
    except EngineUnavailable as exc:
        # Paused for a load or its smoke check: worth asking again in a moment.
        return _error(
            ErrorBody(error=ErrorCode.ENGINE_UNAVAILABLE, message=str(exc)), 503, {"Retry-After": "1"}
        )
    except LoadError as exc:
        # Only a remote engine's failure outside a load gets here (pause calls answer their own).
        return _error(ErrorBody(error=exc.reason, message=exc.message), 502)


async def _json_body(request: web.Request) -> object:
    raw = await request.read()
    if not raw:
        return {}
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        # ValueError covers bad UTF-8 and bad JSON, and also integers past Python's 4300-digit
        # limit; RecursionError: arrays nested thousands deep. Both fit in a 64 KiB body.
        raise RequestError(f"body is not valid JSON: {str(exc)[:200]}", field="body") from None


async def _pause_state(service: AgentService, *, ask_engine: bool) -> PauseState:
    # After its own pause or resume the agent knows the answer (paused while anyone holds the
    # gate); asking a remote engine again would only add a call.
    paused = await service.engine.is_paused() if ask_engine else bool(service.gate.holders)
    return PauseState(is_paused=paused, paused_by=service.gate.holders)


async def update_weights(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    body: object = None
    try:
        body = await _json_body(request)
        req = parse_update_request(body)
    except RequestError as exc:
        service.reject(exc, *_version_and_rollout(body))
        raise
    if control_api.is_async(req, request.headers):
        reply = service.request_update(req)
        return control_api.async_reply(reply, control_api.prefers_async(request.headers))
    return await control_api.update_synchronously(service, req, request.app[SYNC_TIMEOUT])


async def cancel_load(request: web.Request) -> web.Response:
    """Stop the running load: what an operator calls when it gives up on a worker (its wave
    aborted or timed out), so that the old weights serve and the agent takes the next call."""
    req = parse_cancel_request(await _json_body(request))
    status, body = await request.app[SERVICE].cancel_load(req.version)
    return web.json_response(body.to_wire(), status=status)


def _version_and_rollout(body: object) -> tuple[object, RolloutRef | None]:
    """What a refused body says about itself, for reporting an invalid version to its CR."""
    if not isinstance(body, dict):
        return None, None
    try:
        rollout = parse_rollout(body.get("rollout"))
    except RequestError:
        rollout = None
    return body.get("version"), rollout


async def _control(service: AgentService, action: Callable[[], Awaitable[None]] | None) -> web.Response:
    """Pause calls are re-entrant (the gate holds `user` once, however often it is asked) and
    serialised by the gate's lock, as FastDeploy's engine runs control calls one at a time."""
    try:
        if action is not None:
            await action()
        return control_api.pause_reply(await _pause_state(service, ask_engine=action is None))
    except LoadError as exc:
        return control_api.pause_failed(exc)


async def pause(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return await _control(service, service.pause)


async def resume(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    return await _control(service, service.resume)


async def is_paused(request: web.Request) -> web.Response:
    return await _control(request.app[SERVICE], None)


async def status(request: web.Request) -> web.Response:
    return web.json_response(request.app[SERVICE].status().to_wire())


async def infer(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    if not service.engine.supports_infer:
        raise RequestError(
            f"engine {service.engine.name} does not serve /v1/infer",
            reason=ErrorCode.NOT_SUPPORTED,
            status=404,
        )
    try:
        output = await service.engine.infer()
    except EngineUnavailable as exc:
        holders = service.gate.holders
        raise EngineUnavailable(f"{exc} (held by: {', '.join(holders)})" if holders else str(exc)) from None
    result = InferResult(version=service.live.version if service.live else None, output=output)
    return web.json_response(result.to_wire())


async def metrics(request: web.Request) -> web.Response:
    service = request.app[SERVICE]
    # From the pause holders, not the engine: a scrape must not fail when a remote engine is down.
    service.metrics.paused.set(1 if service.gate.holders else 0)
    return web.Response(body=service.metrics.render(), headers={"Content-Type": service.metrics.content_type})


async def healthz(request: web.Request) -> web.Response:
    return web.json_response(Health(ok=True).to_wire())


@functools.cache
def _openapi_body() -> bytes:
    # Once per process, on first use: the document depends on the code only, and the harness
    # runs thousands of agents in one process (6 ms and 19 KB each otherwise).
    return json.dumps(openapi_document()).encode()


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=_openapi_body(), content_type="application/json")


def create_metrics_app(service: AgentService) -> web.Application:
    """/metrics alone, without credentials: what Prometheus scrapes. Separate from the control
    port so that being allowed to read metrics never means being allowed to load weights."""
    app = web.Application(middlewares=[error_middleware])
    app[SERVICE] = service
    app.router.add_get("/metrics", metrics)
    return app


def create_app(
    service: AgentService,
    authenticator: Authenticator | None,
    relay_exporter: RelayExporter | None = None,
    *,
    sync_timeout_s: float = control_api.DEFAULT_SYNC_TIMEOUT_S,
    never_relays: str | None = None,
) -> web.Application:
    """`authenticator=None` turns auth off; callers must ask for that explicitly (`--no-auth`).
    `relay_exporter`: serve the relay copy over Mooncake too (http relay is always there).
    `sync_timeout_s`: how long a synchronous update_weights waits for its load.
    `never_relays`: why this agent serves no relay at all (its relay routes answer 410)."""

    def rejected(reason: str) -> None:
        service.metrics.auth_failures.labels(reason).inc()

    app = web.Application(
        middlewares=[error_middleware, auth_middleware(authenticator, rejected)],
        client_max_size=MAX_BODY_BYTES,
    )
    app[SERVICE] = service
    app[SYNC_TIMEOUT] = sync_timeout_s
    app.router.add_post("/v1/update_weights", update_weights)
    app.router.add_post("/v1/cancel_load", cancel_load)
    app.router.add_post("/v1/pause", pause)
    app.router.add_post("/v1/resume", resume)
    app.router.add_get("/v1/is_paused", is_paused)
    app.router.add_get("/v1/status", status)
    app.router.add_post("/v1/infer", infer)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get(OPENAPI_PATH, openapi)
    add_relay_routes(app, lambda: service.relay, relay_exporter, never=never_relays)

    async def on_startup(_app: web.Application) -> None:
        await service.start()

    async def on_cleanup(_app: web.Application) -> None:
        await service.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app
