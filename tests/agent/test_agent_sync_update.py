"""Which update_weights calls the agent answers synchronously, in FastDeploy's envelope, and which
it answers at once with 202 (the operator's rollouts): a `rollout` or `Prefer: respond-async`
makes a call asynchronous, anything else waits for its load."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from agent_testkit import AgentClient, AgentFactory, Tree, close_to
from fastdeploy_standin import FastDeployStandIn

from ckpt_api.agent_api import UpdateWeightsRequest

ROLLOUT = {"namespace": "rl", "name": "fleet", "uid": "u", "wave": 0}


@pytest.fixture
async def client(tree: Tree, agent_factory: AgentFactory) -> AgentClient:
    c = await agent_factory(source=tree.file_uri, initial_version="v1")
    await c.wait_settled()
    return c


async def test_a_plain_call_answers_when_the_version_is_live(client: AgentClient, tree: Tree) -> None:
    """No prior pause needed (FastDeploy would answer 500): the agent pauses around the apply."""
    before = (await client.status())["updates"]
    code, reply = await client.update_sync("v2", verify_checksum=True)
    assert (code, reply["status"], reply["error_message"]) == (200, "success", "Success")
    assert reply["request_id"].startswith("control-")
    [rank] = reply["result"]
    assert (rank["version"], rank["rank"], rank["checksum_verified"]) == ("v2", 0, True)
    assert rank["bytes"] == sum(t["nbytes"] for t in tree.manifest("v2")["tensors"])
    assert rank["total_cost"] >= rank["update_cost"] > 0
    assert rank["sync_cost"] == pytest.approx(rank["total_cost"] - rank["update_cost"], abs=1e-5)
    # Answered after the load, not before: the version serves already, and traffic is back.
    assert close_to(await client.infer(), tree.expected("v2"))
    assert await client.is_paused() is False
    status = await client.status()
    assert status["version"] == "v2"
    assert status["updates"]["succeeded"] == before["succeeded"] + 1


async def test_a_live_version_is_a_success_that_loads_nothing(client: AgentClient) -> None:
    code, reply = await client.update_sync("v1", rsync_config={"etcd_server": "127.0.0.1:2379"})
    assert (code, reply["status"]) == (200, "success")
    assert [(r["version"], r["total_cost"]) for r in reply["result"]] == [("v1", 0.0)]
    assert (await client.status())["updates"]["noop"] == 1


async def test_a_failed_load_is_an_error_envelope_with_its_code(client: AgentClient, tree: Tree) -> None:
    code, reply = await client.update_sync("v404")
    assert (code, reply["status"]) == (404, "error")
    assert reply["error_message"].startswith("VersionNotFound: ")
    assert reply["result"] == {"reason": "VersionNotFound", "version": "v1", "weights_lost": False}

    pinned = {"uri": tree.file_uri, "manifestDigest": tree.digests["v1"]}
    code, reply = await client.update_sync("v2", source=pinned)
    assert (code, reply["result"]["reason"]) == (409, "ManifestDigestMismatch")
    code, reply = await client.update_sync("v2", source={"uri": "http://127.0.0.1:9"})
    assert (code, reply["result"]["reason"]) == (502, "SourceUnreachable")
    assert close_to(await client.infer(), tree.expected("v1")), "v1 serves throughout"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "version: required; the agent loads only a named version"),
        ({"version": 1}, "version: Input should be a valid string"),
        ({"version": "v2", "verify_checksum": "true"}, "verify_checksum: Input should be a valid boolean"),
    ],
)
async def test_bad_parameters_are_400s_in_fastdeploys_shape(
    client: AgentClient, body: dict[str, object], message: str
) -> None:
    """FastDeploy's 400s are bare {"error", "message"}; ours add the field."""
    code, reply = await client.request("POST", "/v1/update_weights", body)
    assert code == 400
    assert (reply["error"], reply["field"]) == ("InvalidRequest", message.split(":")[0])
    assert reply["message"].startswith(message), reply


