"""The agent's control endpoints as a drop-in for FastDeploy's: its envelope, its status codes and
its synchronous update_weights, for FastDeploy's clients; the operator's asynchronous rollout
calls beside them, unchanged.

FastDeploy (upstream commit c1b7c083da606ed7f3ac35c2f905dc904f1163b2) answers `POST /v1/pause`,
`POST /v1/resume`, `GET /v1/is_paused` and `POST /v1/update_weights` with
`{request_id, status: "success"|"error", error_message, result}` and an HTTP status equal to its
internal code, and its update_weights answers once every rank has loaded. The agent does the
same, with two differences a FastDeploy client never has to care about:

- update_weights does not need a prior pause (FastDeploy answers 500 without one): the agent
  pauses around the apply itself, and keeps a pause the caller took.
- `version` is required (400 naming it): FastDeploy falls back to `<model_dir>/version.yaml`, and a
  published checkpoint tree records no newest version to fall back to (`publish` writes no
  pointer and no timestamp; a source lists its versions by name, which is no order).

A request with a `rollout`, or with `Prefer: respond-async` (RFC 7240), is the operator's
protocol: 202 at once (UpdateAccepted / ErrorBody), then /v1/status or the CR.
"""

from __future__ import annotations

import asyncio
import uuid

from aiohttp import web
from multidict import MultiMapping

from ckpt_agent.common.errors import LoadError
from ckpt_agent.service.service import AgentService, LoadEnd, Reply
from ckpt_api.agent_api import (
    LOAD_FAILURE_STATUS,
    PREFER_HEADER,
    PREFERENCE_APPLIED_HEADER,
    RESPOND_ASYNC,
    SYNC_TIMEOUT_STATUS,
    WEIGHTS_LOST_STATUS,
    ControlStatus,
    ErrorBody,
    LoadFailure,
    PauseReply,
    PauseState,
    RankResult,
    UpdateWeightsReply,
    UpdateWeightsRequest,
)

# FastDeploy's API server waits this long for its engine, then answers 500 itself (c1b7c08,
# engine_client.py: asyncio.wait_for(..., timeout=600)); a synchronous call here waits as long.
DEFAULT_SYNC_TIMEOUT_S = 600.0
# FastDeploy's success text (common_engine.py: ControlResponse(request_id, 200, "Success", ...)).
SUCCESS_MESSAGE = "Success"
# The remote engine failed a pause call: the same code ErrorBody answers had for it.
ENGINE_CONTROL_FAILED = 502


def prefers_async(headers: MultiMapping[str]) -> bool:
    """RFC 7240: `Prefer` may repeat, and each holds comma-separated preferences, each maybe
    with a value and `;` parameters (`respond-async, wait=10`)."""
    preferences = (p for value in headers.getall(PREFER_HEADER, ()) for p in value.split(","))
    return any(p.split(";", 1)[0].split("=", 1)[0].strip().lower() == RESPOND_ASYNC for p in preferences)


def is_async(req: UpdateWeightsRequest, headers: MultiMapping[str]) -> bool:
    return req.rollout is not None or prefers_async(headers)


def _request_id() -> str:
    # FastDeploy's form (api_server.py: f"control-{uuid.uuid4()}"), so logs line up.
    return f"control-{uuid.uuid4()}"


def _envelope(
    model: type[PauseReply] | type[UpdateWeightsReply], code: int, message: str, result: object
) -> web.Response:
    body = model.model_validate(
        {
            "request_id": _request_id(),
            "status": ControlStatus.SUCCESS if code == 200 else ControlStatus.ERROR,
            "error_message": message,
            "result": result,
        }
    )
    return web.json_response(body.to_wire(), status=code)


def pause_reply(state: PauseState) -> web.Response:
    return _envelope(PauseReply, 200, SUCCESS_MESSAGE, state)


def pause_failed(exc: LoadError) -> web.Response:
    return _envelope(PauseReply, ENGINE_CONTROL_FAILED, f"{exc.reason}: {exc.message}", None)


def async_reply(reply: Reply, preferred: bool) -> web.Response:
    # RFC 7240 §3: say that the preference was honoured.
    headers = {PREFERENCE_APPLIED_HEADER: RESPOND_ASYNC} if preferred and reply.status == 202 else None
    return web.json_response(reply.body.to_wire(), status=reply.status, headers=headers)


def _live(service: AgentService) -> str | None:
    return service.live.version if service.live else None


async def update_synchronously(
    service: AgentService, req: UpdateWeightsRequest, timeout_s: float
) -> web.Response:
    """Start the load, answer when it has ended (or after `timeout_s`, leaving it running)."""
    reply = service.request_update(req)
    if reply.status == 200:
        live = service.live
        rank = RankResult(
            version=req.version,
            rank=0,
            sync_cost=0.0,
            update_cost=0.0,
            total_cost=0.0,
            bytes=0,
            checksum_verified=bool(live and live.checksum_verified),
        )
        return _envelope(UpdateWeightsReply, 200, SUCCESS_MESSAGE, [rank])
    if reply.load is None:
        assert isinstance(reply.body, ErrorBody)
        return _envelope(UpdateWeightsReply, reply.status, f"{reply.body.error}: {reply.body.message}", None)
    # asyncio.wait, not wait_for: neither our timeout nor a client that hangs up may cancel the
    # load; it ends as it would for an asynchronous call.
    done, _ = await asyncio.wait({reply.load}, timeout=timeout_s)
    if not done:
        message = (
            f"the load of {req.version} is still running after {timeout_s:.0f}s; "
            "GET /v1/status says how it ends"
        )
        return _envelope(UpdateWeightsReply, SYNC_TIMEOUT_STATUS, message, None)
    return _ended(service, reply.load.result())


def _ended(service: AgentService, end: LoadEnd) -> web.Response:
    if end.error is None:
        rank = RankResult(
            version=end.version,
            rank=0,
            sync_cost=round(end.seconds - end.paused_seconds, 6),
            update_cost=round(end.paused_seconds, 6),
            total_cost=round(end.seconds, 6),
            bytes=end.bytes,
            checksum_verified=end.checksum_verified,
        )
        return _envelope(UpdateWeightsReply, 200, SUCCESS_MESSAGE, [rank])
    error = end.error
    code = WEIGHTS_LOST_STATUS if error.weights_lost else LOAD_FAILURE_STATUS.get(error.reason, 500)
    failure = LoadFailure(reason=error.reason, version=_live(service), weights_lost=error.weights_lost)
    return _envelope(UpdateWeightsReply, code, f"{error.reason}: {error.message}", failure)
