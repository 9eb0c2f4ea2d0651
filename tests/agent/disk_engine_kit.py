"""Helpers for the SGLang and vLLM adapter tests: stand-ins started on free ports, what their
weights hold, and an agent wired to one."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from agent_testkit import AgentClient, AgentFactory, Tree

from ckpt_agent.formats.synth import load_published_tensors
from ckpt_agent.server.httpserver import AppServer
from ckpt_e2e.standins.engine import UNINITIALISED, ModelWeights


class StandIn(Protocol):
    server: AppServer
    weights: ModelWeights
    resumed_with: list[frozenset[str]]

    @property
    def names(self) -> list[str]: ...


Starter = Callable[..., Awaitable[Any]]


@asynccontextmanager
async def standins(cls: Callable[..., StandIn]) -> AsyncIterator[Starter]:
    """Start stand-ins of `cls` (keyword options), each on a free port; all stopped at the end."""
    started: list[StandIn] = []

    async def start(*, port: int | None = None, **options: Any) -> StandIn:
        standin = cls(**options)
        if port is not None:
            standin.server.port = port
        await standin.server.start()
        started.append(standin)
        return standin

    yield start
    for standin in started:
        await standin.server.stop()


def holds(standin: StandIn, tree: Tree, version: str) -> bool:
    """The engine's every parameter equals the published version's."""
    held = standin.weights.values()
    published = load_published_tensors(tree.root / version)
    if held.keys() != published.keys():
        return False
    return all(np.array_equal(held[k], published[k]) for k in held)


def resumed_only_whole_versions(standin: StandIn) -> bool:
    """Each time traffic came back, every parameter came from one directory."""
    return all(len(s) == 1 and UNINITIALISED not in s for s in standin.resumed_with)


async def disk_agent(
    agent_factory: AgentFactory, engine: str, url: str, tree: Tree, staging: Path, **overrides: Any
) -> AgentClient:
    return await agent_factory(
        engine=engine, engine_url=url, source=tree.file_uri, staging_dir=staging, **overrides
    )


def published_dir(tree: Tree, version: str) -> Path:
    """A published version is a safetensors directory an engine can boot from."""
    return tree.root / version
