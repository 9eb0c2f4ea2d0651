"""Schemathesis against a live agent (a real `python -m ckpt_agent agent` process, reference
engine, static token) and the document that process serves: generated valid and invalid
requests to every endpoint never get a 5xx, invalid ones get a 4xx, and every response matches
its documented status, media type and schema. Few examples per operation keep the run short."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from agent_testkit import SPEC, Tree
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis.checks import not_a_server_error
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from ckpt_api.agent_api import PREFER_HEADER, RESPOND_ASYNC
from ckpt_api.agent_openapi import ENDPOINTS, OPENAPI_PATH, Endpoint

# Generated requests by the thousand against a real agent process: a minute and more of a core,
# so outside the quick loop (`make check`); `make unit` and `make test` run it.
pytestmark = pytest.mark.fuzz

TOKEN = "schemathesis-t0ken"
MAX_EXAMPLES = 100
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    # Negative cases only: a request that breaks the schema is refused with a 4xx.
    negative_data_rejection,
    # Operations documented as authenticated refuse the same call without the token.
    ignored_auth,
]
SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


def _call(url: str, body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:  # 127.0.0.1 only
            return json.load(resp)
    except urllib.error.HTTPError as exc:
        return json.load(exc)


def _wait_for(url: str, ready: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        status: dict[str, Any] = _call(url + "/v1/status")
        if ready(status):
            return status
        assert time.monotonic() < deadline, f"timed out waiting for {what}: {status}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def live_agent(tree: Tree, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The agent serving v1 of the shared tree; yields its URL."""
    token = tmp_path_factory.mktemp("schemathesis") / "token"
    token.write_text(TOKEN)
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "ckpt_agent", "agent", "--host", "127.0.0.1", "--port", "0",
            "--metrics-port", "0", "--engine", "paddle", "--source", tree.file_uri, "--initial-version", "v1",
            "--auth-token-file", str(token), "--no-report", "--model-hidden", str(SPEC.hidden),
            "--model-layers", str(SPEC.layers), "--model-outputs", str(SPEC.outputs), "--plain-http",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        match = re.search(r"(http://\S+)", banner)
        assert match, f"no banner: {banner!r}"
        url = match.group(1)
        _wait_for(url, lambda s: (s["state"], s["version"]) == ("idle", "v1"), "v1")
        yield url
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def agent_schema(live_agent: str) -> schemathesis.BaseSchema:
    config = schemathesis.Config.from_dict(
        {"base-url": live_agent, "headers": {"Authorization": f"Bearer {TOKEN}"}}
    )
    # The document as the agent serves it, not as the test would build it.
    return schemathesis.openapi.from_url(live_agent + OPENAPI_PATH, config=config)


def _operation(schema: schemathesis.BaseSchema, endpoint: Endpoint) -> Any:
    return schema[endpoint.path][endpoint.method.upper()]


_NETWORK_HOST = re.compile(r"^(https?|mooncake)://[^/?#]*")


def _local_only(case: schemathesis.Case, source_uri: str | None) -> None:
    """A generated host may be a real one (http://1.1 is 1.0.0.1): point network peers at a
    closed local port, and sources there too or, with `source_uri`, at that source, so nothing
    leaves the machine. Valid cases only: in an invalid one the rewrite could repair what was
    meant to be broken."""
    body = case.body
    if not isinstance(body, dict) or not isinstance(body.get("source"), dict):
        return
    source = dict(body["source"])
    for key in ("uri", "peer"):
        if isinstance(source.get(key), str):
            source[key] = _NETWORK_HOST.sub(r"\1://127.0.0.1:9", source[key])
    if source_uri is not None and isinstance(source.get("uri"), str):
        source["uri"] = source_uri
    case.body = {**body, "source": source}


# Passed with the call for update_weights: with a header parameter (Prefer) in the operation,
# schemathesis takes the configured token for a generated one (and reports a 2xx as ignored
# auth) unless the call names it; named, it probes without it as for every other operation.
_AUTH = {"Authorization": f"Bearer {TOKEN}"}


def _answer_mode(case: schemathesis.Case, respond_async: bool) -> None:
    headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != PREFER_HEADER.lower()}
    if respond_async:
        headers[PREFER_HEADER] = RESPOND_ASYNC
    case.headers = headers


