"""Big waves are pulled: agents are asked not to write status.workers, the operator pulls their
/v1/status and writes outcomes in a few patches. Reconcile steps against in-memory fakes of the
apiserver (merge patches on one object) and of the agents."""

from __future__ import annotations

from typing import Any

from ckpt_api.agent_api import AgentStatus, LastError, UpdateWeightsRequest
from ckpt_e2e.testdata import valid_spec, valid_spec_defaults
from ckpt_rollout.controller.executor import Reconciler
from ckpt_rollout.domain.mergepatch import apply_merge_patch
from ckpt_rollout.domain.world import Memory, Pod, Tuning
from ckpt_rollout.io.agent_client import CallResult

TARGET = "v2"


class FakeApi:
    """One CheckpointRollout; counts reads and status patches."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.gets = 0
        self.patches: list[dict[str, Any]] = []

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        self.gets += 1
        return self.obj

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        self.patches.append(status)
        self.obj = {**self.obj, "status": apply_merge_patch(self.obj.get("status") or {}, status)}
        return self.obj


class FakeAgents:
    """Agents that load at once; they push their outcome into the CR when the request asks."""

    def __init__(self, api: FakeApi, pods: list[Pod], *, failing: frozenset[str] = frozenset()) -> None:
        self.api = api
        self.by_ip = {p.ip: p.name for p in pods}
        self.version = dict.fromkeys(self.by_ip.values(), "v1")
        self.failing = failing
        self.calls: list[tuple[str, UpdateWeightsRequest]] = []
        self.pulls = 0
        self.pushes = 0

    async def update_weights(
        self, ip: str, port: int, request: UpdateWeightsRequest, *, namespace: str, pod: str = ""
    ) -> CallResult:
        name = self.by_ip[ip]
        # What goes on the wire parses back to the same request on the agent's side.
        assert UpdateWeightsRequest.model_validate(request.to_wire()) == request
        self.calls.append((name, request))
        phase = "Failed" if name in self.failing else "Updated"
        if phase == "Updated":
            self.version[name] = request.version
        assert request.rollout is not None
        if request.rollout.report:
            self.pushes += 1
            entry = {"version": request.version, "phase": phase, "reason": "Loaded"}
            status = apply_merge_patch(self.api.obj.get("status") or {}, {"workers": {name: entry}})
            self.api.obj = {**self.api.obj, "status": status}
        return CallResult(202, {"accepted": True})

    async def status(self, ip: str, port: int, *, namespace: str, pod: str = "") -> CallResult:
        self.pulls += 1
        name = self.by_ip[ip]
        failed = name in self.failing
        error = LastError(version=TARGET, reason="ChecksumMismatch", message="bad") if failed else None
        status = AgentStatus(version=self.version[name], state="idle", last_error=error)
        return CallResult(200, status.to_wire(), agent_status=status)


def _fleet(count: int) -> list[Pod]:
    return [
        Pod(f"w-{i:04d}", f"127.1.{i // 250}.{i % 250 + 1}", {"app": "rollout-worker"}) for i in range(count)
    ]


def _rollout(waves: list[Any], **spec: Any) -> dict[str, Any]:
    full = apply_merge_patch(valid_spec_defaults(), {**valid_spec(), "version": TARGET, **spec})
    full["strategy"]["waves"] = waves
    meta = {"namespace": "rl", "name": "fleet", "uid": "u-1", "generation": 1, "creationTimestamp": "t"}
    return {"metadata": meta, "spec": full, "status": {"stableVersion": "v1", "previousVersion": "v1"}}


async def _run(api: FakeApi, agents: FakeAgents, pods: list[Pod], max_steps: int = 60) -> dict[str, Any]:
    reconciler = Reconciler(api, agents, Tuning(poll_s=0, pull_first_s=0.0))  # type: ignore[arg-type]
    memory = Memory()
    for _ in range(max_steps):
        obj, _delay = await reconciler.step(await api.get("rl", "fleet"), pods, memory, lambda *_: None)
        status: dict[str, Any] = obj.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed", "RolledBack"):
            return status
    raise AssertionError(f"no terminal phase in {max_steps} steps: {api.obj.get('status')}")


async def test_big_waves_are_pulled_and_written_in_a_few_patches() -> None:
    pods = _fleet(1200)
    api = FakeApi(_rollout([1, "50%", "100%"]))
    agents = FakeAgents(api, pods)
    status = await _run(api, agents, pods)

    assert status["phase"] == "Succeeded"
    assert status["updatedReplicas"] == 1200
    assert status.get("workers", {}) == {}, "pulled successes are folded into the wave counters too"
    assert len(agents.calls) == 1200, "every worker called once"
    reports = {req.rollout.wave: req.rollout.report for _, req in agents.calls if req.rollout}
    assert reports == {0: True, 1: False, 2: False}, "the canary pushes; the 599/600-pod waves are pulled"
    assert agents.pushes == 1
    assert agents.pulls >= 1199
    # Per pulled wave: start, called (2 batches of 512 at most), outcomes, completion.
    assert len(api.patches) <= 25, len(api.patches)


async def test_a_pulled_failure_is_recorded_with_the_agents_reason() -> None:
    pods = _fleet(100)
    api = FakeApi(_rollout(["100%"], failurePolicy={"maxFailures": 0, "onFailure": "Halt"}))
    agents = FakeAgents(api, pods, failing=frozenset({"w-0042"}))
    status = await _run(api, agents, pods)

    assert status["phase"] == "Failed"
    entry = status["workers"]["w-0042"]
    assert (entry["phase"], entry["reason"], entry["version"]) == ("Failed", "ChecksumMismatch", TARGET)
    assert status["failedReplicas"] == 1
