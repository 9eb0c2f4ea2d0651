"""Every status write — the operator's patches and the agents' worker entries — names only
fields the generated CRD declares (the apiserver silently prunes any other) and parses into
the ckpt_api status models. Reconcile steps run against in-memory fakes through rollouts that
reach every kind of write: waves pushed and pulled, pause and promote, supersede, drift,
failures with Halt and Rollback, abort, unreachable agents, worker timeouts, a selector
conflict, no workers."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ConfigDict

from ckpt_agent.service.report import rfc3339, worker_status_patch
from ckpt_api.agent_api import AgentStatus, LastError, UpdateWeightsRequest
from ckpt_api.status import CheckpointRolloutStatus
from ckpt_api.vocabulary import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    TERMINAL_PHASES,
    AgentState,
    Phase,
    WorkerPhase,
    WorkerReason,
)
from ckpt_api.worker_entries import worker_entry
from ckpt_e2e.crdschema import schema_problems, status_schema
from ckpt_e2e.testdata import valid_spec, valid_spec_defaults
from ckpt_rollout.controller.executor import Reconciler
from ckpt_rollout.domain.mergepatch import apply_merge_patch
from ckpt_rollout.domain.world import Memory, Peer, Pod, Tuning
from ckpt_rollout.io.agent_client import CallResult

SCHEMA = status_schema()


class StrictStatus(CheckpointRolloutStatus):
    """The status model with unknown top-level fields rejected too (the real one ignores them,
    so an older operator reads a newer status)."""

    model_config = ConfigDict(**{**CheckpointRolloutStatus.model_config, "extra": "forbid"})


class Recorder:
    """Checks every write against the CRD and the models, and remembers the fields written."""

    def __init__(self) -> None:
        self.fields: set[str] = set()
        self.writes = 0

    def check(self, who: str, patch: dict[str, Any], merged: dict[str, Any]) -> None:
        problems = schema_problems(patch, SCHEMA)
        assert not problems, f"{who} wrote fields the CRD lacks: {problems}"
        StrictStatus.model_validate(merged)
        self.fields |= set(_paths(patch, "status"))
        self.writes += 1


def _paths(value: Any, path: str) -> Iterator[str]:
    """Field paths, with pod names and list indexes generalized."""
    yield path
    if isinstance(value, dict):
        for key, item in value.items():
            part = "<pod>" if path == "status.workers" else key
            yield from _paths(item, f"{path}.{part}")
    elif isinstance(value, list):
        for item in value:
            yield from _paths(item, f"{path}[]")


class FakeApi:
    def __init__(self, obj: dict[str, Any], recorder: Recorder) -> None:
        self.obj = obj
        self.recorder = recorder

    def _apply(self, who: str, patch: dict[str, Any]) -> dict[str, Any]:
        status = apply_merge_patch(self.obj.get("status") or {}, patch)
        self.recorder.check(who, patch, status)
        self.obj = {**self.obj, "status": status}
        return self.obj

    async def get(self, namespace: str, name: str) -> dict[str, Any]:
        return self.obj

    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return self._apply("the operator", status)

    def agent_patch(self, body: dict[str, Any]) -> None:
        """What an agent's merge patch on the status subresource does."""
        assert set(body) == {"status"}, body
        self._apply("an agent", body["status"])


