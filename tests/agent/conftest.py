"""Fixtures for the agent tests: a session-wide published tree, sources and agents on free
127.0.0.1 ports, all in-process unless a test needs a real process."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent_testkit import SPEC, STATIC_TOKEN, AgentClient, AgentFactory, Tree

from ckpt_agent.agent import Agent, build_agent
from ckpt_agent.config import AgentConfig, AuthConfig, TLSConfig
from ckpt_agent.server.httpserver import AppServer
from ckpt_agent.source.serve import create_source_app


@pytest.fixture(scope="session")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Tree:
    """Versions shared by many tests; never modified (tests that corrupt use `scratch_tree`)."""
    t = Tree(tmp_path_factory.mktemp("published"), tmp_path_factory.mktemp("sources"))
    t.add("v1", seed=1)
    t.add("v2", seed=2, shards=2)
    t.add("v3", seed=3)
    return t


@pytest.fixture
def scratch_tree(tree: Tree, tmp_path: Path) -> Iterator[Tree]:
    """A private tree holding copies of v1 and v2, free to corrupt."""
    t = Tree(tmp_path / "root", tmp_path / "work")
    t.root.mkdir()
    t.work.mkdir()
    for version in ("v1", "v2"):
        shutil.copytree(tree.root / version, t.root / version)
        t.digests[version] = tree.digests[version]
    return t


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


@pytest.fixture
async def source_server() -> AsyncIterator[Callable[[Path], Awaitable[str]]]:
    """Starts `ckpt-rollout serve`'s app in-process for a root; returns its URL."""
    servers: list[AppServer] = []

    async def start(root: Path) -> str:
        server = AppServer(create_source_app(root), "127.0.0.1", 0)
        await server.start()
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        await server.stop()


@pytest.fixture
async def agent_factory(session: aiohttp.ClientSession) -> AsyncIterator[AgentFactory]:
    """Builds agents with reporting off and auth off unless a test asks otherwise."""
    agents: list[Agent] = []

    async def make(token: str | None = None, **overrides: Any) -> AgentClient:
        config = AgentConfig(
            host="127.0.0.1",
            port=0,
            model=SPEC,
            auth=AuthConfig(disabled=True),
            tls=TLSConfig(plain_http=True),  # the TLS tests pass their own
            report=False,
            chunk_bytes=4096,
            metrics_port=None,  # many agents per test: a metrics test asks for port 0
        )
        config = replace(config, **overrides)
        agent = await build_agent(config)
        await agent.start()
        agents.append(agent)
        return AgentClient(session, agent.url, token, agent=agent)

    yield make
    for agent in agents:
        await agent.stop()


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    """A static token file holding STATIC_TOKEN (what agent_testkit.static_token_agent accepts)."""
    path = tmp_path / "token"
    path.write_text(STATIC_TOKEN + "\n")
    return path
