"""The executor carries a Plan out: the status write first, then the calls, at most
spec.strategy.maxConcurrency at once; what the calls and pulls say goes into Memory."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from ckpt_api.agent_api import AgentStatus, UpdateWeightsRequest
from ckpt_api.vocabulary import AgentState, WorkerPhase
from ckpt_e2e.testdata import valid_spec, valid_spec_defaults
from ckpt_rollout.controller.executor import Reconciler
from ckpt_rollout.domain.mergepatch import apply_merge_patch
from ckpt_rollout.domain.world import Memory, Pod, Tuning
from ckpt_rollout.io.agent_client import CallResult


class Api:
    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.patches: list[dict[str, Any]] = []

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(status)
        self.obj = {**self.obj, "status": apply_merge_patch(self.obj.get("status") or {}, status)}
        return self.obj


class Agents:
    """Agents that take a while to answer, counting how many calls are in flight at once."""

    def __init__(self, api: Api, answer: int = 202) -> None:
        self.api = api
        self.answer = answer
        self.in_flight = 0
        self.most = 0
        self.called_before_recorded: list[str] = []

    async def update_weights(
        self, ip: str, port: int, request: UpdateWeightsRequest, *, namespace: str, pod: str = ""
    ) -> CallResult:
        name = f"w-{int(ip.rsplit('.', 1)[1]) - 1:03d}"
        called = {p for w in (self.api.obj.get("status") or {}).get("waves", []) for p in w.get("called", [])}
        if name not in called:
            self.called_before_recorded.append(name)
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        if self.answer == 400:
            return CallResult(400, {"error": "InvalidRequest", "message": "source.uri: refused"})
        if self.answer == 503:
            return CallResult(503, {"error": "AuthUnavailable", "message": "token review unavailable"})
        return CallResult(self.answer, {"accepted": True, "version": request.version})

    async def status(self, ip: str, port: int, *, namespace: str, pod: str = "") -> CallResult:
        status = AgentStatus(version="v1", state=AgentState.IDLE)
        return CallResult(200, status.to_wire(), agent_status=status)


def _rollout(count: int, concurrency: int) -> tuple[dict[str, Any], list[Pod]]:
    spec = apply_merge_patch(valid_spec_defaults(), {**valid_spec(), "version": "v2"})
    spec["strategy"].update(waves=["100%"], maxConcurrency=concurrency)
    meta = {"namespace": "rl", "name": "fleet", "uid": "u-1", "generation": 1, "resourceVersion": "1"}
    obj = {"metadata": meta, "spec": spec, "status": {"stableVersion": "v1", "previousVersion": "v1"}}
    pods = [Pod(f"w-{i:03d}", f"127.3.0.{i + 1}", {"app": "rollout-worker"}) for i in range(count)]
    return obj, pods


@pytest.mark.parametrize(("pods", "concurrency", "most"), [(40, 4, 4), (40, 16, 16), (3, 16, 3)])
async def test_calls_go_out_at_most_max_concurrency_at_once_after_the_intent_write(
    pods: int, concurrency: int, most: int
) -> None:
    obj, fleet = _rollout(pods, concurrency)
    api = Api(obj)
    agents = Agents(api)
    memory = Memory()
    await Reconciler(api, agents, Tuning()).step(api.obj, fleet, memory, lambda *_: None)  # type: ignore[arg-type]
    assert agents.most == most
    assert agents.called_before_recorded == [], "the status naming them as called is written first"
    assert len(api.patches) == 1
    assert sorted(memory.call_times) == [p.name for p in fleet]


async def test_a_rejected_call_is_heard_and_written_as_the_workers_failure_in_the_next_step() -> None:
    obj, fleet = _rollout(2, 4)
    api = Api(obj)
    agents = Agents(api, answer=400)
    memory = Memory()
    reconciler = Reconciler(api, agents, Tuning())  # type: ignore[arg-type]
    _, delay = await reconciler.step(api.obj, fleet, memory, lambda *_: None)
    assert delay == 0.0, "something was heard: the next step at once"
    assert {e.reason for e in memory.heard.values()} == {"InvalidRequest"}
    await reconciler.step(api.obj, fleet, memory, lambda *_: None)
    workers = api.obj["status"]["workers"]
    assert {n: (e["phase"], e["reason"]) for n, e in workers.items()} == {
        p.name: (WorkerPhase.FAILED, "InvalidRequest") for p in fleet
    }
    # Refused calls kept the old weights: nothing to roll back, so the rollback ends at once.
    assert (api.obj["status"]["phase"], api.obj["status"]["rollback"]["pods"]) == ("RolledBack", [])
    assert memory.heard == {}, "what was written is no longer held"


async def test_an_agent_that_cannot_review_our_token_is_called_again_not_failed() -> None:
    """503 AuthUnavailable: the agent's apiserver is away and the call did nothing, so the
    worker is not failed (that would roll the rollout back); it is called again after the busy
    retry interval, its worker timeout still running from the first attempt."""
    obj, fleet = _rollout(2, 4)
    api = Api(obj)
    agents = Agents(api, answer=503)
    memory = Memory()
    tuning = Tuning()
    reconciler = Reconciler(api, agents, tuning)  # type: ignore[arg-type]
    await reconciler.step(api.obj, fleet, memory, lambda *_: None)
    assert memory.heard == {}, "no failure heard"
    first = dict(memory.call_times)
    assert sorted(first) == [p.name for p in fleet]
    assert all(memory.busy_until[p.name] == pytest.approx(first[p.name] + tuning.busy_retry_s) for p in fleet)
    await reconciler.step(api.obj, fleet, memory, lambda *_: None)
    workers = api.obj["status"].get("workers") or {}
    assert all(e["phase"] != WorkerPhase.FAILED for e in workers.values()), "nobody written as failed"
    # What holds each up, kept to be shown once it lasts (tests/operator/test_machine_stalls.py).
    assert {n: t.reason for n, t in memory.troubles.items()} == dict.fromkeys(first, "AuthUnavailable")
    assert api.obj["status"]["phase"] == "Progressing"
    assert memory.call_times == first, "the worker timeout runs from the first attempt"


class SlowAgents(Agents):
    """Agents whose answer to update_weights never arrives in time (the call times out), and
    whose /v1/status says, once asked, whether they saw it: the first has loaded v2 meanwhile,
    the second never heard of it."""

    def __init__(self, api: Api) -> None:
        super().__init__(api)
        self.calls: list[str] = []
        self.asked: list[str] = []

    async def update_weights(
        self, ip: str, port: int, request: UpdateWeightsRequest, *, namespace: str, pod: str = ""
    ) -> CallResult:
        name = f"w-{int(ip.rsplit('.', 1)[1]) - 1:03d}"
        self.calls.append(name)
        return CallResult(0, {}, "TimeoutError: ")

    async def status(self, ip: str, port: int, *, namespace: str, pod: str = "") -> CallResult:
        name = f"w-{int(ip.rsplit('.', 1)[1]) - 1:03d}"
        self.asked.append(name)
        status = AgentStatus(version="v2" if name == "w-000" else "v1", state=AgentState.IDLE)
        return CallResult(200, status.to_wire(), agent_status=status)


async def test_a_call_without_an_answer_is_asked_about_not_failed() -> None:
    """#32 item 14: an agent too slow to answer (or a reset after the request went out) is no
    failed worker: nothing is written as failed, the call is not sent again blindly; its status
    is asked, and only what it says decides (loaded: Updated; never saw it: called again)."""
    obj, fleet = _rollout(2, 4)
    api = Api(obj)
    agents = SlowAgents(api)
    memory = Memory()
    reconciler = Reconciler(api, agents, Tuning(pull_after_s=0.0, busy_retry_s=0.0))  # type: ignore[arg-type]
    await reconciler.step(api.obj, fleet, memory, lambda *_: None)
    assert sorted(agents.calls) == ["w-000", "w-001"]
    assert memory.heard == {}, "no failure heard"
    assert memory.busy_until == {}, "not called again before its agent is asked"
    assert {t.reason for t in memory.troubles.values()} == {"AgentUnreachable"}
    await reconciler.step(api.obj, fleet, memory, lambda *_: None)
    assert sorted(agents.asked) == ["w-000", "w-001"]
    assert sorted(agents.calls) == ["w-000", "w-001"], "asked first, not called"
    await reconciler.step(api.obj, fleet, memory, lambda *_: None)
    workers = api.obj["status"].get("workers") or {}
    assert all(e["phase"] != WorkerPhase.FAILED for e in workers.values()), workers
    assert api.obj["status"]["phase"] == "Progressing"
    assert agents.calls.count("w-001") == 2, "the agent that never saw the call is called again"
    assert agents.calls.count("w-000") == 1, "the one that loaded it is not"


class ApiWithEvents(Api):
    """The CR store, and the Warning events of pods (or a refusal to list them)."""

    def __init__(
        self, obj: dict[str, Any], events: dict[str, list[dict[str, Any]]], refuse: bool = False
    ) -> None:
        super().__init__(obj)
        self.events = events
        self.refuse = refuse
        self.reads: list[str] = []

    async def pod_warnings(self, namespace: str, uid: str) -> list[dict[str, Any]]:
        self.reads.append(uid)
        if self.refuse:
            raise ApiException(status=403, reason="Forbidden")
        return self.events.get(uid, [])


def _creating(name: str, uid: str, age: float, labels: dict[str, str]) -> dict[str, Any]:
    created = datetime.fromtimestamp(time.time() - age, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {
        "phase": "Pending",
        "containerStatuses": [{"name": "agent", "state": {"waiting": {"reason": "ContainerCreating"}}}],
    }
    meta = {"name": name, "namespace": "rl", "uid": uid, "labels": labels, "creationTimestamp": created}
    return {"metadata": meta, "status": status}


MOUNT_FAILED = {
    "type": "Warning",
    "reason": "FailedMount",
    "message": 'MountVolume.SetUp failed for volume "agent-tls" : secret "ckpt-rollout-agent-tls" not found',
    "lastTimestamp": "2026-12-02T10:00:05Z",
}


async def test_a_pod_stuck_creating_is_named_with_its_warning_event_read_once_per_ttl() -> None:
    obj, _ = _rollout(1, 1)
    api = ApiWithEvents(obj, {"uid-stuck": [MOUNT_FAILED]})
    waiting = [
        _creating("w-stuck", "uid-stuck", 10, {"app": "rollout-worker"}),
        _creating("w-young", "uid-young", 1, {"app": "rollout-worker"}),  # events not read yet
        _creating("other", "uid-other", 60, {"app": "someone-else"}),  # not selected
    ]
    reconciler = Reconciler(api, Agents(api), Tuning())  # type: ignore[arg-type]
    memory = Memory()
    for _ in range(2):
        await reconciler.step(api.obj, [], memory, lambda *_: None, waiting=waiting)
    assert api.reads == ["uid-stuck"]  # once: the second step is within WARNINGS_TTL_S
    message = api.obj["status"]["message"]
    assert "w-stuck: FailedMount: container agent cannot be created: MountVolume.SetUp failed" in message
    assert "w-young" not in message


async def test_without_leave_to_list_events_a_stuck_pod_is_still_named_later() -> None:
    obj, _ = _rollout(1, 1)
    api = ApiWithEvents(obj, {}, refuse=True)
    waiting = [_creating("w-stuck", "uid-stuck", 30, {"app": "rollout-worker"})]
    await Reconciler(api, Agents(api), Tuning()).step(api.obj, [], Memory(), lambda *_: None, waiting=waiting)  # type: ignore[arg-type]
    assert api.reads == ["uid-stuck"]
    assert (
        "w-stuck: ContainerCreating: container agent not created within 20s" in api.obj["status"]["message"]
    )
