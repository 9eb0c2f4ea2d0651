"""What an agent presents to the peer it pulls from: its own relay token, never the operator's
token the update request carried (a peer is any pod a rollout selects); and what a peer's
identity may do here: read the relay, nothing else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from agent_testkit import RELAY_TOKEN, AgentClient, AgentFactory, Tree, static_token_agent
from aiohttp import web

from ckpt_agent.agent import relay_credential
from ckpt_agent.config import AgentConfig, AuthConfig, ConfigError, TLSConfig
from ckpt_agent.pipeline.relay_peer import RELAY_PATH
from ckpt_agent.server.auth import AuthDecision, scoped
from ckpt_agent.server.httpserver import AppServer
from ckpt_agent.service.service import NoRelayToken
from ckpt_api.manifest import MANIFEST_NAME


@pytest.fixture
async def recording_peer() -> AsyncIterator[tuple[str, list[str]]]:
    """A 'peer' that records the Authorization of every request and relays nothing (410, so the
    load takes the source at once rather than waiting out a 404 as a peer still loading)."""
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"error": "NotRelayable", "message": "nothing here"}, status=410)

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


def test_without_a_relay_token_nothing_is_sent_on(tmp_path: Path) -> None:
    reviewed = _config(tokenreview_audience="ckpt-rollout-agent", allowed_usernames=("op",))
    with pytest.raises(NoRelayToken, match="no token for peers"):
        relay_credential(reviewed)()
    # Auth off: no token is needed to read a peer either.
    assert relay_credential(_config(disabled=True))() is None
    static = tmp_path / "t"
    static.write_text("shared")
    # The static token lets its bearer pause and reload this agent: a peer never gets it.
    with pytest.raises(NoRelayToken, match="no token for peers"):
        relay_credential(_config(token_file=static))()
    own = tmp_path / "relay"
    own.write_text("mine\n")
    with_file = AgentConfig(
        auth=AuthConfig(tokenreview_audience="a", allowed_usernames=("op",)), relay_token_file=own
    )
    assert relay_credential(with_file)() == "mine"
    with pytest.raises(NoRelayToken, match="cannot read --relay-token-file"):
        relay_credential(AgentConfig(relay_token_file=tmp_path / "absent"))()


async def test_a_static_token_agent_never_sends_its_callers_token_to_a_peer(
    tree: Tree, agent_factory: AgentFactory, tmp_path: Path, recording_peer: tuple[str, list[str]]
) -> None:
    """Static-token mode without --relay-token-file: the peer is skipped, not sent the token the
    update was made with (which was the whole of this agent's access)."""
    peer, seen = recording_peer
    token = tmp_path / "token"
    token.write_text("operator-secret\n")
    client = await agent_factory(
        token="operator-secret", source=tree.file_uri, auth=AuthConfig(token_file=token)
    )
    assert (await client.update("v2", source={"uri": tree.file_uri, "peer": peer}))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "v2"
    assert seen == [], "no request reached the peer"
    assert "skipped: this agent has no token for peers" in status["last_load"]["fallback_reason"]


async def test_a_static_token_peer_lets_the_relay_token_read_its_relay_and_nothing_else(
    tree: Tree, agent_factory: AgentFactory, token_file: Path
) -> None:
    peer = await static_token_agent(agent_factory, token_file, source=tree.file_uri, initial_version="v1")
    await peer.wait_settled()
    as_peer = AgentClient(peer.session, peer.url, RELAY_TOKEN)
    manifest = f"{RELAY_PATH}/v1/{MANIFEST_NAME}"
    assert (await as_peer.request("GET", manifest))[0] == 200
    for method, path in [("POST", "/v1/pause"), ("GET", "/v1/status"), ("POST", "/v1/update_weights")]:
        code, body = await as_peer.request(method, path, {} if method == "POST" else None)
        assert (code, body["error"]) == (403, "Forbidden"), (method, path)
        assert "may only read this agent's relay" in body["message"]
    assert (await peer.request("GET", "/v1/status"))[0] == 200, "the static token still does everything"


def test_the_relay_token_must_be_another_secret_than_the_static_token(tmp_path: Path) -> None:
    token, relay = tmp_path / "token", tmp_path / "relay"
    token.write_text("shared\n")
    relay.write_text("shared")
    config = AgentConfig(
        auth=AuthConfig(token_file=token),
        relay_token_file=relay,
        tls=TLSConfig(plain_http=True),
        engine="null",
    )
    with pytest.raises(ConfigError, match="--relay-token-file holds the --auth-token-file token"):
        config.validate()


@pytest.mark.parametrize(
    ("peer", "rules", "why"),
    [
        ("http://[fe80::1]:80", (), "link-local address"),
        ("{peer}", ("{source}",), "is not among the allowed sources"),
    ],
)
async def test_a_peer_the_source_policy_refuses_is_never_contacted(
    tree: Tree,
    agent_factory: AgentFactory,
    tmp_path: Path,
    recording_peer: tuple[str, list[str]],
    peer: str,
    rules: tuple[str, ...],
    why: str,
) -> None:
    """A peer is an address a request names, like a source: a link-local one (where metadata
    services live), or anything --allowed-sources does not list, is skipped with its relay
    token unsent. (fe80::1 without a zone cannot even be dialled: no test sends a packet to a
    metadata address, even on code that would.)"""
    recorder, seen = recording_peer
    peer = peer.format(peer=recorder)
    relay = tmp_path / "relay"
    relay.write_text("relay-secret\n")
    allowed = tuple(r.format(source=tree.file_uri) for r in rules)
    agent = await agent_factory(source=tree.file_uri, relay_token_file=relay, allowed_sources=allowed)
    assert (await agent.update("v2", source={"uri": tree.file_uri, "peer": peer}))[0] == 202
    status = await agent.wait_settled()
    assert status["version"] == "v2"
    assert seen == []
    assert (
        status["last_load"]["peer"],
        status["last_load"]["fallback_reason"].startswith(f"peer {peer} skipped"),
    ) == (None, True)
    assert why in status["last_load"]["fallback_reason"]


async def test_a_peer_name_resolving_to_a_refused_address_is_not_connected_to(
    tree: Tree, agent_factory: AgentFactory, tmp_path: Path, recording_peer: tuple[str, list[str]]
) -> None:
    """Its URI passes (a name rule allows the name), its address does not (a name rule never
    reaches loopback): checked on the address connected to, as for sources."""
    recorder, seen = recording_peer
    named = recorder.replace("127.0.0.1", "localhost")
    relay = tmp_path / "relay"
    relay.write_text("relay-secret\n")
    agent = await agent_factory(
        source=tree.file_uri, relay_token_file=relay, allowed_sources=(tree.file_uri, "http://*")
    )
    assert (await agent.update("v2", source={"uri": tree.file_uri, "peer": named}))[0] == 202
    status = await agent.wait_settled()
    assert status["version"] == "v2"
    assert seen == []
    assert "resolves to the loopback address 127.0.0.1" in status["last_load"]["fallback_reason"]


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
