"""`POST /v1/update_weights` bodies: the `ckpt_api` model plus what only this agent can check (a
transport for the source's scheme is here and usable), every failure a RequestError naming the
field (a 400, never a 500)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from ckpt_agent.common.errors import RequestError
from ckpt_agent.transport import check_uri
from ckpt_api.agent_api import CancelLoadRequest, RolloutRef, UpdateWeightsRequest
from ckpt_api.vocabulary import ErrorCode

__all__ = [
    "CancelLoadRequest",
    "RolloutRef",
    "UpdateWeightsRequest",
    "parse_cancel_request",
    "parse_rollout",
    "parse_update_request",
]

# When a body is wrong in several places, the field reported is the first of these: a bad version
# is reported to the CR as a failed update (InvalidVersion), which is only right when the rest of
# the request was fine.
_PRECEDENCE = ("rollout", "source", "verify_checksum", "version")
# Errors about the version's type, not its value: InvalidRequest, not InvalidVersion.
_TYPE_ERRORS = frozenset({"missing", "string_type"})


def _field(loc: tuple[int | str, ...], prefix: str) -> str:
    path = ".".join(str(part) for part in loc)
    if prefix:
        return f"{prefix}.{path}" if path else prefix
    return path or "body"


def _rank(error: ErrorDetails) -> int:
    head = error["loc"][0] if error["loc"] else ""
    return _PRECEDENCE.index(head) if head in _PRECEDENCE else -1


# FastDeploy falls back to <model_dir>/version.yaml when `version` is missing; a published tree
# records no newest version to fall back to (see ckpt_agent.server.control_api), so say why it is needed.
_VERSION_REQUIRED = (
    "version: required; the agent loads only a named version (a checkpoint source records "
    "no newest one to default to)"
)


def _message(error: ErrorDetails, field: str) -> str:
    if field == "version" and error["type"] == "missing":
        return _VERSION_REQUIRED
    ctx = error.get("ctx") or {}
    if error["type"] == "value_error" and "error" in ctx:
        # Our own validators' messages name the field already.
        return str(ctx["error"])
    return f"{field}: {error['msg']}"


def request_error(exc: ValidationError, prefix: str = "") -> RequestError:
    errors = sorted(exc.errors(include_input=False, include_url=False), key=_rank)
    first = errors[0]
    field = _field(first["loc"], prefix)
    message = _message(first, field)
    if len(errors) > 1:
        message += "; also invalid: " + ", ".join(_field(e["loc"], prefix) for e in errors[1:])
    if field == "version" and first["type"] not in _TYPE_ERRORS:
        return RequestError(message, field=field, reason=ErrorCode.INVALID_VERSION)
    return RequestError(message, field=field)


def parse_rollout(value: Any) -> RolloutRef | None:
    if value is None:
        return None
    try:
        return RolloutRef.model_validate(value)
    except ValidationError as exc:
        raise request_error(exc, "rollout") from None


def parse_update_request(body: Any) -> UpdateWeightsRequest:
    """Validate a decoded JSON body. Unknown top-level keys are ignored (FastDeploy clients send
    `rsync_config`); known keys must have exactly the documented types."""
    try:
        req = UpdateWeightsRequest.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc) from None
    if req.source is not None:
        try:
            # The model admits every scheme the contract names; this agent may lack one
            # (mooncake without its runtime) or refuse the URI's details (a port out of range).
            check_uri(req.source.uri)
        except ValueError as exc:
            raise RequestError(f"source.uri: {exc}", field="source.uri") from None
    return req


def parse_cancel_request(body: Any) -> CancelLoadRequest:
    """A `POST /v1/cancel_load` body (empty: {}), every failure a 400 naming the field."""
    try:
        return CancelLoadRequest.model_validate(body)
    except ValidationError as exc:
        raise request_error(exc) from None
