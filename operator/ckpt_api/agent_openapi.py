"""The agent's OpenAPI 3.1 document, assembled from the wire models in `ckpt_api.agent_api`.

The agent serves it at `GET /openapi.json` without authentication (as `/healthz`): it describes
only what this public source already says, and FastDeploy-style clients and API tools discover the
endpoints before they hold a token. A unit test checks that every route the agent registers is
listed in `ENDPOINTS`, and a schemathesis run checks the live agent against the document.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from ckpt_api.agent_api import (
    LOAD_FAILURE_STATUS,
    PREFER_HEADER,
    RESPOND_ASYNC,
    SYNC_TIMEOUT_STATUS,
    WEIGHTS_LOST_STATUS,
    AgentStatus,
    CancelLoadRequest,
    ErrorBody,
    Health,
    InferResult,
    LoadCancelled,
    PauseReply,
    UpdateAccepted,
    UpdateWeightsReply,
    UpdateWeightsRequest,
)
from ckpt_api.constants import VERSION_PATTERN

OPENAPI_PATH = "/openapi.json"
_JSON = "application/json"
_REF = "#/components/schemas/{model}"

# A response: (description, model, models it may be any of, a schema per media type, or None
# for no body).
Body = type[BaseModel] | tuple[type[BaseModel], ...] | dict[str, dict[str, Any]] | None


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    summary: str
    responses: dict[int, tuple[str, Body]]
    request: type[BaseModel] | None = None
    # False: the body may be left out (it then means `{}`).
    request_required: bool = True
    public: bool = False
    parameters: list[dict[str, Any]] = field(default_factory=list)

    @property
    def operation_id(self) -> str:
        return self.path.strip("/").replace("/", "_").replace("{", "").replace("}", "").replace(".", "_")


_ENGINE_ERRORS: dict[int, tuple[str, Body]] = {
    502: ("A remote engine refused the control call", ErrorBody),
    503: ("A remote engine cannot be reached", ErrorBody),
}
# FastDeploy's envelope for every answer of the pause calls, failures of a remote engine included.
_PAUSE: dict[int, tuple[str, Body]] = {
    200: ("The pause state after the call (`result.is_paused`)", PauseReply),
    502: ("A remote engine refused the control call", PauseReply),
}
_SYNC_FAILURES = {
    code: "Synchronous call: the load failed ("
    + ", ".join(r for r, c in LOAD_FAILURE_STATUS.items() if c == code)
    + ")"
    for code in sorted(set(LOAD_FAILURE_STATUS.values()) - {409})
}
_SYNC_FAILURES[WEIGHTS_LOST_STATUS] = "Synchronous call: the load failed and left no consistent weights"
_SYNC_FAILURES[SYNC_TIMEOUT_STATUS] = "Synchronous call: the load outlasted the wait; it goes on"
_PREFER_PARAM = {
    "name": PREFER_HEADER,
    "in": "header",
    "required": False,
    "schema": {"type": "string"},
    "description": f"`{RESPOND_ASYNC}`: answer 202 at once (as for a request with `rollout`) instead "
    "of when the load has ended",
}
_VERSION_PARAM = {
    "name": "version",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": VERSION_PATTERN},
}

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint(
        "post",
        "/v1/update_weights",
        "Load a version: asynchronous (202, then poll /v1/status or read the CR) for a request "
        "with `rollout` or `Prefer: respond-async`, otherwise synchronous in FastDeploy's envelope",
        {
            200: (
                "Asynchronous: the version is live already (noop). Synchronous: the version is live",
                (UpdateAccepted, UpdateWeightsReply),
            ),
            202: ("Asynchronous: the load started", UpdateAccepted),
            400: ("The body is invalid; `field` names the culprit", ErrorBody),
            403: ("The source is not one this agent may pull from (InvalidSource)", ErrorBody),
            409: (
                "Another load runs (LoadInProgress), or (synchronous) the manifest is not the pinned one",
                (ErrorBody, UpdateWeightsReply),
            ),
            413: ("The body is over 64 KiB", ErrorBody),
            **{code: (text, UpdateWeightsReply) for code, text in _SYNC_FAILURES.items()},
        },
        request=UpdateWeightsRequest,
        parameters=[_PREFER_PARAM],
    ),
    Endpoint(
        "post",
        "/v1/cancel_load",
        "Stop the running load (Cancelled): its reads are cut, the previous weights serve again and "
        "the engine resumes; answered once it ended (up to 10 s)",
        {
            200: ("The load was cancelled", LoadCancelled),
            400: ("The body is invalid; `field` names the culprit", ErrorBody),
            404: ("No load is running (NotFound)", ErrorBody),
            409: ("The load running is of another version than `version` (LoadInProgress)", ErrorBody),
            413: ("The body is over 64 KiB", ErrorBody),
        },
        request=CancelLoadRequest,
        request_required=False,
    ),
    Endpoint("post", "/v1/pause", "Pause the engine (held until /v1/resume)", _PAUSE),
    Endpoint("post", "/v1/resume", "Release the pause taken by /v1/pause", _PAUSE),
    Endpoint("get", "/v1/is_paused", "Whether the engine is paused, and by whom", _PAUSE),
    Endpoint(
        "get", "/v1/status", "Live version, load state and progress, last error", {200: ("", AgentStatus)}
    ),
    Endpoint(
        "post",
        "/v1/infer",
        "Outputs of the reference engine for its fixed input (a check that weights are live)",
        {
            200: ("", InferResult),
            404: ("The engine serves its own inference API (NotSupported)", ErrorBody),
            **_ENGINE_ERRORS,
        },
    ),
    Endpoint(
        "get",
        "/metrics",
        "Prometheus metrics",
        {200: ("Prometheus text exposition", {"text/plain": {"schema": {"type": "string"}}})},
    ),
    Endpoint("get", "/healthz", "Liveness", {200: ("", Health)}, public=True),
    Endpoint(
        "get",
        OPENAPI_PATH,
        "This document",
        {200: ("OpenAPI 3.1", {_JSON: {"schema": {"type": "object"}}})},
        public=True,
    ),
    Endpoint(
        "get",
        "/v1/relay/{version}/{file}",
        "A file of the version this agent relays to its peers (manifest.json or a shard)",
        {
            200: (
                "The whole file",
                {
                    "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
                    _JSON: {"schema": {"type": "object"}},
                },
            ),
            206: (
                "The requested byte range",
                {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}},
            ),
            400: ("A `ready` that is not `<start>-<end>` with start < end (InvalidRequest)", ErrorBody),
            404: ("This agent does not relay that version (NotRelayable) or file (NotFound)", ErrorBody),
            416: ("The range starts at or past the end of the file", None),
            410: (
                "This agent never relays: its engine keeps no copy, or --no-relay (NotRelayable)",
                ErrorBody,
            ),
        },
        parameters=[
            _VERSION_PARAM,
            {"name": "file", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}},
            {
                "name": "ready",
                "in": "query",
                "required": False,
                "schema": {"type": "string"},
                "description": "`<start>-<end>`: answer {ready, complete} instead of bytes: whether a load "
                "still running verified every tensor of that byte range (waits up to 5 s)",
            },
            {
                "name": "Range",
                "in": "header",
                "required": False,
                "schema": {"type": "string"},
                "description": "One `bytes=start-[end]` range; anything else reads the whole file",
            },
        ],
    ),
    Endpoint(
        "get",
        "/v1/mooncake/{version}",
        "Mooncake descriptor of the relayed version (agents started with --relay-mooncake)",
        {
            200: (
                "Where each shard's bytes lie in the exporting agent's registered memory",
                {
                    _JSON: {
                        "schema": {"type": "object", "required": ["manifest", "protocol", "session", "files"]}
                    }
                },
            ),
            404: ("This agent does not relay that version (NotRelayable)", ErrorBody),
            410: (
                "No relay over Mooncake here (no --relay-mooncake, or no relay at all) (NotRelayable)",
                ErrorBody,
            ),
        },
        parameters=[_VERSION_PARAM],
    ),
)

_AUTH_ERRORS: dict[int, tuple[str, Body]] = {
    401: ("No bearer token, or one that is not valid for this agent", ErrorBody),
    403: ("A valid token of a caller this agent does not allow", ErrorBody),
    503: (
        "The token could not be reviewed: the apiserver is away or not ready (AuthUnavailable; call again)",
        ErrorBody,
    ),
}


def _with_auth_errors(responses: dict[int, tuple[str, Body]]) -> dict[int, tuple[str, Body]]:
    merged = dict(responses)
    for code, (text, body) in _AUTH_ERRORS.items():
        # An endpoint's own answer with the same code (e.g. infer's 503) keeps its text first.
        if code not in merged:
            merged[code] = (text, body)
            continue
        own_text, own_body = merged[code]
        models = tuple(dict.fromkeys((*_body_models(own_body), *_body_models(body))))
        merged[code] = (f"{own_text}; or: {text}", models[0] if len(models) == 1 else models)
    return merged


def _body_models(body: Body) -> tuple[type[BaseModel], ...]:
    if isinstance(body, type):
        return (body,)
    return body if isinstance(body, tuple) else ()


def _models() -> tuple[list[type[BaseModel]], list[type[BaseModel]]]:
    requests = [e.request for e in ENDPOINTS if e.request is not None]
    responses = {
        model
        for e in ENDPOINTS
        for _, body in (*e.responses.values(), *_AUTH_ERRORS.values())
        for model in _body_models(body)
    }
    return requests, sorted(responses, key=lambda m: m.__name__)


def _content(body: Body) -> dict[str, Any] | None:
    if body is None:
        return None
    if isinstance(body, dict):
        return body
    refs = [{"$ref": _REF.format(model=model.__name__)} for model in _body_models(body)]
    return {_JSON: {"schema": refs[0] if len(refs) == 1 else {"anyOf": refs}}}


def _operation(endpoint: Endpoint) -> dict[str, Any]:
    responses = dict(endpoint.responses) if endpoint.public else _with_auth_errors(endpoint.responses)
    operation: dict[str, Any] = {
        "operationId": endpoint.operation_id,
        "summary": endpoint.summary,
        "responses": {},
    }
    if endpoint.public:
        operation["security"] = []
    if endpoint.parameters:
        operation["parameters"] = endpoint.parameters
    if endpoint.request is not None:
        operation["requestBody"] = {
            "required": endpoint.request_required,
            "content": {_JSON: {"schema": {"$ref": _REF.format(model=endpoint.request.__name__)}}},
        }
    for code in sorted(responses):
        description, body = responses[code]
        response: dict[str, Any] = {"description": description or "OK"}
        content = _content(body)
        if content is not None:
            response["content"] = content
        operation["responses"][str(code)] = response
    return operation


def openapi_document() -> dict[str, Any]:
    """The document as JSON-ready dicts (a fresh copy on every call)."""
    requests, responses = _models()
    _, schemas = models_json_schema(
        [(m, "validation") for m in requests] + [(m, "serialization") for m in responses],
        ref_template=_REF,
    )
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in ENDPOINTS:
        paths.setdefault(endpoint.path, {})[endpoint.method] = _operation(endpoint)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "ckpt-rollout agent",
            "version": "v1",
            "description": "Checkpoint loads for one inference worker, with FastDeploy's V1 control names.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas.get("$defs", {}),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "The operator's projected service-account token (TokenReview), "
                    "or the static token of --auth-token-file",
                }
            },
        },
        "security": [{"bearer": []}],
    }