# Negative cases need an input to break: a body or a parameter. update_weights answers in two
# ways (ckpt_agent.server.control_api), each checked: asynchronous (respond-async) and synchronous.
_MODES: dict[str, list[bool | None]] = {"/v1/update_weights": [True, False]}
CASES = [
    (e, mode, respond_async)
    for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    for e in ENDPOINTS
    if mode is GenerationMode.POSITIVE or e.request is not None or e.parameters
    for respond_async in _MODES.get(e.path, [None])
]


def _id(endpoint: Endpoint, mode: GenerationMode, respond_async: bool | None) -> str:
    answer = {None: "", True: " async", False: " sync"}[respond_async]
    return f"{endpoint.method.upper()} {endpoint.path} {mode.value}{answer}"


# Hypothesis drives schemathesis' strategies here because schemathesis' own lazy pytest loader
# (`schemathesis.pytest.from_fixture`) fails under pytest 9.2 (it sets `Node._nodeid`).
@pytest.mark.parametrize(("endpoint", "mode", "respond_async"), CASES, ids=[_id(*c) for c in CASES])
def test_every_endpoint_matches_the_document(
    agent_schema: schemathesis.BaseSchema,
    tree: Tree,
    endpoint: Endpoint,
    mode: GenerationMode,
    respond_async: bool | None,
) -> None:
    @given(case=_operation(agent_schema, endpoint).as_strategy(generation_mode=mode))
    @SETTINGS
    def check(case: schemathesis.Case) -> None:
        if respond_async is not None:
            _answer_mode(case, respond_async)
        if mode is GenerationMode.POSITIVE:
            # A synchronous answer is the load's outcome: against a source that is up, so what
            # is checked is the agent's answer, not an unreachable source's 502.
            _local_only(case, tree.file_uri if respond_async is False else None)
        case.call_and_validate(checks=CHECKS, headers=_AUTH if respond_async is not None else None)

    check()


@pytest.fixture(scope="module")
def relayed(live_agent: str, tree: Tree) -> tuple[str, str]:
    """Has the agent load v2 for real, which leaves the relay copy peers read (any earlier load
    withdrew v1's); returns (v2, one of its shards)."""
    _wait_for(live_agent, lambda s: s["state"] != "loading", "the agent to finish its load")
    # A FastDeploy-style (synchronous) call: answered once v2 is live.
    reply = _call(live_agent + "/v1/update_weights", {"version": "v2"})
    assert (reply["status"], reply["result"][0]["version"]) == ("success", "v2"), reply
    status = _call(live_agent + "/v1/status")
    assert (status["version"], status["relay"]["version"]) == ("v2", "v2"), status
    files = json.loads((tree.root / "v2" / "manifest.json").read_text())["files"]
    return "v2", sorted(files)[0]


def test_relay_of_the_live_version_matches_the_document(
    agent_schema: schemathesis.BaseSchema, relayed: tuple[str, str]
) -> None:
    """With the version fixed to the relayed one, the generated file names reach the copy."""
    version, _ = relayed
    endpoint = next(e for e in ENDPOINTS if e.path == "/v1/relay/{version}/{file}")
    operation = _operation(agent_schema, endpoint)

    @given(case=operation.as_strategy(path_parameters={"version": version}))
    @SETTINGS
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(checks=CHECKS)

    check()


# Well-formed ranges mostly: free text almost never is one, and the edges are in the numbers.
# requests refuses to send a header value with leading whitespace (InvalidHeader, before any
# request): such values test the client, not the agent.
_ranges = st.from_regex(r"\Abytes=[0-9]{1,6}-[0-9]{0,6}\Z") | st.text(
    st.characters(codec="ascii", exclude_categories=("Cc",)), max_size=20
).filter(lambda value: not value[:1].isspace())


@given(range_header=_ranges, manifest=st.booleans())
@SETTINGS
def test_relayed_byte_ranges_match_the_document(
    agent_schema: schemathesis.BaseSchema, relayed: tuple[str, str], range_header: str, manifest: bool
) -> None:
    version, shard = relayed
    endpoint = next(e for e in ENDPOINTS if e.path == "/v1/relay/{version}/{file}")
    case = _operation(agent_schema, endpoint).Case(
        path_parameters={"version": version, "file": "manifest.json" if manifest else shard},
        # Headers given here replace the configured ones, the token included.
        headers={"Range": range_header, "Authorization": f"Bearer {TOKEN}"},
    )
    response = case.call_and_validate(checks=CHECKS)
    assert response.status_code in (200, 206, 416), response.text
