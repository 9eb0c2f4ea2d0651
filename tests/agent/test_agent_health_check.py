"""The smoke check after a load (`health_check` in the update request), with real paddle tensors
and against each LLM engine's stand-in: a version that loads cleanly (every checksum valid) but
serves garbage (NaN weights, a wrong export, empty generations) fails HealthCheckFailed, and the
agent serves the previous version again, resumed, before its pod is Ready; a good one passes."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from agent_testkit import AgentClient, AgentFactory, Tree, close_to
from disk_engine_kit import Starter, disk_agent, holds, standins
from fastdeploy_standin import FastDeployStandIn
from test_agent_fastdeploy import RecordingReporter
from vllm_standin import VLLMStandIn

from ckpt_api.vocabulary import HealthCheckOutcome, WeightsReadyReason, WorkerReason
from ckpt_e2e.standins.engine import ANSWER
from ckpt_e2e.standins.sglang import SGLangStandIn

CHECK = {"prompt": "The capital of France is", "max_tokens": 8, "timeout_seconds": 5}
FAILED = WorkerReason.HEALTH_CHECK_FAILED


@pytest.fixture(params=["staged", "streamed"])
def apply_mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def bad_tree(scratch_tree: Tree) -> Tree:
    """v1 and v2 as published, plus versions whose bytes match their checksums but not a good
    model: NaN in one weight, and a wrong export (another model's bytes under v1's reference)."""
    scratch_tree.add("v-nan", seed=6, poison="layers.1.weight")
    scratch_tree.add("v-wrong", seed=7, reference_seed=1)
    return scratch_tree


async def _serving_v1(agent_factory: AgentFactory, tree: Tree, **overrides: Any) -> AgentClient:
    client = await agent_factory(source=tree.file_uri, initial_version="v1", **overrides)
    assert (await client.wait_settled())["version"] == "v1"
    client.agent.service.reporter = RecordingReporter()
    return client


def _conditions(client: AgentClient) -> list[tuple[bool, str]]:
    reporter = client.agent.service.reporter
    assert isinstance(reporter, RecordingReporter)
    return reporter.conditions


async def _refused(client: AgentClient, version: str) -> dict[str, Any]:
    """Load `version` with the smoke check; it must fail it and serve v1 again."""
    assert (await client.update(version, verify_checksum=True, health_check=CHECK))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["state"], status["weights_lost"]) == ("v1", "failed", False), status
    assert status["last_error"]["reason"] == FAILED
    assert status["last_load"]["reason"] == FAILED
    assert status["last_load"]["health_check"]["passed"] is False
    assert await client.is_paused() is False
    assert await client.metric("ckpt_agent_health_checks_total", {"result": HealthCheckOutcome.FAILED}) == 1
    assert await client.metric("ckpt_agent_loads_total", {"result": "failed", "reason": FAILED}) == 1
    assert await client.metric("ckpt_agent_version_info", {"version": "v1"}) == 1
    # The pod never turned Ready on the bad version: Loading, then Ready serving v1 again.
    assert [ready for ready, _ in _conditions(client)] == [False, True]
    return status


async def test_a_nan_version_fails_its_smoke_check_and_the_old_weights_serve_again(
    bad_tree: Tree, agent_factory: AgentFactory, apply_mode: str
) -> None:
    client = await _serving_v1(agent_factory, bad_tree, apply_mode=apply_mode)
    status = await _refused(client, "v-nan")
    message = status["last_error"]["message"]
    assert message.startswith("smoke check: output "), message
    assert " is NaN" in message, message
    assert message.endswith("; v1 loaded back"), message
    # Byte-wise the load was good: every byte pulled and checked against its checksum.
    assert status["last_load"]["bytes"] == sum(t["nbytes"] for t in bad_tree.manifest("v-nan")["tensors"])
    assert close_to(await client.infer(), bad_tree.expected("v1"))


async def test_a_wrong_export_fails_against_the_published_reference(
    bad_tree: Tree, agent_factory: AgentFactory
) -> None:
    client = await _serving_v1(agent_factory, bad_tree)
    outputs = bad_tree.expected("v-wrong")
    assert all(abs(v) < 1e3 for v in outputs), "finite, plausible values: only the reference tells"
    status = await _refused(client, "v-wrong")
    assert "the published reference" in status["last_error"]["message"], status
    assert close_to(await client.infer(), bad_tree.expected("v1"))


async def test_a_good_version_passes_and_goes_live(bad_tree: Tree, agent_factory: AgentFactory) -> None:
    client = await _serving_v1(agent_factory, bad_tree)
    assert (await client.update("v2", verify_checksum=True, health_check=CHECK))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["state"]) == ("v2", "idle"), status
    check = status["last_load"]["health_check"]
    assert check["passed"] is True
    assert "within atol 0.01 of the published reference" in check["message"], check
    assert close_to(await client.infer(), bad_tree.expected("v2"))
    assert await client.metric("ckpt_agent_health_checks_total", {"result": HealthCheckOutcome.PASSED}) == 1
    assert _conditions(client) == [(False, WeightsReadyReason.LOADING), (True, WeightsReadyReason.LOADED)]


async def test_without_a_health_check_nothing_is_probed(bad_tree: Tree, agent_factory: AgentFactory) -> None:
    """FastDeploy's own clients send no health_check: the NaN version loads as any other."""
    client = await _serving_v1(agent_factory, bad_tree)
    assert (await client.update("v-nan", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["last_load"]["health_check"]) == ("v-nan", None)
    assert await client.metric("ckpt_agent_health_checks_total") == 0


async def test_a_first_load_that_fails_has_nothing_to_go_back_to(
    bad_tree: Tree, agent_factory: AgentFactory
) -> None:
    client = await agent_factory(source=bad_tree.file_uri)
    client.agent.service.reporter = RecordingReporter()
    assert (await client.update("v-nan", health_check=CHECK))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["weights_lost"]) == (None, True), status
    assert status["last_error"]["reason"] == FAILED
    assert "no earlier version is known to load back" in status["last_error"]["message"]
    assert _conditions(client)[-1] == (False, WeightsReadyReason.WEIGHTS_LOST)
    # The engine holds the NaN weights, held from traffic (a caller past readiness too) ...
    code, body = await client.request("POST", "/v1/infer", {})
    assert (code, body.get("error")) == (503, "EngineUnavailable"), body
    assert "held by: weights-lost" in body["message"], body
    assert await client.is_paused() is True
    # ... until a load succeeds (this one without a check).
    assert (await client.update("v1"))[0] == 202
    assert (await client.wait_settled())["version"] == "v1"
    assert await client.is_paused() is False
    assert close_to(await client.infer(), bad_tree.expected("v1"))


