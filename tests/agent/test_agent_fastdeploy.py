"""The FastDeploy adapter against the stand-in rebuilt from FastDeploy's code (upstream commit
c1b7c083da606ed7f3ac35c2f905dc904f1163b2): pause -> update_weights -> resume, always resume;
FastDeploy's envelope read as FastDeploy writes it; per-rank versions checked; a failed update
followed by loading the previous version back, or by WeightsLost, never by a false claim; the API
key sent. And the stand-in's own fidelity to FastDeploy's code and unit tests."""

from __future__ import annotations

import argparse
import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from agent_testkit import AgentClient, AgentFactory, Tree, wait_until
from fastdeploy_standin import PAUSE_REQUIRED, FastDeployStandIn, MidLoadFailure

from ckpt_agent.cli import add_commands, config_from_args
from ckpt_agent.config import ConfigError
from ckpt_agent.engines.fastdeploy import rank_shortfall
from ckpt_agent.service.reporting import DisabledReporter
from ckpt_api.agent_api import RankResult

ROLLOUT = {"namespace": "rl", "name": "fleet", "uid": "u", "wave": 0}
AGENT_ARGV = ["agent", "--no-auth", "--plain-http", "--engine", "fastdeploy"]


class RecordingReporter(DisabledReporter):
    """Also keeps what the agent told its pod's WeightsReady condition, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.conditions: list[tuple[bool, str]] = []

    def weights_ready(self, ready: bool, reason: str, message: str) -> None:
        super().weights_ready(ready, reason, message)
        self.conditions.append((ready, reason))


async def _standin(**kwargs: Any) -> FastDeployStandIn:
    standin = FastDeployStandIn(**kwargs)
    await standin.server.start()
    return standin


@pytest.fixture
async def fastdeploy() -> AsyncIterator[FastDeployStandIn]:
    standin = await _standin(tp=2)
    yield standin
    await standin.server.stop()


async def _agent(agent_factory: AgentFactory, fd: FastDeployStandIn, **overrides: Any) -> AgentClient:
    overrides.setdefault("initial_version", "v1")
    client = await agent_factory(engine="fastdeploy", fastdeploy_url=fd.server.url, **overrides)
    # Every report from here on; the boot one (Loaded) is not what these tests are about.
    client.agent.service.reporter = RecordingReporter()
    return client


def _reporter(client: AgentClient) -> RecordingReporter:
    reporter = client.agent.service.reporter
    assert isinstance(reporter, RecordingReporter)
    return reporter


# -- the load ------------------------------------------------------------------------------------


async def test_update_drives_pause_update_resume(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    client = await _agent(agent_factory, fastdeploy)
    assert (await client.status())["version"] == "v1"
    assert (await client.update("v2", verify_checksum=True, rollout=ROLLOUT))[0] == 202
    status = await client.wait_settled()
    assert fastdeploy.calls == [
        ("pause", None),
        ("update_weights", {"version": "v2", "verify_checksum": True}),
        ("resume", None),
    ]
    assert (status["version"], status["state"], status["checksum_verified"]) == ("v2", "idle", True)
    assert status["report"]["last"]["phase"] == "Updated"
    assert fastdeploy.ranks == ["v2", "v2"]
    assert await client.is_paused() is False
    code, body = await client.request("POST", "/v1/infer", {})
    assert (code, body["error"]) == (404, "NotSupported")


async def test_a_reply_without_request_id_or_error_message_is_judged_on_its_status(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    fastdeploy.omit_fields = {"request_id", "error_message"}
    client = await _agent(agent_factory, fastdeploy)
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["state"], fastdeploy.ranks) == ("v2", "idle", ["v2", "v2"])
    assert [name for name, _ in fastdeploy.calls] == ["pause", "update_weights", "resume"]

    # An error without error_message still fails, on HTTP 500 and status "error", and v2 is
    # loaded back (read as a success without its bookkeeping fields too).
    fastdeploy.failures["v3"] = MidLoadFailure(ranks=frozenset({1}))
    assert (await client.update("v3"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["version"], fastdeploy.ranks) == ("failed", "v2", ["v2", "v2"])
    assert "HTTP 500, status error" in status["last_error"]["message"]
    assert fastdeploy.paused is False


async def test_a_fastdeploy_client_through_the_agent(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    """pause -> update_weights -> resume sent to the agent reach FastDeploy once each: the
    load's own pause rides on the client's."""
    client = await _agent(agent_factory, fastdeploy)
    assert (await client.request("POST", "/v1/pause"))[0] == 200
    code, reply = await client.update_sync("v2")
    assert (code, reply["status"], reply["error_message"]) == (200, "success", "Success")
    assert [(r["version"], r["rank"]) for r in reply["result"]] == [("v2", 0)]
    assert fastdeploy.paused, "the client's pause outlives the load"
    assert (await client.request("POST", "/v1/resume"))[0] == 200
    assert fastdeploy.commands == ["pause", "update_weights", "resume"]
    assert (fastdeploy.paused, fastdeploy.ranks) == (False, ["v2", "v2"])


async def test_mid_load_failure_loads_the_previous_version_back(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    fastdeploy.failures["v2"] = MidLoadFailure(ranks=frozenset({1}), message="rsync of shard 3 failed")
    client = await _agent(agent_factory, fastdeploy)
    assert (await client.update("v2", rollout=ROLLOUT))[0] == 202
    status = await client.wait_settled()
    assert fastdeploy.calls == [
        ("pause", None),
        ("update_weights", {"version": "v2", "verify_checksum": False}),
        ("update_weights", {"version": "v1", "verify_checksum": False}),
        ("resume", None),
    ]
    assert (fastdeploy.ranks, fastdeploy.paused) == (["v1", "v1"], False)
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", "v1", False)
    message = status["last_error"]["message"]
    assert status["last_error"]["reason"] == "EngineError"
    assert "HTTP 500, status error" in message, message
    assert "Rank: 1 Failed to run control method update_weights: rsync of shard 3 failed" in message
    assert "v1 loaded back on all 2 ranks" in message
    assert _reporter(client).conditions[-1] == (True, "Loaded")


async def test_mid_load_failure_answered_synchronously(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    fastdeploy.failures["v2"] = MidLoadFailure()
    client = await _agent(agent_factory, fastdeploy)
    code, reply = await client.update_sync("v2")
    assert (code, reply["status"]) == (502, "error")
    assert reply["error_message"].startswith("EngineError: FastDeploy POST /v1/update_weights: HTTP 500")
    assert reply["result"] == {"reason": "EngineError", "version": "v1", "weights_lost": False}
    assert fastdeploy.ranks == ["v1", "v1"]


async def test_a_failed_restore_is_weights_lost_and_not_ready(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    fastdeploy.failures["v2"] = MidLoadFailure(ranks=frozenset({0}))
    fastdeploy.failures["v1"] = MidLoadFailure(ranks=frozenset({1}), message="source gone")
    client = await _agent(agent_factory, fastdeploy)
    code, reply = await client.update_sync("v2")
    assert (code, reply["status"]) == (500, "error")
    assert reply["result"] == {"reason": "EngineError", "version": None, "weights_lost": True}
    assert "loading v1 back failed too" in reply["error_message"]
    assert "source gone" in reply["error_message"]
    status = await client.status()
    assert (status["state"], status["version"], status["weights_lost"]) == ("failed", None, True)
    assert _reporter(client).conditions[-1] == (False, "WeightsLost")
    assert fastdeploy.version is None, "the stand-in holds a mix, as the agent says"
    assert fastdeploy.paused, "a mix of weights serves no traffic"
    assert status["paused_by"] == ["weights-lost"]
    await client.request("POST", "/v1/resume")
    assert fastdeploy.paused, "a user's resume does not lift it either"

    # Once the source is back, loading a version (even the old one) makes the pod whole again.
    fastdeploy.failures.clear()
    code, reply = await client.update_sync("v1")
    assert (code, reply["result"][0]["version"]) == (200, "v1")
    assert ((await client.status())["weights_lost"], fastdeploy.ranks) == (False, ["v1", "v1"])
    assert _reporter(client).conditions[-1] == (True, "Loaded")
    assert not fastdeploy.paused, "whole again: resumed"


async def test_without_a_known_previous_version_a_failure_is_weights_lost(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    fastdeploy.failures["v2"] = MidLoadFailure()
    client = await _agent(agent_factory, fastdeploy, initial_version=None)
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["weights_lost"]) == (None, True)
    assert "--initial-version" in status["last_error"]["message"]
    assert fastdeploy.commands == ["pause", "update_weights"], "nothing to load back, and no resume"
    assert _reporter(client).conditions[-1] == (False, "WeightsLost")


async def test_a_rank_on_another_version_is_caught_and_undone(agent_factory: AgentFactory) -> None:
    fastdeploy = await _standin(tp=3)
    try:
        fastdeploy.stale_ranks.add(2)
        client = await _agent(agent_factory, fastdeploy)
        assert (await client.update("v2"))[0] == 202
        status = await client.wait_settled()
        message = status["last_error"]["message"]
        assert "update_weights v2: 1 of 3 ranks report another version (rank 2: 'v1')" in message
        assert (status["version"], status["weights_lost"]) == ("v1", False)
        assert fastdeploy.ranks == ["v1", "v1", "v1"]
        assert [a["version"] for n, a in fastdeploy.calls if n == "update_weights"] == ["v2", "v1"]
    finally:
        await fastdeploy.server.stop()


@pytest.mark.parametrize("expected", [3, None])
async def test_a_success_missing_a_rank_fails_when_the_rank_count_is_known(
    agent_factory: AgentFactory, expected: int | None
) -> None:
    """Rank 2 loads but its result never comes back: with `fastdeploy_ranks` the success is not
    believed (rank 2 cannot be vouched for) and v1 is loaded back on every rank; without it the
    agent cannot know a rank is missing, and takes the success as FastDeploy gives it."""
    fastdeploy = await _standin(tp=3)
    try:
        fastdeploy.silent_ranks["v2"] = {2}
        client = await _agent(agent_factory, fastdeploy, fastdeploy_ranks=expected)
        assert (await client.update("v2"))[0] == 202
        status = await client.wait_settled()
        if expected is None:
            assert (status["state"], status["version"]) == ("idle", "v2")
            return
        message = status["last_error"]["message"]
        assert "update_weights v2: 2 rank results, expected ranks 0..2: missing 2" in message
        assert (status["state"], status["version"], status["weights_lost"]) == ("failed", "v1", False)
        assert [a["version"] for n, a in fastdeploy.calls if n == "update_weights"] == ["v2", "v1"]
        assert fastdeploy.paused is False
    finally:
        await fastdeploy.server.stop()


@pytest.mark.parametrize(
    ("ranks", "expected", "wrong"),
    [
        ([0, 1, 2], 3, None),
        ([2, 0, 1], 3, None),  # any order
        ([0, 1], 3, "missing 2"),
        ([0, 0, 1], 3, "missing 2; repeated 0"),
        ([0, 1, 5], 3, "missing 2; unknown 5"),
        ([None, None], 2, None),  # no rank field: its position
        ([None, 0], 2, "missing 1; repeated 0"),
        ([0, 1, 2], 2, "unknown 2"),
    ],
)
def test_rank_shortfall(ranks: list[int | None], expected: int, wrong: str | None) -> None:
    result = [RankResult(version="v", rank=r) for r in ranks]
    assert rank_shortfall(result, expected) == wrong


async def test_a_refusal_before_any_rank_ran_changes_nothing(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    """FastDeploy's not-paused precondition writes nothing: no load back is attempted."""
    client = await _agent(agent_factory, fastdeploy)
    fastdeploy.pause_holds = False  # someone resumes FastDeploy between the agent's calls
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert fastdeploy.commands == ["pause", "update_weights", "resume"]
    assert (status["version"], status["weights_lost"]) == ("v1", False)
    assert status["last_error"]["message"].endswith(PAUSE_REQUIRED)