class FakeAgents:
    """Agents that push their entries with the agent's own builder (ckpt_agent.service.report), or
    answer /v1/status when the operator pulls; some fail, some are unreachable, some never
    finish."""

    def __init__(
        self,
        api: FakeApi,
        pods: list[Pod],
        *,
        failing: frozenset[str] = frozenset(),
        unreachable: frozenset[str] = frozenset(),
        stuck: frozenset[str] = frozenset(),
    ) -> None:
        self.api = api
        self.by_ip = {p.ip: p.name for p in pods}
        self.live = dict.fromkeys(self.by_ip.values(), "v1")
        self.failed: dict[str, str] = {}
        self.failing, self.unreachable, self.stuck = failing, unreachable, stuck
        self.cancelled: list[tuple[str, str]] = []  # (pod, version) of each load stopped

    def add(self, pod: Pod) -> None:
        self.by_ip[pod.ip] = pod.name
        self.live[pod.name] = "v1"

    async def update_weights(
        self, ip: str, port: int, request: UpdateWeightsRequest, *, namespace: str, pod: str = ""
    ) -> CallResult:
        name = self.by_ip[ip]
        if name in self.unreachable:
            return CallResult(0, {}, "ClientOSError: connection reset")
        rollout = request.rollout
        assert rollout is not None
        if rollout.report:
            self._push(name, request, WorkerPhase.LOADING, WorkerReason.LOADING)
        if name in self.stuck:
            return CallResult(202, {"accepted": True, "version": request.version})
        fails = name in self.failing and request.version != "v1"
        if fails:
            self.failed[name] = request.version
        else:
            self.live[name] = request.version
        if rollout.report:
            if fails:
                self._push(name, request, WorkerPhase.FAILED, WorkerReason.CHECKSUM_MISMATCH)
            else:
                self._push(name, request, WorkerPhase.UPDATED, WorkerReason.LOADED)
        return CallResult(202, {"accepted": True, "version": request.version})

    def _push(self, name: str, request: UpdateWeightsRequest, phase: WorkerPhase, reason: str) -> None:
        assert request.rollout is not None
        entry = worker_entry(
            version=request.version,
            phase=phase,
            reason=reason,
            message=f"{reason} {request.version}",
            checksum_verified=request.verify_checksum and phase is WorkerPhase.UPDATED,
            bytes=1 << 20,
            seconds=0.25,
            last_transition_time=rfc3339(),
            live_version=self.live[name],
            wave=request.rollout.wave,
            uid=request.rollout.uid,
        )
        self.api.agent_patch(worker_status_patch(name, entry))

    async def cancel_load(
        self, ip: str, port: int, version: str, *, namespace: str, pod: str = ""
    ) -> CallResult:
        """As the agent's route: a stuck load stops (old weights serving); with none, 404."""
        name = self.by_ip[ip]
        if name in self.unreachable:
            return CallResult(0, {}, "ClientOSError: connection reset")
        if name not in self.stuck:
            return CallResult(404, {"error": "NotFound", "message": "no load is running; nothing cancelled"})
        self.stuck = self.stuck - {name}
        self.cancelled.append((name, version))
        return CallResult(200, {"version": version, "ended": True, "liveVersion": self.live[name]})

    async def status(self, ip: str, port: int, *, namespace: str, pod: str = "") -> CallResult:
        name = self.by_ip[ip]
        if name in self.unreachable:
            return CallResult(0, {}, "ClientOSError: connection reset")
        version = self.failed.get(name)
        error = LastError(version=version, reason="ChecksumMismatch", message="bad") if version else None
        state = AgentState.LOADING if name in self.stuck else AgentState.IDLE
        status = AgentStatus(version=self.live[name], state=state, last_error=error, checksum_verified=True)
        return CallResult(200, status.to_wire(), agent_status=status)


def _fleet(count: int, first: int = 0) -> list[Pod]:
    return [
        Pod(f"w-{i:03d}", f"127.2.0.{i + 1}", {"app": "rollout-worker"}) for i in range(first, first + count)
    ]


def _rollout(**spec: Any) -> dict[str, Any]:
    full = apply_merge_patch(valid_spec_defaults(), {**valid_spec(), "version": "v2", **spec})
    meta = {"namespace": "rl", "name": "fleet", "uid": "u-1", "generation": 1, "creationTimestamp": "t1"}
    return {"metadata": meta, "spec": full, "status": {}}