async def test_the_operators_calls_stay_asynchronous(client: AgentClient) -> None:
    """The operator's client sends a `rollout` (UpdateWeightsRequest with RolloutRef) and no
    Prefer header: 202 at once, as before."""
    request = UpdateWeightsRequest.model_validate({"version": "v2", "rollout": ROLLOUT})
    code, reply = await client.request("POST", "/v1/update_weights", request.to_wire())
    assert (code, reply) == (202, {"accepted": True, "version": "v2"})
    assert (await client.wait_settled())["version"] == "v2"


@pytest.mark.parametrize("prefer", ["respond-async", "wait=10, Respond-Async", "respond-async; x=1"])
async def test_prefer_respond_async_makes_a_call_asynchronous(client: AgentClient, prefer: str) -> None:
    async with client.session.post(
        client.url + "/v1/update_weights", json={"version": "v2"}, headers={"Prefer": prefer}
    ) as resp:
        assert (resp.status, await resp.json()) == (202, {"accepted": True, "version": "v2"})
        assert resp.headers["Preference-Applied"] == "respond-async"
    assert (await client.wait_settled())["version"] == "v2"


async def test_other_preferences_leave_a_call_synchronous(client: AgentClient) -> None:
    code, reply = await client.request(
        "POST", "/v1/update_weights", {"version": "v2"}, headers={"Prefer": "return=minimal, wait=5"}
    )
    assert (code, reply["status"], reply["result"][0]["version"]) == (200, "success", "v2")


@pytest.fixture
async def slow_fastdeploy() -> AsyncIterator[FastDeployStandIn]:
    """A FastDeploy whose update_weights waits for the test: a load in progress, without sleeps."""
    standin = FastDeployStandIn("v1")
    standin.hold_update = asyncio.Event()
    await standin.server.start()
    yield standin
    standin.hold_update.set()
    await standin.server.stop()


async def test_a_call_during_a_load_is_a_409_envelope(
    agent_factory: AgentFactory, slow_fastdeploy: FastDeployStandIn
) -> None:
    fd = slow_fastdeploy
    client = await agent_factory(engine="fastdeploy", fastdeploy_url=fd.server.url, initial_version="v1")
    assert (await client.update("v2", rollout=ROLLOUT))[0] == 202
    await asyncio.wait_for(fd.update_started.wait(), 5)
    code, reply = await client.update_sync("v3")
    assert (code, reply["status"], reply["result"]) == (409, "error", None)
    assert reply["error_message"].startswith("LoadInProgress: a load of v2 is running")
    assert fd.hold_update is not None
    fd.hold_update.set()
    assert (await client.wait_settled())["version"] == "v2"


async def test_a_load_outlasting_the_wait_is_a_504_and_goes_on(
    agent_factory: AgentFactory, slow_fastdeploy: FastDeployStandIn
) -> None:
    fd = slow_fastdeploy
    client = await agent_factory(
        engine="fastdeploy", fastdeploy_url=fd.server.url, initial_version="v1", sync_update_timeout=0.2
    )
    code, reply = await client.update_sync("v2")
    assert (code, reply["status"]) == (504, "error")
    assert "still running after" in reply["error_message"]
    assert fd.hold_update is not None
    fd.hold_update.set()
    status = await client.wait_settled()
    assert (status["version"], fd.version) == ("v2", "v2")


async def test_a_client_that_hangs_up_does_not_cancel_the_load(
    agent_factory: AgentFactory, slow_fastdeploy: FastDeployStandIn
) -> None:
    fd = slow_fastdeploy
    client = await agent_factory(engine="fastdeploy", fastdeploy_url=fd.server.url, initial_version="v1")
    call = asyncio.create_task(client.update_sync("v2"))
    await asyncio.wait_for(fd.update_started.wait(), 5)
    call.cancel()  # closes the connection mid-request
    with pytest.raises(asyncio.CancelledError):
        await call
    assert fd.hold_update is not None
    fd.hold_update.set()
    status = await client.wait_settled()
    assert (status["version"], fd.commands) == ("v2", ["pause", "update_weights", "resume"])