async def test_the_api_key_is_sent_as_a_bearer_token(agent_factory: AgentFactory) -> None:
    fastdeploy = await _standin(api_keys=["fd-k3y", "other"])
    try:
        client = await _agent(agent_factory, fastdeploy, fastdeploy_api_key="fd-k3y")
        assert (await client.update_sync("v2"))[0] == 200
        assert fastdeploy.ranks == ["v2"]

        keyless = await _agent(agent_factory, fastdeploy)
        code, reply = await keyless.update_sync("v3")
        assert (code, reply["status"]) == (502, "error")
        assert 'HTTP 401: {"error": "Unauthorized"}' in reply["error_message"]
        code, reply = await keyless.request("GET", "/v1/is_paused")
        assert (code, reply["status"]) == (502, "error")
        assert fastdeploy.commands == ["pause", "update_weights", "resume"], "the keyless agent got nowhere"
    finally:
        await fastdeploy.server.stop()


def test_the_api_key_comes_from_a_file_or_fastdeploys_variable(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers())
    key = tmp_path / "key"
    key.write_text("from-file\n")
    plain = parser.parse_args(AGENT_ARGV)
    with_file = parser.parse_args([*AGENT_ARGV, "--fastdeploy-api-key-file", str(key)])
    env = {"FD_API_KEY": "k1, k2"}  # FastDeploy's own variable: comma-separated keys
    assert config_from_args(plain, env).fastdeploy_bearer() == "k1"
    assert config_from_args(with_file, env).fastdeploy_bearer() == "from-file"
    assert config_from_args(plain, {}).fastdeploy_bearer() is None
    assert "k1" not in repr(config_from_args(plain, env))
    # FastDeploy's own bounds: its server answers update_weights within 600 s.
    config = config_from_args(plain, {})
    assert (config.fastdeploy_update_timeout, config.sync_update_timeout) == (630.0, 600.0)
    key.write_text("")
    with pytest.raises(ConfigError, match="is empty"):
        config_from_args(with_file, {}).validate()


