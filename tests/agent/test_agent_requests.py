"""Malformed bodies and wrong types get a 400 naming the field, never a 500."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agent_testkit import AgentClient, AgentFactory, Tree
from hypothesis import given, settings
from hypothesis import strategies as st

from ckpt_agent.common.errors import RequestError
from ckpt_agent.server.update_request import parse_update_request
from ckpt_api.agent_api import UpdateWeightsRequest

GOOD_ROLLOUT = {"namespace": "rl", "name": "fleet", "uid": "u", "wave": 0}


@pytest.fixture
async def client(tree: Tree, agent_factory: AgentFactory) -> AgentClient:
    c = await agent_factory(source=tree.file_uri, initial_version="v1")
    await c.wait_settled()
    return c


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b"{", "body"),
        (b"\xff\xfe", "body"),
        (b"[1, 2]", "body"),
        (b'"v2"', "body"),
        (b"null", "body"),
        # Python's json refuses both with errors that are not JSONDecodeError (once a 500).
        (b"[" * 60_000, "body"),
        (b'{"version": ' + b"1" * 5000 + b"}", "body"),
    ],
    ids=["truncated", "not-utf8", "array", "string", "null", "nested-60000-deep", "int-5000-digits"],
)
async def test_unparseable_bodies(client: AgentClient, raw: bytes, field: str) -> None:
    code, body = await client.request("POST", "/v1/update_weights", raw=raw)
    assert code == 400
    assert (body["error"], body["field"]) == ("InvalidRequest", field)
    assert await client.metric("ckpt_agent_update_requests_total", {"result": "rejected"}) == 1


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "version"),
        ({"version": 2}, "version"),
        ({"version": ["v2"]}, "version"),
        ({"version": "v2", "verify_checksum": "true"}, "verify_checksum"),
        ({"version": "v2", "verify_checksum": 1}, "verify_checksum"),
        ({"version": "v2", "source": "http://x"}, "source"),
        ({"version": "v2", "source": {}}, "source.uri"),
        ({"version": "v2", "source": {"uri": 5}}, "source.uri"),
        ({"version": "v2", "source": {"uri": "mooncake://src-without-port"}}, "source.uri"),
        ({"version": "v2", "source": {"uri": "ftp://h/x"}}, "source.uri"),
        (
            {"version": "v2", "source": {"uri": "file:///x", "manifestDigest": "md5:abc"}},
            "source.manifestDigest",
        ),
        ({"version": "v2", "source": {"uri": "file:///x", "manifestDigest": 7}}, "source.manifestDigest"),
        ({"version": "v2", "rollout": []}, "rollout"),
        ({"version": "v2", "rollout": {**GOOD_ROLLOUT, "wave": True}}, "rollout.wave"),
        ({"version": "v2", "rollout": {**GOOD_ROLLOUT, "wave": -1}}, "rollout.wave"),
        ({"version": "v2", "rollout": {**GOOD_ROLLOUT, "wave": "1"}}, "rollout.wave"),
        ({"version": "v2", "rollout": {**GOOD_ROLLOUT, "name": "Fleet_1"}}, "rollout.name"),
        ({"version": "v2", "rollout": {**GOOD_ROLLOUT, "namespace": None}}, "rollout.namespace"),
        ({"version": "v2", "rollout": {k: v for k, v in GOOD_ROLLOUT.items() if k != "uid"}}, "rollout.uid"),
    ],
)
async def test_wrong_types_name_the_field(client: AgentClient, body: dict[str, Any], field: str) -> None:
    code, reply = await client.request("POST", "/v1/update_weights", body)
    assert code == 400, reply
    assert reply["field"] == field
    assert reply["message"]
    status = await client.status()
    assert status["state"] == "idle"
    assert status["version"] == "v1"


async def test_unknown_fields_are_ignored_for_fastdeploy_compatibility(client: AgentClient) -> None:
    code, _ = await client.update("v1", rsync_config={"etcd_server": "127.0.0.1:2379"})
    assert code == 200


async def test_oversized_body_is_refused(client: AgentClient) -> None:
    code, body = await client.request(
        "POST", "/v1/update_weights", raw=json.dumps({"version": "v" * 200_000}).encode()
    )
    assert code == 413
    assert "error" in body


@pytest.mark.parametrize(
    ("method", "path", "code"), [("GET", "/v1/nope", 404), ("GET", "/v1/update_weights", 405)]
)
async def test_unknown_routes_answer_json(client: AgentClient, method: str, path: str, code: int) -> None:
    status, body = await client.request(method, path)
    assert status == code
    assert "error" in body


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
_bodies = _json | st.fixed_dictionaries(
    {},
    optional={
        "version": _json | st.sampled_from(["v2", "a/b", "..", "global_step_1"]),
        "verify_checksum": _json,
        "source": _json
        | st.fixed_dictionaries({"uri": _json | st.just("file:///x")}, optional={"manifestDigest": _json}),
        "rollout": _json
        | st.fixed_dictionaries(
            {}, optional={"namespace": _json, "name": _json, "uid": _json, "wave": _json}
        ),
    },
)


@settings(max_examples=300, deadline=None)
@given(_bodies)
def test_any_json_body_parses_or_is_a_request_error(body: object) -> None:
    """No body makes the parser raise anything but a RequestError (a 400 naming a field)."""
    outcome: UpdateWeightsRequest | RequestError
    try:
        outcome = parse_update_request(body)
    except RequestError as exc:
        outcome = exc
    if isinstance(outcome, RequestError):
        assert outcome.status == 400
        assert outcome.field
    else:
        assert isinstance(outcome.version, str)
        assert isinstance(outcome.verify_checksum, bool)
