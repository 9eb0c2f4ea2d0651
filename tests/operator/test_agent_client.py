"""The operator's agent client speaks the agent's wire models: requests go out as the agent
parses them, /v1/status comes back parsed, and a body that is not one counts as no answer."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from ckpt_api.agent_api import (
    AgentStatus,
    ErrorBody,
    LastError,
    RolloutRef,
    SourceRef,
    UpdateWeightsRequest,
)
from ckpt_rollout.domain.world import agent_url
from ckpt_rollout.io.agent_client import AgentClient
from ckpt_rollout.io.agent_tokens import AgentTokenUnavailable, NoToken, TokenFile

DIGEST = "sha256:" + "ab" * 32
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def agent() -> AsyncIterator[tuple[list[Any], Callable[[str, Handler], None], int]]:
    """A stand-in agent on 127.0.0.1: (bodies received, set a route's handler, port)."""
    received: list[Any] = []
    handlers: dict[str, Handler] = {}

    async def dispatch(request: web.Request) -> web.StreamResponse:
        if request.can_read_body:
            received.append(await request.json())
        return await handlers[request.path](request)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", dispatch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield received, handlers.__setitem__, runner.addresses[0][1]
    await runner.cleanup()


@pytest.fixture
async def client() -> AsyncIterator[AgentClient]:
    c = AgentClient(NoToken(), timeout_s=5, connect_attempts=1)
    yield c
    await c.close()


def _reply(body: dict[str, Any], status: int = 200) -> Handler:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response(body, status=status)

    return handler


async def test_update_request_goes_out_as_the_agent_parses_it(
    agent: tuple[list[Any], Callable[[str, Handler], None], int], client: AgentClient
) -> None:
    received, route, port = agent
    route("/v1/update_weights", _reply({"accepted": True, "version": "v2"}, 202))
    request = UpdateWeightsRequest(
        version="v2",
        verify_checksum=True,
        source=SourceRef(uri="http://src:8000", manifestDigest=DIGEST),
        rollout=RolloutRef(namespace="rl", name="fleet", uid="u-1", wave=2, report=False),
    )
    result = await client.update_weights("127.0.0.1", port, request, namespace="rl", pod="w-0")

    assert result.accepted
    assert received == [
        {
            "version": "v2",
            "verify_checksum": True,
            "source": {"uri": "http://src:8000", "manifestDigest": DIGEST},
            "rollout": {"namespace": "rl", "name": "fleet", "uid": "u-1", "wave": 2, "report": False},
        }
    ]
    assert UpdateWeightsRequest.model_validate(received[0]) == request


async def test_each_request_goes_out_as_itself_when_calls_alternate(
    agent: tuple[list[Any], Callable[[str, Handler], None], int], client: AgentClient
) -> None:
    # A wave's calls share one request object, encoded once; a relayed call's differs.
    received, route, port = agent
    route("/v1/update_weights", _reply({"accepted": True, "version": "v2"}, 202))
    shared = UpdateWeightsRequest(version="v2", source=SourceRef(uri="http://src:8000"))
    relayed = shared.model_copy(
        update={"source": SourceRef(uri="http://src:8000", peer="http://10.0.0.9:8200")}
    )
    equal_copy = UpdateWeightsRequest(version="v2", source=SourceRef(uri="http://src:8000"))
    for request in (shared, shared, relayed, shared, equal_copy):
        await client.update_weights("127.0.0.1", port, request, namespace="rl", pod="w-0")

    assert [UpdateWeightsRequest.model_validate(body) for body in received] == [
        shared,
        shared,
        relayed,
        shared,
        equal_copy,
    ]
    assert received[2]["source"]["peer"] == "http://10.0.0.9:8200"
    assert "peer" not in received[3]["source"]


async def test_status_comes_back_parsed(
    agent: tuple[list[Any], Callable[[str, Handler], None], int], client: AgentClient
) -> None:
    _, route, port = agent
    sent = AgentStatus(
        version="v1",
        state="failed",
        checksum_verified=True,
        last_error=LastError(version="v2", reason="ChecksumMismatch", message="tensor w0"),
    )
    # A newer agent's extra field is ignored rather than refused.
    route("/v1/status", _reply({**sent.to_wire(), "added_later": 1}))
    result = await client.status("127.0.0.1", port, namespace="rl", pod="w-0")

    assert result.accepted
    assert result.agent_status == sent


@pytest.mark.parametrize(
    "body",
    [{"state": "sleeping", "version": "v1"}, {"version": "v1"}, {"detail": "a proxy's page"}],
    ids=["unknown-state", "no-state", "not-an-agent"],
)
async def test_a_status_body_that_is_no_agent_status_is_no_answer(
    agent: tuple[list[Any], Callable[[str, Handler], None], int], client: AgentClient, body: dict[str, Any]
) -> None:
    _, route, port = agent
    route("/v1/status", _reply(body))
    result = await client.status("127.0.0.1", port, namespace="rl", pod="w-0")

    assert not result.accepted
    assert result.agent_status is None
    assert "invalid /v1/status body" in result.error


async def test_error_bodies_are_read_with_the_model(
    agent: tuple[list[Any], Callable[[str, Handler], None], int], client: AgentClient
) -> None:
    _, route, port = agent
    busy = ErrorBody(error="LoadInProgress", message="a load of v3 is running", target="v3")
    route("/v1/update_weights", _reply(busy.to_wire(), 409))
    result = await client.update_weights(
        "127.0.0.1", port, UpdateWeightsRequest(version="v2"), namespace="rl", pod="w-0"
    )

    assert result.busy
    assert result.error_body() == busy
    route("/v1/update_weights", _reply({"detail": "bad gateway"}, 502))
    result = await client.update_weights(
        "127.0.0.1", port, UpdateWeightsRequest(version="v2"), namespace="rl", pod="w-0"
    )
    assert result.error_body() is None


@pytest.mark.parametrize(
    ("ip", "tls", "url"),
    [
        ("10.1.2.3", True, "https://10.1.2.3:8089"),
        ("fd00::1", True, "https://[fd00::1]:8089"),
        ("10.1.2.3", False, "http://10.1.2.3:8089"),
        ("fd00::1", False, "http://[fd00::1]:8089"),
    ],
)
def test_agent_urls_bracket_ipv6_pod_ips(ip: str, tls: bool, url: str) -> None:
    assert agent_url(ip, 8089, tls=tls) == url
    # Also a peer the agent accepts (the relay source of later waves).
    assert SourceRef(uri="file:///x", peer=url).peer == url


class _PerAgent:
    """Tokens the way TokenRequestTokens hands them out: one per agent, or none to be had."""

    async def for_agent(self, namespace: str, pod: str) -> str:
        if namespace == "away":
            raise AgentTokenUnavailable("TokenRequest failed: HTTP 503")
        return f"token-of-{namespace}/{pod}"


async def test_the_token_presented_is_the_one_of_the_agent_called(
    agent: tuple[list[Any], Callable[[str, Handler], None], int],
) -> None:
    _, route, port = agent
    seen: list[str | None] = []

    async def status(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response(AgentStatus(version="v1", state="idle").to_wire())

    route("/v1/status", status)
    client = AgentClient(_PerAgent(), timeout_s=5, connect_attempts=1)
    try:
        await client.status("127.0.0.1", port, namespace="team-a", pod="w-0")
        await client.status("127.0.0.1", port, namespace="team-a", pod="w-1")
        await client.status("127.0.0.1", port, namespace="team-b", pod="w-0")
        unavailable = await client.status("127.0.0.1", port, namespace="away", pod="w-0")
    finally:
        await client.close()

    assert seen == [
        "Bearer token-of-team-a/w-0",
        "Bearer token-of-team-a/w-1",
        "Bearer token-of-team-b/w-0",
    ], "nothing sent without a token"
    assert (unavailable.status, unavailable.connected) == (0, False)
    assert "HTTP 503" in unavailable.error


async def test_a_token_file_is_re_read_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("first\n")
    tokens = TokenFile(str(path))
    assert await tokens.for_agent("a", "p") == await tokens.for_agent("b", "q") == "first"
    path.write_text("second")
    os.utime(path, (1, 1))
    assert await tokens.for_agent("a", "p") == "second"