async def test_when_loading_the_previous_version_back_fails_too_the_weights_are_lost(
    bad_tree: Tree, agent_factory: AgentFactory
) -> None:
    client = await _serving_v1(agent_factory, bad_tree)
    shutil.rmtree(bad_tree.root / "v1")  # gone from the source: nothing to load back from
    assert (await client.update("v-nan", health_check=CHECK))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["weights_lost"]) == (None, True), status
    assert status["last_error"]["reason"] == FAILED
    assert "; loading v1 back failed too: " in status["last_error"]["message"], status
    assert _conditions(client)[-1] == (False, WeightsReadyReason.WEIGHTS_LOST)


async def test_a_checkpoint_shaped_model_skips_the_check_and_says_so(
    bad_tree: Tree, agent_factory: AgentFactory
) -> None:
    client = await agent_factory(source=bad_tree.file_uri, paddle_weights=bad_tree.root / "v1")
    assert (await client.update("v2", health_check=CHECK))[0] == 202
    status = await client.wait_settled()
    assert status["version"] == "v2", status
    check = status["last_load"]["health_check"]
    assert check["passed"] is None
    assert (
        check["message"]
        == "smoke check: skipped: a checkpoint-shaped paddle model has no forward pass to probe"
    )
    assert await client.metric("ckpt_agent_health_checks_total", {"result": HealthCheckOutcome.SKIPPED}) == 1


async def test_the_null_engine_skips_the_check(agent_factory: AgentFactory) -> None:
    """The scale benches' engine holds no model: the operator's default check costs it nothing."""
    client = await agent_factory(engine="null", initial_version="v1")
    assert (await client.update("v2", health_check=CHECK))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["last_load"]["health_check"]["passed"]) == ("v2", None), status
    assert "skipped: the null engine holds no model" in status["last_load"]["health_check"]["message"]


# -- the LLM engines, through their own generation endpoints --------------------------------------


