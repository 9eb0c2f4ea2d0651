"""Builders for the decide() tables (tests/operator/test_machine_*.py): a rollout in a given
situation, status fragments, the table row (`Case`), what a row observes of a plan, and the two
checks every table runs on each of its rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from ckpt_api.source_policy import parse_rule
from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.status import CheckpointRolloutStatus
from ckpt_api.vocabulary import ConditionType, EventReason, Phase, WaveKind, WavePhase
from ckpt_e2e.testdata import valid_spec, valid_spec_defaults
from ckpt_rollout.domain import machine
from ckpt_rollout.domain.machine import State, classify, decide
from ckpt_rollout.domain.mergepatch import apply_merge_patch
from ckpt_rollout.domain.plan import Draft, Meta, Plan, Rollout
from ckpt_rollout.domain.planning import rollout_order
from ckpt_rollout.domain.world import Memory, Now, Peer, Pod, Tuning, rfc3339

NOW = Now(wall=1_800_000_000.0, mono=10_000.0)
STAMP = NOW.stamp
EARLIER = rfc3339(NOW.wall - 60)
# The operator allows the Prometheus the analysis tables name (analysis_kit.PROM).
TUNING = Tuning(prometheus_allowed=(parse_rule("http://prometheus.monitoring:9090"),))
PODS = [f"p{i}" for i in range(4)]
ORDER = rollout_order(PODS, "u-1/v2")  # the machine's wave order for this rollout
CANARY, REST = ORDER[0], sorted(ORDER[1:])
BIG = [f"b{i:02d}" for i in range(12)]  # more than Tuning.push_max_wave: a pulled wave
BIG_ORDER = rollout_order(BIG, "u-1/v2")
DIGEST = "sha256:" + "ab" * 32
DEADLINE_WAKE = 1800 + 1  # a rollout started now looks again when its deadline has passed


def rollout(
    status: dict[str, Any] | None = None,
    *,
    spec: dict[str, Any] | None = None,
    pods: list[str] = PODS,
    annotations: dict[str, str] | None = None,
    peers: tuple[Peer, ...] = (),
) -> Rollout:
    wire = apply_merge_patch(valid_spec_defaults(), {**valid_spec(), "version": "v2"})
    wire = apply_merge_patch(wire, spec or {})
    return Rollout(
        meta=Meta("rl", "fleet", "u-1", 3, "t1", annotations or {}),
        spec=CheckpointRolloutSpec.model_validate(wire),
        status=CheckpointRolloutStatus.model_validate(status or {}),
        pods={n: Pod(n, f"10.0.0.{i + 1}", {"app": "rollout-worker"}) for i, n in enumerate(pods)},
        peers=peers,
    )


def progressing(*waves: dict[str, Any], **more: Any) -> dict[str, Any]:
    return {
        "phase": "Progressing",
        "targetVersion": "v2",
        "previousVersion": "v1",
        "startedAt": EARLIER,
        "waves": list(waves),
        **more,
    }


def wave(index: int, pods: list[str], *, called: list[str] | None = None, **more: Any) -> dict[str, Any]:
    status = {"index": index, "kind": "Spec", "specIndex": index, "target": len(pods), "pods": pods}
    return {**status, "called": pods if called is None else called, "startedAt": EARLIER, **more}


def done(index: int, pods: list[str]) -> dict[str, Any]:
    return wave(index, pods, phase="Completed", updated=len(pods), completedAt=EARLIER)


def entry(version: str, phase: str, reason: str = "Loaded") -> dict[str, Any]:
    return {"version": version, "phase": phase, "reason": reason, "message": f"{reason} {version}"}


def written(plan: Plan) -> dict[str, Any]:
    """The plan's status as the next step reads it back from the CR."""
    return plan.status.model_dump(mode="json", by_alias=True, exclude_none=True)


def ip(pod: str, pods: list[str] = PODS) -> str:
    """The IP of ``pod`` in a rollout of ``pods``, as rollout() numbers them."""
    return f"10.0.0.{pods.index(pod) + 1}"


def url(pod: str, pods: list[str] = PODS) -> str:
    return f"http://{ip(pod, pods)}:8089"


def called_long_ago(*pods: str) -> Memory:
    return Memory(call_times=dict.fromkeys(pods, NOW.mono - 10_000))


def called_now(*pods: str, **more: Any) -> Memory:
    return Memory(call_times=dict.fromkeys(pods, NOW.mono), **more)


@dataclass(frozen=True)
class Case:
    id: str
    rollout: Rollout
    state: State
    phase: Phase | None
    calls: list[str] = field(default_factory=list)
    pulls: list[str] = field(default_factory=list)
    events: list[EventReason] = field(default_factory=list)
    wake: float | None = None
    memory: Memory = field(default_factory=Memory)
    probe: str | None = None
    # (pod, version) of each load the plan cancels.
    cancels: list[tuple[str, str]] = field(default_factory=list)
    tuning: Tuning = field(default_factory=lambda: TUNING)
    # Anything else the row is about: observe(plan) must equal observed.
    observe: Callable[[Plan], object] = lambda plan: None
    observed: object = None