async def test_operator_pause_is_kept_across_a_load(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    client = await _agent(agent_factory, fastdeploy)
    assert (await client.request("POST", "/v1/pause"))[0] == 200
    assert (await client.update("v2"))[0] == 202
    assert (await client.wait_settled())["version"] == "v2"
    assert fastdeploy.commands == ["pause", "update_weights"]
    assert await client.is_paused() is True
    assert (await client.request("POST", "/v1/resume"))[0] == 200
    assert fastdeploy.commands == ["pause", "update_weights", "resume"]


async def test_unreachable_engine(agent_factory: AgentFactory) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    client = await agent_factory(
        engine="fastdeploy", fastdeploy_url=f"http://127.0.0.1:{port}", initial_version="v1"
    )
    assert (await client.update("v2"))[0] == 202
    status = await client.wait_settled()
    assert (status["state"], status["last_error"]["reason"]) == ("failed", "EngineError")
    assert (status["version"], status["weights_lost"]) == ("v1", False), "nothing reached the engine"
    code, body = await client.request("GET", "/v1/is_paused")
    assert (code, body["status"], body["result"]) == (502, "error", None)
    assert body["error_message"].startswith("EngineError: FastDeploy GET /v1/is_paused: cannot connect")


async def test_manifest_preflight_refuses_before_pausing(
    tree: Tree, agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    client = await _agent(agent_factory, fastdeploy, source=tree.file_uri)
    assert (await client.update("v404"))[0] == 202
    assert (await client.wait_settled())["last_error"]["reason"] == "VersionNotFound"
    pinned = {"uri": tree.file_uri, "manifestDigest": tree.digests["v1"]}
    assert (await client.update("v2", source=pinned))[0] == 202
    assert (await client.wait_settled())["last_error"]["reason"] == "ManifestDigestMismatch"
    assert fastdeploy.calls == [], "a refused version must not pause the engine"

    assert (await client.update("v2", verify_checksum=True))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["manifest_digest"]) == ("v2", tree.digests["v2"])
    assert status["bytes_total"] == sum(t["nbytes"] for t in tree.manifest("v2")["tensors"])


async def test_a_pinned_version_is_verified_by_fastdeploy_even_unasked(
    tree: Tree, agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    """The pin covers the manifest; only FastDeploy's own check covers the bytes it pulls."""
    client = await _agent(agent_factory, fastdeploy, source=tree.file_uri)
    pinned = {"uri": tree.file_uri, "manifestDigest": tree.digests["v2"]}
    assert (await client.update("v2", verify_checksum=False, source=pinned))[0] == 202
    status = await client.wait_settled()
    assert (status["version"], status["manifest_digest"]) == ("v2", tree.digests["v2"])
    assert ("update_weights", {"version": "v2", "verify_checksum": True}) in fastdeploy.calls
    assert (await client.update("v3", verify_checksum=False))[0] == 202
    await client.wait_settled()
    assert fastdeploy.calls[-2] == ("update_weights", {"version": "v3", "verify_checksum": False})


async def test_a_peer_is_not_used_by_an_engine_that_pulls_by_itself(
    tree: Tree, agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    client = await _agent(agent_factory, fastdeploy, source=tree.file_uri)
    body = {"uri": tree.file_uri, "peer": "http://127.0.0.1:9"}
    assert (await client.update("v2", verify_checksum=True, source=body))[0] == 202
    status = await client.wait_settled()
    last = status["last_load"]
    assert (status["version"], last["peer"], last["bytes_from_peer"]) == ("v2", "http://127.0.0.1:9", 0)
    assert last["fallback_reason"] is None
    assert fastdeploy.commands == ["pause", "update_weights", "resume"]


# -- the stand-in is FastDeploy's code, as recorded ----------------------------------------------


@pytest.fixture
async def raw(fastdeploy: FastDeployStandIn, session: aiohttp.ClientSession) -> AgentClient:
    return AgentClient(session, fastdeploy.server.url)


async def test_standin_envelope_and_update_semantics(raw: AgentClient, fastdeploy: FastDeployStandIn) -> None:
    code, reply = await raw.request("POST", "/v1/update_weights", {"version": "v2"})
    assert (code, reply["status"], reply["result"]) == (500, "error", None)
    assert reply["request_id"].startswith("control-")
    assert reply["error_message"].startswith(
        f"Failed to run control method update_weights: {reply['request_id']}"
    )
    assert reply["error_message"].endswith(PAUSE_REQUIRED)
    assert fastdeploy.ranks == ["v1", "v1"], "refused before anything was written"

    code, reply = await raw.request("POST", "/v1/pause")
    assert (code, reply["status"], reply["error_message"], reply["result"]) == (
        200,
        "success",
        "Success",
        None,
    )
    code, reply = await raw.request("POST", "/v1/update_weights", {"version": "v2", "verify_checksum": True})
    assert code == 200
    assert [(r["rank"], r["version"]) for r in reply["result"]] == [(0, "v2"), (1, "v2")]
    assert set(reply["result"][0]) == {"sync_cost", "update_cost", "total_cost", "version", "rank"}
    assert fastdeploy.calls[-1] == ("update_weights", {"version": "v2", "verify_checksum": True})
    assert (await raw.request("GET", "/v1/is_paused"))[1]["result"] == {"is_paused": True}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"version": 1}, "version must be a string"),
        ({"verify_checksum": "true"}, "verify_checksum must be a boolean"),
    ],
)
async def test_standin_type_errors_are_bare_400s(
    raw: AgentClient, body: dict[str, Any], message: str
) -> None:
    code, reply = await raw.request("POST", "/v1/update_weights", body)
    assert (code, reply) == (400, {"error": "Invalid parameter type", "message": message})


