"""What an agent presents to the peer it pulls from: its own relay token, never the operator's
token the update request carried (a peer is any pod a rollout selects); and what a peer's
identity may do here: read the relay, nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_testkit import AgentFactory, Tree
from aiohttp import web

from ckpt_agent.agent import relay_credential
from ckpt_agent.config import AgentConfig, AuthConfig
from ckpt_agent.server.auth import AuthDecision, scoped
from ckpt_agent.server.httpserver import AppServer
from ckpt_agent.service.service import NoRelayToken


@pytest.fixture
async def recording_peer() -> AsyncIterator[tuple[str, list[str]]]:
    """A 'peer' that records the Authorization of every request and serves nothing."""
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"error": "NotRelayable", "message": "nothing here"}, status=404)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    server = AppServer(app, "127.0.0.1", 0)
    await server.start()
    yield server.url, seen
    await server.stop()


async def test_a_peer_gets_the_agents_own_relay_token_never_the_operators(
    tree: Tree, agent_factory: AgentFactory, tmp_path: Path, recording_peer: tuple[str, list[str]]
) -> None:
    peer, seen = recording_peer
    operator_token, relay_token = tmp_path / "operator-token", tmp_path / "relay-token"
    operator_token.write_text("operator-secret\n")
    relay_token.write_text("relay-secret\n")
    client = await agent_factory(
        token="operator-secret",
        source=tree.file_uri,
        auth=AuthConfig(token_file=operator_token),
        relay_token_file=relay_token,
    )
    assert (await client.update("v2", source={"uri": tree.file_uri, "peer": peer}))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "v2", "the peer failed: loaded from the source"
    assert status["last_load"]["fallback_reason"], status["last_load"]
    assert seen, "the agent asked the peer"
    assert set(seen) == {"Bearer relay-secret"}


def _config(**auth: object) -> AgentConfig:
    return AgentConfig(auth=AuthConfig(**auth))  # type: ignore[arg-type]


def test_with_token_review_and_no_relay_token_nothing_is_sent_on(tmp_path: Path) -> None:
    reviewed = _config(tokenreview_audience="ckpt-rollout-agent", allowed_usernames=("op",))
    with pytest.raises(NoRelayToken, match="no token for peers"):
        relay_credential(reviewed)("operator-token")
    # Auth off: no token is needed to read a peer either.
    assert relay_credential(_config(disabled=True))(None) is None
    static = tmp_path / "t"
    static.write_text("shared")
    # One shared secret that every agent holds already: the peer gets what it knows.
    assert relay_credential(_config(token_file=static))("shared") == "shared"
    own = tmp_path / "relay"
    own.write_text("mine\n")
    with_file = AgentConfig(
        auth=AuthConfig(tokenreview_audience="a", allowed_usernames=("op",)), relay_token_file=own
    )
    assert relay_credential(with_file)("operator-token") == "mine"
    with pytest.raises(NoRelayToken, match="cannot read --relay-token-file"):
        relay_credential(AgentConfig(relay_token_file=tmp_path / "absent"))("x")


async def test_an_agent_told_of_a_peer_it_has_no_token_for_loads_from_the_source(
    tree: Tree, agent_factory: AgentFactory, recording_peer: tuple[str, list[str]], tmp_path: Path
) -> None:
    """Its token file unreadable (not mounted yet, say): the peer is skipped, not sent the
    operator's token, and the version comes from the source."""
    peer, seen = recording_peer
    agent = await agent_factory(source=tree.file_uri, relay_token_file=tmp_path / "not-mounted")
    assert (await agent.update("v2", source={"uri": tree.file_uri, "peer": peer}))[0] == 202
    status = await agent.wait_settled()
    assert status["version"] == "v2"
    assert seen == [], "no request reached the peer"
    assert "skipped: cannot read --relay-token-file" in status["last_load"]["fallback_reason"]
    assert status["last_load"]["peer"] is None


USER, PEER = "system:serviceaccount:ops:operator", "system:serviceaccount:rl:ckpt-rollout-worker"


@pytest.mark.parametrize(
    ("username", "path", "status"),
    [
        (USER, "/v1/update_weights", 200),
        (USER, "/v1/relay/v2/manifest.json", 200),
        (PEER, "/v1/relay/v2/model.safetensors", 200),
        (PEER, "/v1/mooncake/v2", 200),
        (PEER, "/v1/update_weights", 403),
        (PEER, "/v1/pause", 403),
        (PEER, "/v1/status", 403),
        (PEER, "/v1/relayed", 403),
        (PEER, "/metrics", 403),
    ],
)
def test_a_peers_identity_reads_the_relay_and_nothing_else(username: str, path: str, status: int) -> None:
    decision = scoped(AuthDecision(200, "token review", username), path, frozenset({PEER}))
    assert decision.status == status
    if status == 403:
        assert decision.reason == f"user {PEER!r} may only read this agent's relay"
    refused = AuthDecision(401, "invalid token")
    assert scoped(refused, path, frozenset({PEER})) is refused