class Run:
    def __init__(self, obj: dict[str, Any], pods: list[Pod], recorder: Recorder, **agents: Any) -> None:
        self.api = FakeApi(obj, recorder)
        self.pods = pods
        self.agents = FakeAgents(self.api, pods, **agents)
        tuning = Tuning(poll_s=0, pull_first_s=0.0, pull_after_s=0.0, pull_every_s=0.0, push_max_wave=3)
        self.reconciler = Reconciler(self.api, self.agents, tuning)  # type: ignore[arg-type]
        self.memory = Memory()
        self.peers: list[Peer] = []

    @property
    def status(self) -> dict[str, Any]:
        status: dict[str, Any] = self.api.obj.get("status") or {}
        return status

    async def steps(self, count: int = 1) -> dict[str, Any]:
        for _ in range(count):
            await self.reconciler.step(self.api.obj, self.pods, self.memory, lambda *_: None, self.peers)
        return self.status

    async def until(self, phases: set[Phase], max_steps: int = 80) -> dict[str, Any]:
        for _ in range(max_steps):
            if (
                self.status.get("phase") in phases
                and self.status.get("targetVersion") == self.spec["version"]
            ):
                return self.status
            await self.steps()
            self._outwait_unreachable()
        raise AssertionError(f"not in {phases} after {max_steps} steps: {self.status}")

    def _outwait_unreachable(self) -> None:
        """An agent that never answers fails only at the worker timeout (#32 item 14): here, as if
        it had passed since each call to one."""
        for name in self.agents.unreachable & set(self.memory.call_times):
            self.memory.call_times[name] = time.monotonic() - 10_000

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = self.api.obj["spec"]
        return spec

    def edit(self, *, spec: dict[str, Any] | None = None, annotations: dict[str, str] | None = None) -> None:
        obj = copy.deepcopy(self.api.obj)
        obj["spec"] = apply_merge_patch(obj["spec"], spec or {})
        obj["metadata"].setdefault("annotations", {}).update(annotations or {})
        obj["metadata"]["generation"] += 1
        self.api.obj = obj


def test_the_schema_walk_finds_what_the_apiserver_would_prune_or_reject() -> None:
    assert schema_problems({"workers": {"p": {"version": "v2", "servedVersion": "v1"}}}, SCHEMA) == [
        "status.workers.p.servedVersion: not in the CRD schema (the apiserver prunes it)"
    ]
    assert schema_problems({"waves": [{"index": "0", "updated": True}], "typo": 1}, SCHEMA) == [
        "status.waves[0].index: '0' is not integer",
        "status.waves[0].updated: True is not integer",
        "status.typo: not in the CRD schema (the apiserver prunes it)",
    ]
    assert schema_problems({"workers": {"p": None}, "rollback": None}, SCHEMA) == []


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


async def test_waves_pushed_and_pulled_pause_promote_supersede_and_drift(recorder: Recorder) -> None:
    pods = _fleet(8)
    strategy = {"waves": [1, 3, "100%"], "pauseAfterWave": [0]}
    run = Run(_rollout(strategy=strategy, verifyChecksum=True), pods, recorder)
    assert (await run.until({Phase.PAUSED}))["currentWave"] == 1
    run.edit(annotations={PROMOTE_ANNOTATION: "0"})
    await run.until({Phase.SUCCEEDED})
    run.pods = pods + _fleet(1, first=8)  # a pod appears after the rollout: drift
    run.agents.add(run.pods[-1])
    await run.until({Phase.PROGRESSING})
    await run.until({Phase.SUCCEEDED})
    run.edit(
        spec={"version": "v3", "strategy": {"waves": [2, "100%"], "pauseAfterWave": [0]}},
        annotations={PROMOTE_ANNOTATION: "-1"},  # the last promote was for v2
    )
    await run.until({Phase.PAUSED})
    run.edit(spec={"version": "v4"})  # supersedes v3 mid-rollout: a catch-up wave first
    status = await run.until({Phase.PAUSED})
    assert status["waves"][0]["kind"] == "CatchUp"
    run.edit(spec={"paused": True})
    await run.steps(2)
    run.edit(spec={"paused": False}, annotations={PROMOTE_ANNOTATION: "5"})
    assert (await run.until({Phase.SUCCEEDED}))["updatedReplicas"] == 9