def ids(cases: list[Case]) -> list[str]:
    # Test ids must select their test by node id (mutmut runs each mutant's tests that way); pytest
    # escapes a non-ASCII id to `\xNN`, which no node id on a command line matches, so the mutant
    # run ended in a usage error counted as a kill. Such characters are spelled out instead.
    return ["".join(_spelled(c) for c in case.id) for case in cases]


def _spelled(char: str) -> str:
    return char if char.isascii() and char.isprintable() else f"U+{ord(char):04X}"


def wave_rows(plan: Plan) -> list[tuple[WaveKind, WavePhase, list[str], list[str]]]:
    return [(w.kind, w.phase, w.pods, w.called) for w in plan.status.waves]


def reports(plan: Plan) -> set[bool]:
    """Whether the calls ask their agents to write status.workers."""
    return {bool(c.request.rollout and c.request.rollout.report) for c in plan.calls}


def condition(plan: Plan, type_: ConditionType) -> tuple[str, str]:
    cond = next(c for c in plan.status.conditions if c.type == type_)
    return cond.status, cond.reason


def worker_row(plan: Plan, pod: str) -> tuple[object, ...]:
    w = plan.status.workers[pod]
    return w.phase, w.reason, w.message, w.wave, w.last_transition_time


def sources(plan: Plan) -> set[str | None]:
    """Where the calls have their agents fetch the bytes from (None: the source)."""
    return {c.request.source.peer if c.request.source else None for c in plan.calls}


def relays(plan: Plan) -> dict[str, tuple[str | None, bool | None]]:
    """Each call's (peer, relayWhileLoading), by pod: the chains of a pipelined wave."""
    return {
        c.pod: (c.request.source.peer, c.request.source.relay_while_loading)
        for c in plan.calls
        if c.request.source is not None
    }


def assert_decides(case: Case) -> None:
    """The row's state, and the plan it must produce."""
    assert classify(Draft(case.rollout, case.memory, TUNING, NOW)) is case.state
    plan = decide(case.rollout, case.memory, case.tuning, NOW)
    assert plan.status.phase is case.phase
    assert sorted(c.pod for c in plan.calls) == sorted(case.calls)
    assert [p.pod for p in plan.pulls] == case.pulls
    assert [e.reason for e in plan.events] == case.events
    assert (plan.probe.pod if plan.probe else None) == case.probe
    assert sorted((c.pod, c.version) for c in plan.cancels) == sorted(case.cancels)
    assert plan.wake_after == (None if case.wake is None else pytest.approx(case.wake))
    # Intent first: every pod called is recorded as called in the status to be written.
    recorded = {p for w in plan.status.waves for p in w.called}
    recorded |= set(plan.status.rollback.called) if plan.status.rollback else set()
    assert {c.pod for c in plan.calls} <= recorded
    assert case.observe(plan) == case.observed


def assert_comes_to_rest(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    """A step chains transitions while they plan no I/O and ends on one that says stop, never
    on the chain's bound (there it would stop short, mid-chain, waiting for nothing)."""
    goes_on: list[bool] = []

    def recorded(transition: Callable[[Draft], bool]) -> Callable[[Draft], bool]:
        def run(d: Draft) -> bool:
            goes_on.append(transition(d))
            return goes_on[-1]

        return run

    for state, transition in list(machine.TRANSITIONS.items()):
        monkeypatch.setitem(machine.TRANSITIONS, state, recorded(transition))
    decide(case.rollout, case.memory, case.tuning, NOW)
    assert goes_on[-1] is False
    assert len(goes_on) < machine._MAX_TRANSITIONS


def table_tests(cases: list[Case]) -> tuple[Callable[..., None], Callable[..., None]]:
    """The two tests every table runs, parametrized over its rows: bind them to `test_*` names
    in the table's module, where pytest collects them."""

    @pytest.mark.parametrize("case", cases, ids=ids(cases))
    def test_decide(case: Case) -> None:
        assert_decides(case)

    @pytest.mark.parametrize("case", cases, ids=ids(cases))
    def test_every_step_comes_to_rest(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
        assert_comes_to_rest(case, monkeypatch)

    return test_decide, test_every_step_comes_to_rest


def canary_done(
    id_: str,
    observe: Callable[[Plan], object],
    observed: object,
    *,
    spec: dict[str, Any] | None = None,
    tuning: Tuning | None = None,
) -> Case:
    """The canary loaded: the machine completes its wave and calls the rest (REST), which
    ``observe`` looks at."""
    return Case(
        id_,
        rollout(progressing(wave(0, [CANARY]), workers={CANARY: entry("v2", "Updated")}), spec=spec),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        tuning=tuning or TUNING,
        observe=observe,
        observed=observed,
    )