async def test_standin_missing_version_and_bad_json(session: aiohttp.ClientSession) -> None:
    with_yaml = await _standin(boot_version="step_7")
    try:
        client = AgentClient(session, with_yaml.server.url)
        await client.request("POST", "/v1/pause")
        code, reply = await client.request("POST", "/v1/update_weights", {})
        assert (code, reply["result"][0]["version"]) == (200, "step_7"), "version.yaml's step"
        code, reply = await client.request("POST", "/v1/update_weights", raw=b"{")
        assert (code, reply["error"]["type"]) == (500, "internal_error")
    finally:
        await with_yaml.server.stop()


async def test_standin_without_version_yaml(raw: AgentClient) -> None:
    await raw.request("POST", "/v1/pause")
    code, reply = await raw.request("POST", "/v1/update_weights", {"version": None})
    assert (code, reply["status"]) == (500, "error")
    assert "rsync model version not set" in reply["error_message"]


async def test_standin_auth_guards_v1_paths_only(session: aiohttp.ClientSession) -> None:
    guarded = await _standin(api_keys=["k"])
    try:
        client = AgentClient(session, guarded.server.url)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic k"}):
            client.headers = headers
            assert await client.request("GET", "/v1/is_paused") == (401, {"error": "Unauthorized"})
        assert (await client.request("GET", "/health"))[0] == 200
        client.headers = {"Authorization": "bearer k"}
        assert (await client.request("GET", "/v1/is_paused"))[0] == 200
        assert await client.request("POST", "/v1/is_paused") == (405, {"detail": "Method Not Allowed"})
    finally:
        await guarded.server.stop()


