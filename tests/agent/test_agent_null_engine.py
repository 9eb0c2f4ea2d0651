"""The null engine: instant loads that still go through the agent's request handling, pause
gate, metrics and reports (what the control-plane bench relies on)."""

from __future__ import annotations

import argparse
import asyncio

from agent_testkit import AgentFactory

from ckpt_agent.cli import add_commands, config_from_args
from ckpt_agent.engines.base import LoadJob
from ckpt_agent.engines.null import NullEngine
from ckpt_agent.pipeline.pause_gate import LOAD, USER, PauseGate
from ckpt_agent.pipeline.reader import LoadProgress

ROLLOUT = {"namespace": "rl", "name": "fleet", "uid": "u", "wave": 1}


async def test_update_goes_through_the_agent_and_reports(agent_factory: AgentFactory) -> None:
    client = await agent_factory(engine="null", initial_version="v1")
    assert (await client.status())["version"] == "v1", "the boot version needs no source"

    code, body = await client.update("v2", verify_checksum=True, rollout=ROLLOUT)
    assert (code, body["accepted"]) == (202, True)
    status = await client.wait_settled()
    assert (status["version"], status["state"]) == ("v2", "idle")
    assert status["checksum_verified"] is False, "nothing was pulled, so nothing was verified"
    assert status["engine"]["loads"] == 1
    last = status["report"]["last"]
    assert (last["phase"], last["version"], last["wave"], last["bytes"]) == ("Updated", "v2", 1, 0)
    assert await client.metric("ckpt_agent_loads_total", {"result": "succeeded"}) == 1
    assert await client.metric("ckpt_agent_version_info", {"version": "v2"}) == 1
    assert await client.is_paused() is False, "the load resumed what it paused"


async def test_same_version_is_a_noop_and_a_busy_agent_conflicts(agent_factory: AgentFactory) -> None:
    client = await agent_factory(engine="null", initial_version="v1")
    code, body = await client.update("v1", rollout=ROLLOUT)
    assert (code, body.get("noop")) == (200, True)

    engine = client.agent.service.engine
    assert isinstance(engine, NullEngine)
    engine.load_seconds = 0.5  # hold the load open to see the one-load-at-a-time rule
    assert (await client.update("v2"))[0] == 202
    code, body = await client.update("v3")
    assert (code, body["error"]) == (409, "LoadInProgress")
    assert (await client.wait_settled())["version"] == "v2"


async def test_a_load_holds_the_pause_gate_and_keeps_an_operator_pause() -> None:
    engine = NullEngine(load_seconds=0.2)
    gate = PauseGate(engine)
    job = LoadJob("v2", False, None, "sha256:x", None)
    task = asyncio.create_task(engine.load(job, gate, LoadProgress()))
    await asyncio.sleep(0.05)
    assert gate.holders == [LOAD]
    assert await engine.is_paused(), "the apply runs paused, as a real engine's would"
    outcome = await task
    assert (outcome.bytes, outcome.checksum_verified, outcome.manifest_digest) == (0, False, "sha256:x")
    assert not await engine.is_paused()

    await gate.acquire(USER)
    await engine.load(job, gate, LoadProgress())
    assert gate.holders == [USER]
    assert await engine.is_paused(), "an operator's pause outlives the load"


def test_cli_accepts_the_null_engine() -> None:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["agent", "--engine", "null", "--initial-version", "v1", "--no-auth", "--plain-http"]
    )
    config = config_from_args(args, env={})
    config.validate()  # no --source needed: the null engine pulls nothing
    assert config.engine == "null"
