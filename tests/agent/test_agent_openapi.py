"""The agent's OpenAPI document: valid OpenAPI 3.1, every route the app serves is in it (and
nothing else), its security claims hold, and it is served unauthenticated."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from agent_testkit import AgentClient, AgentFactory, Tree

from ckpt_agent.common.metrics import AgentMetrics
from ckpt_agent.config import AuthConfig
from ckpt_agent.engines.null import NullEngine
from ckpt_agent.server.app import create_app
from ckpt_agent.service.reporting import DisabledReporter
from ckpt_agent.service.service import AgentService
from ckpt_api.agent_openapi import ENDPOINTS, OPENAPI_PATH, openapi_document

TOKEN = "s3cret-token"


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_document_is_valid_openapi_3_1() -> None:
    doc = openapi_document()
    assert doc["openapi"] == "3.1.0"
    # Schemathesis checks the document against the OpenAPI 3.1 meta-schema.
    schemathesis.openapi.from_dict(doc).validate()
    schemas = doc["components"]["schemas"]
    for ref in set(_refs(doc)):
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.removeprefix("#/components/schemas/") in schemas, f"dangling {ref}"
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            assert operation["responses"], f"{method} {path} documents no response"
            params = {p["name"] for p in operation.get("parameters", []) if p["in"] == "path"}
            assert params == set(re.findall(r"{(\w+)}", path)), f"{method} {path} path parameters"


def test_every_routed_endpoint_is_documented_and_nothing_else() -> None:
    service = AgentService(
        NullEngine(),
        default_source=None,
        reporter=DisabledReporter(),
        metrics=AgentMetrics(),
        requires_source=False,
    )
    app = create_app(service, None)
    # aiohttp adds a HEAD route beside every GET by itself; HEAD is not part of the contract.
    routed = {
        (route.method.lower(), route.resource.canonical)
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"
    }
    documented = {(method, path) for path, ops in openapi_document()["paths"].items() for method in ops}
    assert routed == documented


def test_request_and_error_models_are_in_the_document() -> None:
    schemas = openapi_document()["components"]["schemas"]
    update = schemas["UpdateWeightsRequest"]
    assert update["required"] == ["version"]
    # Top level: FastDeploy clients' extra keys are accepted; nested objects refuse unknown keys.
    assert "additionalProperties" not in update
    assert schemas["SourceRef"]["additionalProperties"] is False
    assert schemas["RolloutRef"]["additionalProperties"] is False
    assert set(schemas["SourceRef"]["properties"]) == {"uri", "manifestDigest", "peer", "relayWhileLoading"}
    assert schemas["ErrorBody"]["required"] == ["error", "message"]
    responses = openapi_document()["paths"]["/v1/update_weights"]["post"]["responses"]
    assert {"200", "202", "400", "401", "403", "409", "413"} <= set(responses)


def test_fastdeploys_envelope_is_in_the_document() -> None:
    doc = openapi_document()
    schemas = doc["components"]["schemas"]
    for name in ("PauseReply", "UpdateWeightsReply"):
        assert schemas[name]["required"] == ["request_id", "status", "error_message", "result"], name
    assert schemas["ControlStatus"]["enum"] == ["success", "error"]
    assert set(schemas["RankResult"]["properties"]) >= {
        "sync_cost",
        "update_cost",
        "total_cost",
        "version",
        "rank",
    }
    for method, path in (("post", "/v1/pause"), ("post", "/v1/resume"), ("get", "/v1/is_paused")):
        ok = doc["paths"][path][method]["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok == {"$ref": "#/components/schemas/PauseReply"}, path
    update = doc["paths"]["/v1/update_weights"]["post"]
    assert [(p["name"], p["in"], p["required"]) for p in update["parameters"]] == [
        ("Prefer", "header", False)
    ]
    ok = update["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"]
    assert {r["$ref"].rsplit("/", 1)[1] for r in ok} == {"UpdateAccepted", "UpdateWeightsReply"}
    for code in ("404", "422", "500", "502", "504"):
        body = update["responses"][code]["content"]["application/json"]["schema"]
        assert body == {"$ref": "#/components/schemas/UpdateWeightsReply"}, code
    # 503 is also the auth middleware's AuthUnavailable (the token could not be reviewed).
    unavailable = update["responses"]["503"]["content"]["application/json"]["schema"]["anyOf"]
    assert {r["$ref"].rsplit("/", 1)[1] for r in unavailable} == {"UpdateWeightsReply", "ErrorBody"}


@pytest.fixture
async def guarded(tree: Tree, agent_factory: AgentFactory, tmp_path: Path) -> AgentClient:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    return await agent_factory(source=tree.file_uri, auth=AuthConfig(token_file=token_file))


async def test_document_is_served_without_a_token(guarded: AgentClient) -> None:
    code, body = await guarded.request("GET", OPENAPI_PATH)
    assert code == 200
    assert body == openapi_document()


@pytest.mark.parametrize("endpoint", ENDPOINTS, ids=lambda e: f"{e.method} {e.path}")
async def test_security_claims_hold(guarded: AgentClient, endpoint: Any) -> None:
    """Documented as public: no 401 without a token; otherwise a 401 with the error body."""
    path = endpoint.path.replace("{version}", "v1").replace("{file}", "manifest.json")
    code, body = await guarded.request(endpoint.method.upper(), path)
    if endpoint.public:
        assert code == 200, body
    else:
        assert code == 401, body
        assert body["error"] == "Unauthorized"