@pytest.fixture(params=["sglang", "vllm"])
async def disk_engine(request: pytest.FixtureRequest) -> AsyncIterator[tuple[str, Starter]]:
    cls = {"sglang": SGLangStandIn, "vllm": VLLMStandIn}[request.param]
    async with standins(cls) as start:
        yield request.param, start


async def _disk_serving_v1(
    engine: tuple[str, Starter], tree: Tree, agent_factory: AgentFactory, staging: Path
) -> tuple[Any, AgentClient]:
    name, start = engine
    standin = await start(boot_dir=tree.root / "v1")
    client = await disk_agent(agent_factory, name, standin.server.url, tree, staging)
    assert (await client.update("v1"))[0] == 202
    assert (await client.wait_settled())["version"] == "v1"
    return standin, client


async def test_a_good_generation_passes(
    disk_engine: tuple[str, Starter], bad_tree: Tree, agent_factory: AgentFactory, tmp_path: Path
) -> None:
    standin, client = await _disk_serving_v1(disk_engine, bad_tree, agent_factory, tmp_path / "staging")
    assert (await client.update("v2", health_check={**CHECK, "max_tokens": 3})) == (
        202,
        {"accepted": True, "version": "v2"},
    )
    status = await client.wait_settled()
    assert (status["version"], status["last_load"]["health_check"]["passed"]) == ("v2", True), status
    text = "".join(ANSWER[:3])
    assert f"generated {len(text)} characters" in status["last_load"]["health_check"]["message"]
    (sent,) = standin.generator.requests
    assert CHECK["prompt"] in (sent.get("prompt"), sent.get("text")), sent
    assert 3 in (sent.get("max_tokens"), sent.get("sampling_params", {}).get("max_new_tokens")), sent
    assert holds(standin, bad_tree, "v2")


@pytest.mark.parametrize(
    ("version", "fault", "says"),
    [
        ("v2", "empty", "generation returned empty text in "),
        ("v2", "unfinished", "generation did not finish (finish reason 'abort')"),
        ("v2", "hang", "no answer within 1s"),
        ("v-nan", None, "generation returned empty text in "),
    ],
    ids=["empty", "aborted", "hung", "nan-weights"],
)
async def test_a_garbage_generation_fails_and_the_previous_version_is_reloaded(
    disk_engine: tuple[str, Starter],
    bad_tree: Tree,
    agent_factory: AgentFactory,
    tmp_path: Path,
    version: str,
    fault: Any,
    says: str,
) -> None:
    standin, client = await _disk_serving_v1(disk_engine, bad_tree, agent_factory, tmp_path / "staging")
    standin.generator.fault = fault
    assert (await client.update(version, health_check={**CHECK, "timeout_seconds": 1}))[0] == 202
    status = await client.wait_settled()
    standin.generator.release()
    assert (status["version"], status["state"], status["weights_lost"]) == ("v1", "failed", False), status
    assert status["last_error"]["reason"] == FAILED
    assert says in status["last_error"]["message"], status
    assert status["last_error"]["message"].endswith("; v1 loaded back")
    assert holds(standin, bad_tree, "v1")
    assert standin.paused is None


async def test_fastdeploy_generation_is_checked_and_a_garbage_version_loaded_back(
    agent_factory: AgentFactory,
) -> None:
    fd = FastDeployStandIn("v1", tp=2)
    await fd.server.start()
    try:
        client = await agent_factory(engine="fastdeploy", fastdeploy_url=fd.server.url, initial_version="v1")
        assert (await client.update("v2", health_check=CHECK))[0] == 202
        status = await client.wait_settled()
        assert (status["version"], status["last_load"]["health_check"]["passed"]) == ("v2", True), status
        assert fd.generator.requests == [
            {"prompt": CHECK["prompt"], "max_tokens": CHECK["max_tokens"], "temperature": 0}
        ]

        fd.nan_versions.add("v3")
        assert (await client.update("v3", health_check=CHECK))[0] == 202
        status = await client.wait_settled()
        assert (status["version"], status["state"]) == ("v2", "failed"), status
        assert status["last_error"]["reason"] == FAILED
        assert "generation returned empty text" in status["last_error"]["message"]
        # Loaded back as FastDeploy loads any version: pause, update_weights v2, resume.
        assert fd.ranks == ["v2", "v2"]
        assert fd.paused is False
        assert fd.commands[-6:] == ["pause", "update_weights", "resume", "pause", "update_weights", "resume"]
    finally:
        await fd.server.stop()
