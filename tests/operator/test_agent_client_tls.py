"""The operator calls agents over https, dialling the pod IP and verifying the certificate for
the pod's namespace's agent name: a wrong CA or another namespace's certificate fails the call
with a reason naming TLS, at once; plain http only when asked for by name."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from ckpt_agent.agent import Agent, build_agent
from ckpt_agent.config import AgentConfig, AuthConfig, TLSConfig
from ckpt_api.agent_api import UpdateWeightsRequest
from ckpt_api.tls import ca_context
from ckpt_cli.entry import build_parser
from ckpt_e2e.pki import ClusterPKI, agent_certificate
from ckpt_rollout.controller.config import agent_ca, config_from_args
from ckpt_rollout.io.agent_client import AgentClient
from ckpt_rollout.io.agent_tokens import NoToken


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> ClusterPKI:
    return ClusterPKI(tmp_path_factory.mktemp("agent-ca"))


@pytest.fixture
async def agent(pki: ClusterPKI) -> AsyncIterator[Agent]:
    """A real agent (null engine) serving the certificate of namespace rl's agents."""
    pair = agent_certificate(pki, "rl")
    config = AgentConfig(
        port=0,
        metrics_port=None,
        engine="null",
        auth=AuthConfig(disabled=True),
        tls=TLSConfig(cert_file=pair.cert, key_file=pair.key),
        report=False,
    )
    running = await build_agent(config)
    await running.start()
    yield running
    await running.stop()


async def _status(agent: Agent, ca: Path, namespace: str) -> tuple[int, str, bool]:
    client = AgentClient(NoToken(), timeout_s=5, connect_attempts=1, ca=ca_context(ca))
    try:
        result = await client.status("127.0.0.1", agent.server.port, namespace=namespace, pod="w-0")
    finally:
        await client.close()
    return result.status, result.error, result.connected


async def test_an_agent_verified_for_its_namespace_answers(agent: Agent, pki: ClusterPKI) -> None:
    status, error, _ = await _status(agent, pki.ca_cert, "rl")
    assert (status, error) == (200, "")


@pytest.mark.parametrize("wrong", ["ca", "namespace"])
async def test_a_wrong_ca_or_namespace_fails_the_call_naming_tls(
    agent: Agent, pki: ClusterPKI, tmp_path: Path, wrong: str
) -> None:
    ca = ClusterPKI(tmp_path / "other").ca_cert if wrong == "ca" else pki.ca_cert
    namespace = "rl" if wrong == "ca" else "other"
    client = AgentClient(NoToken(), timeout_s=5, connect_attempts=3, ca=ca_context(ca))
    try:
        result = await client.update_weights(
            "127.0.0.1", agent.server.port, UpdateWeightsRequest(version="v2"), namespace=namespace, pod="w-0"
        )
    finally:
        await client.close()
    # Final, not "not listening yet": the worker fails with this reason instead of timing out.
    assert (result.status, result.connected) == (0, True)
    assert result.error.startswith("TLS verification of the agent failed")
    assert agent.service.target is None, "the agent was never told to load"


@pytest.mark.parametrize(
    ("argv", "tls", "refusal"),
    [
        (["--agent-ca-file", "CA"], True, None),
        (["--agent-plain-http"], False, None),
        ([], False, "choose --agent-ca-file"),
        (["--agent-ca-file", "/absent/ca.crt"], True, "/absent/ca.crt"),
    ],
)
def test_agent_tls_flags(pki: ClusterPKI, argv: list[str], tls: bool, refusal: str | None) -> None:
    argv = [str(pki.ca_cert) if a == "CA" else a for a in argv]
    config = config_from_args(build_parser().parse_args(["operator", *argv]))
    assert config.tuning.agent_tls is tls, "peer URLs handed out say https exactly when agents serve it"
    if refusal is None:
        assert (agent_ca(config) is not None) is tls
    else:
        with pytest.raises(SystemExit, match=refusal):
            agent_ca(config)
