"""The agent's source allow-list (--allowed-sources) and its refusal of link-local sources:
refused requests get 403 InvalidSource before anything is loaded (and the failure is reported
like an invalid version); a host name is checked again on every address it resolves to."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from agent_testkit import AgentFactory, Tree, close_to

from ckpt_agent.config import ConfigError

Source = Callable[[Path], Awaitable[str]]


async def test_a_source_outside_the_allowed_ones_is_refused_and_nothing_loads(
    tree: Tree, agent_factory: AgentFactory
) -> None:
    other = "file:///srv/elsewhere"
    client = await agent_factory(source=tree.file_uri, allowed_sources=(tree.file_uri,))
    code, body = await client.request(
        "POST", "/v1/update_weights", {"version": "v2", "source": {"uri": other}}
    )
    assert code == 403
    assert (body["error"], body["field"]) == ("InvalidSource", "source.uri")
    assert other in body["message"]
    assert tree.file_uri.removeprefix("file://") in body["message"], "the message names the allowed rules"
    status = (await client.request("GET", "/v1/status"))[1]
    assert (status["version"], status["last_error"]["reason"]) == (None, "InvalidSource")
    assert status["updates"]["rejected"] == 1

    # The allowed source (the agent's default) still loads.
    assert (await client.update("v2"))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    assert close_to(await client.infer(), tree.expected("v2"))


@pytest.mark.parametrize("uri", ["http://169.254.169.254/latest", "http://[fe80::1]:80/x"])
async def test_link_local_sources_are_refused_by_default(
    tree: Tree, agent_factory: AgentFactory, uri: str
) -> None:
    client = await agent_factory(source=tree.file_uri)
    code, body = await client.request("POST", "/v1/update_weights", {"version": "v2", "source": {"uri": uri}})
    assert (code, body["error"]) == (403, "InvalidSource")
    assert "link-local" in body["message"]


async def test_a_name_resolving_outside_an_allowed_network_is_refused_at_connect(
    tree: Tree, agent_factory: AgentFactory, source_server: Source
) -> None:
    """`localhost` passes the URI check against a CIDR rule (a name cannot be judged before it is
    resolved); it resolves to 127.0.0.1, outside 10.0.0.0/8, and no connection is made."""
    url = await source_server(tree.root)
    named = url.replace("127.0.0.1", "localhost")
    client = await agent_factory(source=named, allowed_sources=("http://10.0.0.0/8",))
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["last_error"]["reason"]) == (None, "InvalidSource")
    assert "resolves to the loopback address 127.0.0.1" in status["last_error"]["message"]

    allowed = await agent_factory(source=named, allowed_sources=("http://127.0.0.0/8",))
    assert (await allowed.update("v2"))[0] == 202
    assert (await allowed.wait_settled())["version"] == "v2"


async def test_a_bad_rule_stops_the_agent_with_the_reason(tree: Tree, agent_factory: AgentFactory) -> None:
    with pytest.raises(ConfigError, match="--allowed-sources: source rule 'ftp://x'"):
        await agent_factory(source=tree.file_uri, allowed_sources=("ftp://x",))


@pytest.mark.parametrize("rule", ["http://localhost", "http://*"])
async def test_a_name_rule_does_not_reach_loopback(
    tree: Tree, agent_factory: AgentFactory, source_server: Source, rule: str
) -> None:
    """A name rule allows a name wherever it points but at special addresses: `localhost`
    (what a rebinding zone under an allowed suffix would answer) resolves to 127.0.0.1, and
    nothing is fetched, nor any reply of it shown."""
    url = await source_server(tree.root)
    named = url.replace("127.0.0.1", "localhost")
    client = await agent_factory(source=named, allowed_sources=(rule,))
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["last_error"]["reason"]) == (None, "InvalidSource")
    assert "resolves to the loopback address 127.0.0.1" in status["last_error"]["message"]
