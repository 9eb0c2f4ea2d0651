"""Prometheus scrapes an agent without the operator's credential: a separate port serves
/metrics alone; the control port still asks for the token, /metrics included."""

from __future__ import annotations

from pathlib import Path

import aiohttp
from agent_testkit import AgentFactory, Tree

from ckpt_agent.cli import build_parser, config_from_args
from ckpt_agent.config import AuthConfig
from ckpt_api.constants import DEFAULT_AGENT_METRICS_PORT


async def test_the_metrics_port_needs_no_token_and_serves_nothing_else(
    tree: Tree, agent_factory: AgentFactory, session: aiohttp.ClientSession, tmp_path: Path
) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("s3cret")
    client = await agent_factory(source=tree.file_uri, auth=AuthConfig(token_file=token_file), metrics_port=0)
    assert client.agent is not None
    metrics_url = client.agent.metrics_url
    assert metrics_url is not None
    assert metrics_url != client.agent.url

    async with session.get(f"{metrics_url}/metrics") as resp:
        assert resp.status == 200
        assert "ckpt_agent_engine_paused" in await resp.text()
    for method, path in (("GET", "/v1/status"), ("POST", "/v1/update_weights"), ("POST", "/v1/pause")):
        async with session.request(method, f"{metrics_url}{path}") as resp:
            assert resp.status == 404, path  # control stays on the authenticated port
    async with session.get(f"{client.agent.url}/metrics") as resp:
        assert resp.status == 401


def test_the_flag_defaults_to_its_own_port_and_zero_turns_it_off() -> None:
    parser = build_parser()
    on = config_from_args(parser.parse_args(["agent", "--no-auth"]), env={})
    off = config_from_args(parser.parse_args(["agent", "--no-auth", "--metrics-port", "0"]), env={})
    assert (on.metrics_port, off.metrics_port) == (DEFAULT_AGENT_METRICS_PORT, None)
