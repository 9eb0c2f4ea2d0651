"""Properties of the reconcile machine and its merge patches, for arbitrary inputs.

The rollout runs step by step through decide(), with an in-test executor that stores the plan's
status, and agents that succeed, fail, answer busy, never get the call, or lose it, while pods
come and go between steps. Whatever happens: no pod is sent the same version twice unless the
earlier call provably did not start a load, every pod called was recorded as called before the
call went out, waves lose members only to replace the departed, and the rollout ends."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ckpt_api.agent_api import AgentStatus, LastError
from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.status import CheckpointRolloutStatus, WorkerStatus
from ckpt_api.vocabulary import TERMINAL_PHASES, AgentState, WorkerPhase, WorkerReason
from ckpt_e2e.testdata import valid_spec, valid_spec_defaults
from ckpt_rollout.controller.executor import record_call, record_pull, remember
from ckpt_rollout.domain.machine import decide
from ckpt_rollout.domain.mergepatch import apply_merge_patch, merge_diff
from ckpt_rollout.domain.plan import Call, Meta, Rollout
from ckpt_rollout.domain.world import Memory, Now, Pod, Tuning
from ckpt_rollout.io.agent_client import CallResult

# -- merge patches -----------------------------------------------------------------------------

_scalars = st.one_of(st.booleans(), st.integers(-5, 5), st.text(max_size=3))
# Values without nulls: a merge patch cannot set a null (null means delete).
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner, max_size=3),
    max_leaves=12,
)
_objects = st.dictionaries(st.text(max_size=2), _json, max_size=4)


@given(_objects, _objects)
def test_the_diff_applied_to_the_old_object_gives_the_new_one(
    old: dict[str, Any], new: dict[str, Any]
) -> None:
    before_old, before_new = copy.deepcopy(old), copy.deepcopy(new)
    patch = merge_diff(old, new)
    assert apply_merge_patch(old, patch) == new
    assert (old, new) == (before_old, before_new), "neither input is changed"
    if old == new:
        assert patch == {}


@given(_objects, _objects, _objects)
def test_the_diff_leaves_what_others_wrote_in_between(
    old: dict[str, Any], new: dict[str, Any], theirs: dict[str, Any]
) -> None:
    """Keys another writer added after our read (an agent's entry) survive our patch."""
    others = {f"other-{k}": v for k, v in theirs.items()}
    stored = apply_merge_patch({**old, **others}, merge_diff(old, new))
    assert {k: stored[k] for k in others} == others


# -- the machine under churn -------------------------------------------------------------------

TUNING = Tuning(push_max_wave=3)  # small, so both pushed and pulled waves occur
BEHAVIOURS = ("ok", "fail", "busy", "unreached", "lost")


@dataclass
class Agent:
    plan: list[str]  # what it does on successive calls; then "ok"
    live: str = "v1"
    failed: str | None = None
    loading: str | None = None  # set when a pushed call should report next step
    started: set[str] = field(default_factory=set)  # versions a load was started for

    def behaviour(self) -> str:
        return self.plan.pop(0) if self.plan else "ok"


@dataclass
class World:
    agents: dict[str, Agent]
    present: set[str]
    status: CheckpointRolloutStatus
    memory: Memory = field(default_factory=Memory)
    clock: float = 1_800_000_000.0
    calls: list[tuple[str, str, str]] = field(default_factory=list)  # (pod, version, behaviour)
    recorded_before: list[bool] = field(default_factory=list)


def _spec(waves: list[Any], max_failures: int) -> CheckpointRolloutSpec:
    wire = apply_merge_patch(valid_spec_defaults(), {**valid_spec(), "version": "v2"})
    wire = apply_merge_patch(
        wire, {"strategy": {"waves": waves}, "failurePolicy": {"maxFailures": max_failures}}
    )
    return CheckpointRolloutSpec.model_validate(wire)


def _step(world: World, spec: CheckpointRolloutSpec) -> None:
    """One step as the executor runs it (its own Memory bookkeeping), the agents simulated."""
    pods = {
        n: Pod(n, f"10.0.{i // 200}.{i % 200 + 1}", {"app": "rollout-worker"})
        for i, n in enumerate(sorted(world.present))
    }
    rollout = Rollout(Meta("rl", "fleet", "u-1", 1, "t", {}), spec, world.status, pods)
    now = Now(wall=world.clock, mono=world.clock)
    plan = decide(rollout, world.memory, TUNING, now)
    world.status = plan.status  # the executor's write (the diff of this, merged)
    remember(world.memory, plan, now.mono)
    recorded = {p for w in plan.status.waves for p in w.called}
    recorded |= set(plan.status.rollback.called) if plan.status.rollback else set()
    for call in plan.calls:
        world.recorded_before.append(call.pod in recorded)
        record_call(world.memory, call, _call(world, call), TUNING, world.clock, now.stamp)
    for pull in plan.pulls:
        record_pull(world.memory, pull, _pull(world, pull.pod), world.clock, now.stamp)
    if plan.probe is not None:
        world.memory.probed = (plan.probe.pod, world.agents[plan.probe.pod].live)
    world.clock += max(plan.wake_after if plan.wake_after is not None else 1.0, 0.5)


def _call(world: World, call: Call) -> CallResult:
    """The agent's side of an update_weights call, and its answer."""
    pod, version = call.pod, call.request.version
    report = bool(call.request.rollout and call.request.rollout.report)
    agent = world.agents[pod]
    what = agent.behaviour()
    world.calls.append((pod, version, what))
    if what == "unreached":  # no connection: the request surely never arrived
        return CallResult(0, {}, "cannot connect", connected=False)
    if what == "busy":  # another load runs
        return CallResult(409, {"error": "Conflict", "message": "a load is running"})
    accepted = CallResult(202, {"accepted": True, "version": version})
    if what == "lost":  # accepted, then the agent restarted and forgot it
        return accepted
    agent.started.add(version)
    if what == "fail":
        agent.failed = version
    else:
        agent.live, agent.failed = version, None
    if report:
        phase = WorkerPhase.FAILED if what == "fail" else WorkerPhase.UPDATED
        reason = WorkerReason.CHECKSUM_MISMATCH if what == "fail" else WorkerReason.LOADED
        entry = WorkerStatus(version=version, phase=phase, reason=reason)
        world.status = world.status.model_copy(update={"workers": {**world.status.workers, pod: entry}})
    return accepted


def _pull(world: World, pod: str) -> CallResult:
    """The agent's /v1/status answer (none from a pod that is gone)."""
    if pod not in world.present:
        return CallResult(0, {}, "cannot connect", connected=False)
    agent = world.agents[pod]
    error = LastError(version=agent.failed, reason="ChecksumMismatch", message="x") if agent.failed else None
    status = AgentStatus(version=agent.live, state=AgentState.IDLE, last_error=error)
    return CallResult(200, status.to_wire(), agent_status=status)


@st.composite
def _scenarios(
    draw: st.DrawFn,
) -> tuple[list[str], dict[str, list[str]], list[Any], int, list[tuple[int, str]]]:
    names = [f"p{i}" for i in range(draw(st.integers(1, 9)))]
    plans = {n: draw(st.lists(st.sampled_from(BEHAVIOURS), max_size=3)) for n in names}
    shapes: list[list[Any]] = [["100%"], [1, "100%"], [1, "50%", "100%"], [2, 3, "100%"]]
    waves = draw(st.sampled_from(shapes))
    max_failures = draw(st.integers(0, 3))
    churn = draw(st.lists(st.tuples(st.integers(0, 30), st.sampled_from(["leave", "join"])), max_size=3))
    return names, plans, waves, max_failures, churn


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_scenarios())
def test_under_churn_no_pod_is_loaded_twice_waves_keep_their_members_and_the_rollout_ends(
    scenario: tuple[list[str], dict[str, list[str]], list[Any], int, list[tuple[int, str]]],
) -> None:
    names, plans, waves, max_failures, churn = scenario
    spec = _spec(waves, max_failures)
    status = CheckpointRolloutStatus.model_validate({"stableVersion": "v1"})
    world = World({n: Agent(list(plans[n])) for n in names}, set(names), status)
    seen_waves: list[list[str]] = []
    for step in range(400):
        for at, what in churn:
            if at == step and what == "leave" and len(world.present) > 1:
                world.present.discard(sorted(world.present)[0])
            elif at == step and what == "join":
                name = f"late{step}"
                world.agents[name] = Agent([])
                world.present.add(name)
        _step(world, spec)
        waves_now = world.status.waves
        assert len(waves_now) >= len(seen_waves), "no wave is dropped"
        for before, now in zip(seen_waves, waves_now, strict=False):
            kept = set(now.pods) | set(now.replaced)
            assert set(before) <= kept, "a wave's members leave it only as departures it replaced"
        seen_waves = [list(w.pods) for w in waves_now]
        if world.status.phase in TERMINAL_PHASES and world.status.target_version == "v2":
            break
    else:
        raise AssertionError(f"no end in 400 steps: {world.status.phase} {world.status.message}")

    assert all(world.recorded_before), "every pod called is recorded as called in the status first"
    for pod, agent in world.agents.items():
        for version in {"v1", "v2"}:
            starts = [c for c in world.calls if c[0] == pod and c[1] == version and c[2] in ("ok", "fail")]
            assert len(starts) <= 1, f"{pod} was made to load {version} {len(starts)} times"
        # What status claims matches what the agent serves.
        entry = world.status.workers.get(pod)
        if entry is not None and entry.phase is WorkerPhase.UPDATED and pod in world.present:
            assert agent.live == entry.version