@pytest.mark.parametrize("on_failure", ["Rollback", "Halt"])
@pytest.mark.parametrize("wave", [1, 4], ids=["pushed", "pulled"])
async def test_failures(recorder: Recorder, on_failure: str, wave: int) -> None:
    pods = _fleet(6)
    spec = {"strategy": {"waves": [wave, "100%"]}, "failurePolicy": {"onFailure": on_failure}}
    obj = _rollout(**spec)
    obj["status"] = {"stableVersion": "v1", "previousVersion": "v1"}
    run = Run(obj, pods, recorder, failing=frozenset({"w-000"}), unreachable=frozenset({"w-001"}))
    status = await run.until(set(TERMINAL_PHASES))
    # The unreachable worker may have loaded v2 (it is rolled back too), and stays unreachable:
    # the rollback fails.
    assert status["phase"] == Phase.FAILED
    assert ("rollback" in status) is (on_failure == "Rollback")


async def test_abort_then_a_rollback_that_fails(recorder: Recorder) -> None:
    pods = _fleet(4)
    obj = _rollout(strategy={"waves": [2, "100%"], "pauseAfterWave": [0]})
    obj["status"] = {"stableVersion": "v1", "previousVersion": "v1"}
    run = Run(obj, pods, recorder, unreachable=frozenset())
    await run.until({Phase.PAUSED})
    run.agents.unreachable = frozenset(p.name for p in pods)
    run.edit(annotations={ABORT_ANNOTATION: "v2"})
    status = await run.until({Phase.FAILED})
    assert status["rollback"]["phase"] == "Failed"


async def test_worker_timeout(recorder: Recorder) -> None:
    pods = _fleet(2)
    obj = _rollout(strategy={"waves": ["100%"]}, failurePolicy={"maxFailures": 1, "onFailure": "Halt"})
    run = Run(obj, pods, recorder, stuck=frozenset({"w-001"}))
    await run.steps(3)
    for name in list(run.memory.call_times):
        run.memory.call_times[name] = time.monotonic() - 10_000  # called long ago
    status = await run.until({Phase.SUCCEEDED})
    assert status["workers"]["w-001"]["reason"] == WorkerReason.WORKER_TIMEOUT
    # Given up, its load is stopped at once (#32 item 5), not left to hold the engine paused.
    assert run.agents.cancelled == [("w-001", "v2")]


async def test_no_workers_a_selector_conflict_and_the_deadline(recorder: Recorder) -> None:
    run = Run(_rollout(), [], recorder)
    assert (await run.steps(2))["phase"] == Phase.PENDING
    run.peers = [Peer("older", "t0", {"matchLabels": {"app": "rollout-worker"}})]
    assert (await run.steps(1))["message"].startswith("selector overlaps")
    run.peers = []
    run.pods = _fleet(2)
    run.agents = FakeAgents(run.api, run.pods, stuck=frozenset({"w-000"}))
    run.reconciler.agents = run.agents  # type: ignore[assignment]
    await run.steps(2)
    run.api.obj["status"]["startedAt"] = "2000-01-01T00:00:00Z"
    assert (await run.until(set(TERMINAL_PHASES)))["phase"] == Phase.ROLLED_BACK


async def test_every_field_written_is_in_the_crd_and_the_writes_covered_the_status() -> None:
    """Every scenario above, into one fresh recorder: what they wrote, together, covers the
    status (self-contained, so it holds whatever order or subset of tests runs)."""
    recorder = Recorder()
    await test_waves_pushed_and_pulled_pause_promote_supersede_and_drift(recorder)
    for on_failure in ("Rollback", "Halt"):
        for wave in (1, 4):
            await test_failures(recorder, on_failure, wave)
    await test_abort_then_a_rollback_that_fails(recorder)
    await test_worker_timeout(recorder)
    await test_no_workers_a_selector_conflict_and_the_deadline(recorder)
    assert recorder.writes > 50  # a real walk: one diffed write per step that changed something
    written = recorder.fields
    # The agent's entry, every field of it (liveVersion was once pruned by the apiserver).
    for field in ("liveVersion", "uid", "wave", "bytes", "seconds", "checksumVerified", "lastTransitionTime"):
        assert f"status.workers.<pod>.{field}" in written, field
    for field in ("waves[].kind", "waves[].specIndex", "waves[].gone", "rollback.called", "waveProgress"):
        assert f"status.{field}" in written, field