async def test_standin_runs_control_calls_one_at_a_time(
    raw: AgentClient, fastdeploy: FastDeployStandIn
) -> None:
    await raw.request("POST", "/v1/pause")
    fastdeploy.hold_update = asyncio.Event()
    update = asyncio.create_task(raw.request("POST", "/v1/update_weights", {"version": "v2"}))
    await asyncio.wait_for(fastdeploy.update_started.wait(), 5)
    query = asyncio.create_task(raw.request("GET", "/v1/is_paused"))
    done, _ = await asyncio.wait({query}, timeout=0.2)
    assert not done, "is_paused waits behind the running update_weights"
    fastdeploy.hold_update.set()
    assert (await asyncio.wait_for(update, 5))[0] == 200
    assert (await asyncio.wait_for(query, 5))[0] == 200
    assert fastdeploy.names[-2:] == ["update_weights", "is_paused"]


async def test_the_agent_waits_for_a_slow_fastdeploy_update(
    agent_factory: AgentFactory, fastdeploy: FastDeployStandIn
) -> None:
    """FastDeploy's update_weights is synchronous: the agent is loading until it answers."""
    fastdeploy.hold_update = asyncio.Event()
    client = await _agent(agent_factory, fastdeploy)
    assert (await client.update("v2"))[0] == 202
    await asyncio.wait_for(fastdeploy.update_started.wait(), 5)
    assert (await client.status())["state"] == "loading"
    fastdeploy.hold_update.set()
    await wait_until(lambda: _version_is(client, "v2"), 10, "v2 live")


async def _version_is(client: AgentClient, version: str) -> bool:
    status = await client.status()
    return status["state"] == "idle" and status["version"] == version
