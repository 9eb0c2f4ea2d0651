"""The agent's API port over TLS: HTTPS verified for the namespace's agent name, a rotated
certificate served to new connections without a restart, no start without a choice between TLS
and --plain-http, and peers read only when their certificate verifies."""

from __future__ import annotations

import os
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent_testkit import AgentClient, AgentFactory, Tree

from ckpt_agent.cli import build_parser
from ckpt_agent.config import AgentConfig, AuthConfig, ConfigError, TLSConfig
from ckpt_api.tls import agent_server_name, ca_context
from ckpt_e2e.pki import CertPair, ClusterPKI, agent_certificate

NAMESPACE = "rl"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPKI:
    return ClusterPKI(tmp_path_factory.mktemp("agent-ca"))


@pytest.fixture(scope="module")
def other_pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPKI:
    """Another CA: what a wrong --agent-ca-file or --peer-ca-file trusts."""
    return ClusterPKI(tmp_path_factory.mktemp("other-ca"))


def _trusting(pki: ClusterPKI) -> ssl.SSLContext:
    return ca_context(pki.ca_cert).current()


@pytest.fixture
async def tls_session(pki: ClusterPKI) -> AsyncIterator[aiohttp.ClientSession]:
    """For the test's own calls, which dial 127.0.0.1 (the certificates carry it too)."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=_trusting(pki))) as s:
        yield s


def _serving(pki: ClusterPKI, where: Path) -> CertPair:
    """A certificate copied to paths the agent is given, as a Secret volume holds it."""
    issued = agent_certificate(pki, NAMESPACE, ips=("127.0.0.1",))
    pair = CertPair(where / "tls.crt", where / "tls.key")
    _swap_in(issued, pair)
    return pair


def _swap_in(issued: CertPair, into: CertPair) -> None:
    # New files renamed over the old ones: what a Secret volume's update looks like to a reader.
    for src, dst in ((issued.key, into.key), (issued.cert, into.cert)):
        tmp = dst.with_suffix(".new")
        tmp.write_bytes(src.read_bytes())
        os.replace(tmp, dst)


async def _tls_agent(agent_factory: AgentFactory, pair: CertPair, **overrides: Any) -> AgentClient:
    return await agent_factory(tls=TLSConfig(cert_file=pair.cert, key_file=pair.key), **overrides)


async def _handshake(url: str, context: ssl.SSLContext, server_name: str) -> int:
    """One new connection (no pooling), verified for ``server_name``; the HTTP status."""
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session,
        session.get(f"{url}/healthz", ssl=context, server_hostname=server_name) as resp,
    ):
        return resp.status


async def test_api_port_serves_https_verified_for_the_namespace_name(
    agent_factory: AgentFactory, pki: ClusterPKI, other_pki: ClusterPKI, tmp_path: Path
) -> None:
    client = await _tls_agent(agent_factory, _serving(pki, tmp_path))
    assert client.url.startswith("https://127.0.0.1:")
    name = agent_server_name(NAMESPACE)
    assert await _handshake(client.url, _trusting(pki), name) == 200

    with pytest.raises(aiohttp.ClientConnectorCertificateError, match="certificate verify failed"):
        await _handshake(client.url, _trusting(other_pki), name)
    # The right CA, but another namespace's agents: the name does not match.
    with pytest.raises(aiohttp.ClientConnectorCertificateError, match="Hostname mismatch"):
        await _handshake(client.url, _trusting(pki), agent_server_name("other"))
    # Plain HTTP to the TLS port gets no answer.
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(aiohttp.ClientError):
            await plain.get(client.url.replace("https://", "http://", 1) + "/healthz")


async def test_a_rotated_certificate_is_served_to_new_connections(
    agent_factory: AgentFactory, pki: ClusterPKI, other_pki: ClusterPKI, tmp_path: Path
) -> None:
    pair = _serving(pki, tmp_path)
    client = await _tls_agent(agent_factory, pair)
    name = agent_server_name(NAMESPACE)
    assert await _handshake(client.url, _trusting(pki), name) == 200

    # A CA rotation's last step: the serving certificate now comes from the new CA.
    _swap_in(agent_certificate(other_pki, NAMESPACE), pair)

    assert await _handshake(client.url, _trusting(other_pki), name) == 200
    with pytest.raises(aiohttp.ClientConnectorCertificateError):
        await _handshake(client.url, _trusting(pki), name)
    assert client.agent.tls_files.reloads == 1


async def test_a_half_written_rotation_keeps_the_last_good_certificate(
    agent_factory: AgentFactory, pki: ClusterPKI, other_pki: ClusterPKI, tmp_path: Path
) -> None:
    pair = _serving(pki, tmp_path)
    client = await _tls_agent(agent_factory, pair)
    fresh = agent_certificate(other_pki, NAMESPACE)
    pair.cert.write_bytes(fresh.cert.read_bytes())  # the new certificate, the old key still there

    assert await _handshake(client.url, _trusting(pki), agent_server_name(NAMESPACE)) == 200
    _swap_in(fresh, pair)
    assert await _handshake(client.url, _trusting(other_pki), agent_server_name(NAMESPACE)) == 200


def test_agent_refuses_to_start_without_tls_or_plain_http(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["agent", "--no-auth"])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert "--tls-cert-file" in err
    assert "--plain-http" in err


@pytest.mark.parametrize(
    ("tls", "namespace", "message"),
    [
        (TLSConfig(), None, "--plain-http"),
        (TLSConfig(cert_file=Path("/c"), key_file=Path("/k"), plain_http=True), None, "--plain-http"),
        (TLSConfig(cert_file=Path("/c")), None, "go together"),
        (TLSConfig(cert_file=Path("/absent.crt"), key_file=Path("/absent.key")), None, "/absent.crt"),
        (TLSConfig(plain_http=True, peer_ca_file=Path("/ca")), None, "POD_NAMESPACE"),
        (TLSConfig(plain_http=True, peer_ca_file=Path("/absent-ca.crt")), "rl", "/absent-ca.crt"),
    ],
)
def test_tls_settings_that_cannot_serve_are_refused(
    tls: TLSConfig, namespace: str | None, message: str
) -> None:
    config = AgentConfig(auth=AuthConfig(disabled=True), tls=tls, pod_namespace=namespace)
    with pytest.raises(ConfigError, match=message):
        config.validate()


def test_a_key_that_is_not_the_certificates_is_refused(pki: ClusterPKI, tmp_path: Path) -> None:
    one, two = agent_certificate(pki, "a"), agent_certificate(pki, "b")
    config = AgentConfig(auth=AuthConfig(disabled=True), tls=TLSConfig(cert_file=one.cert, key_file=two.key))
    with pytest.raises(ConfigError, match="cannot load certificate"):
        config.validate()


# -- peers -----------------------------------------------------------------------------------------
async def _tls_peer(
    tree: Tree, agent_factory: AgentFactory, session: aiohttp.ClientSession, pair: CertPair
) -> AgentClient:
    peer = await _tls_agent(agent_factory, pair, source=tree.file_uri)
    peer = AgentClient(session, peer.url, agent=peer.agent)
    assert (await peer.update("v2", verify_checksum=True))[0] == 202
    assert (await peer.wait_settled())["relay"]["version"] == "v2"
    return peer


@pytest.mark.parametrize("trusted", [True, False])
async def test_a_peer_is_read_only_when_its_certificate_verifies(
    tree: Tree,
    agent_factory: AgentFactory,
    tls_session: aiohttp.ClientSession,
    pki: ClusterPKI,
    other_pki: ClusterPKI,
    tmp_path: Path,
    trusted: bool,
) -> None:
    peer = await _tls_peer(tree, agent_factory, tls_session, _serving(pki, tmp_path))
    ca = (pki if trusted else other_pki).ca_cert
    client = await agent_factory(
        source=tree.file_uri,
        initial_version="v1",
        pod_namespace=NAMESPACE,
        tls=TLSConfig(plain_http=True, peer_ca_file=ca),
    )
    await client.wait_settled()

    assert (await client.update("v2", source={"uri": tree.file_uri, "peer": peer.url}))[0] == 202
    status = await client.wait_settled()
    last = status["last_load"]
    assert (status["version"], last["peer"]) == ("v2", peer.url)
    total = sum(t["nbytes"] for t in tree.manifest("v2")["tensors"])
    if trusted:
        assert (last["fallback_reason"], last["bytes_from_peer"]) == (None, total)
        assert status["checksum_verified"], "peer bytes are always verified"
    else:
        assert "certificate verify failed" in last["fallback_reason"]
        assert (last["bytes_from_peer"], last["bytes_from_source"]) == (0, total)


async def test_a_plain_http_peer_is_skipped_when_peers_must_verify(
    tree: Tree, agent_factory: AgentFactory, pki: ClusterPKI
) -> None:
    peer = await agent_factory(source=tree.file_uri)
    assert (await peer.update("v2", verify_checksum=True))[0] == 202
    await peer.wait_settled()
    client = await agent_factory(
        source=tree.file_uri,
        initial_version="v1",
        pod_namespace=NAMESPACE,
        tls=TLSConfig(plain_http=True, peer_ca_file=pki.ca_cert),
    )
    await client.wait_settled()

    assert (await client.update("v2", source={"uri": tree.file_uri, "peer": peer.url}))[0] == 202
    last = (await client.wait_settled())["last_load"]
    assert "only over verified TLS" in last["fallback_reason"]
    assert last["bytes_from_peer"] == 0
