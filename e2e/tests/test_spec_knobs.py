"""The spec knobs a user tunes, each seen doing its job in a real rollout on the local control
plane (real agents, paddle tensors): a timed pause between waves, the failure budget in both
its forms, maxConcurrency, and a call the operator recorded but never got through before it
died, sent by the next operator.

Workers are made to fail or hang by SIGSTOP on their agent process: the kernel still accepts
the operator's connection, no answer ever comes, and the call ends on the operator's agent
timeout (3 s in the harness, OperatorProcess) as AgentUnreachable.
"""

from __future__ import annotations

import itertools
import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.vocabulary import PROMOTE_ANNOTATION, AgentState, UpdateResult
from ckpt_e2e.procs import wait_for
from ckpt_e2e.providers import Provider, WorkerFleet
from ckpt_e2e.rollout_env import Worker, agent_state, load_calls, serving_versions, update_calls
from ckpt_e2e.rollout_fixtures import Fleet

pytestmark = pytest.mark.integration

NAME = "fleet"
ENDED = {"Succeeded", "Failed", "RolledBack"}
SMALL = ("v1", "v2", "v3")
AGENT_TIMEOUT_S = 3  # the harness's --agent-timeout (OperatorProcess)
PAUSE_S = 6


def _stamp(value: str) -> float:
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%S%z").timestamp()


def _why(status: dict[str, Any]) -> str:
    return f"{status.get('message')}; workers={status.get('workers')}; waves={status.get('waves')}"


def _serving(provider: Provider, fleet: WorkerFleet, workers: list[Worker]) -> dict[str, str | None]:
    return serving_versions(workers, fleet.token, {v: provider.version_dir(v) for v in SMALL})


@contextmanager
def _hung(fleet: WorkerFleet, workers: list[Worker]) -> Iterator[None]:
    """The agents of ``workers`` stopped for the block: connections accepted, never answered."""
    assert isinstance(fleet, Fleet), "stopping an agent needs the agents this harness runs"
    running = fleet.runtime.running()
    pids = [running[w.name].pid for w in workers]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


def _events_once_posted(provider: Provider, reason: str) -> list[dict[str, Any]]:
    """The rollout's events once one with ``reason`` is there: kopf posts events in the
    background, so the status can say Succeeded a moment before its events exist."""

    def posted() -> list[dict[str, Any]] | None:
        events = provider.rollouts.events(NAME)
        return events if any(e["reason"] == reason for e in events) else None

    return wait_for(posted, 30, f"a {reason} event", interval=0.2)


def test_a_timed_pause_between_waves_resumes_on_its_own(provider: Provider) -> None:
    """pauseAfterWave with pauseDurationSeconds: held after the canary that long, then the next
    wave starts without anyone promoting it. Someone touching the CR meanwhile (GitOps, a
    label) wakes the operator early; the pause still lasts its whole duration."""
    fleet = provider.fleet(2)
    workers = fleet.workers(2)
    strategy = {"waves": [1, "100%"], "pauseAfterWave": [0], "pauseDurationSeconds": PAUSE_S}
    provider.rollouts.create(NAME, provider.spec("v2", fleet, strategy=strategy))
    provider.rollouts.wait_phase(NAME, {"Paused"}, timeout=60)
    provider.rollouts.api.patch_namespaced_custom_object(
        GROUP, VERSION, provider.namespace, PLURAL, NAME, {"metadata": {"annotations": {"touched": "yes"}}}
    )
    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=60)
    assert status["phase"] == "Succeeded", _why(status)
    canary, rest = status["waves"]
    # Stamps have whole seconds: a pause of PAUSE_S can show as one second less.
    assert _stamp(rest["startedAt"]) - _stamp(canary["completedAt"]) >= PAUSE_S - 1, status["waves"]
    assert status["pausedSeconds"] >= PAUSE_S, status
    events = _events_once_posted(provider, "Resumed")
    paused = [e["message"] for e in events if e["reason"] == "Paused"]
    (message,) = paused
    assert message.endswith(f"for {PAUSE_S}s"), message  # a timed pause, not one for promote
    assert [e["reason"] for e in events].count("Resumed") == 1
    assert PROMOTE_ANNOTATION not in (provider.rollouts.get(NAME)["metadata"].get("annotations") or {})
    assert set(_serving(provider, fleet, workers).values()) == {"v2"}


@pytest.mark.parametrize(
    ("max_failures", "replicas", "hung", "budget", "phase"),
    [(1, 3, 1, 1, "Succeeded"), ("50%", 4, 2, 2, "Succeeded"), ("50%", 4, 3, 2, "Failed")],
    ids=["int-within", "percent-within", "percent-exceeded"],
)
def test_failures_within_the_budget_let_the_rollout_finish(
    provider: Provider, max_failures: int | str, replicas: int, hung: int, budget: int, phase: str
) -> None:
    """failurePolicy.maxFailures, as a count or a percent of the pods (rounded down): that many
    workers may fail and the rollout still succeeds; one more and it fails."""
    fleet = provider.fleet(replicas)
    workers = fleet.workers(replicas)
    stuck, healthy = workers[:hung], workers[hung:]
    spec = provider.spec(
        "v2",
        fleet,
        strategy={"waves": ["100%"]},
        failurePolicy={"maxFailures": max_failures, "onFailure": "Halt"},
    )
    with _hung(fleet, stuck):
        provider.rollouts.create(NAME, spec)
        # Read while they are still stopped: once resumed they take the queued call.
        status = provider.rollouts.wait_phase(NAME, ENDED, timeout=90)
    assert status["phase"] == phase, _why(status)
    entries = (status.get("workers") or {}).items()
    failed = {p: e["reason"] for p, e in entries if e["phase"] == "Failed"}
    assert failed == {w.name: "AgentUnreachable" for w in stuck}, _why(status)
    assert status["failedReplicas"] == hung
    if phase == "Succeeded":
        assert status["updatedReplicas"] == len(healthy)
        events = _events_once_posted(provider, "WaveCompleted")
        completed = [e["message"] for e in events if e["reason"] == "WaveCompleted"]
        assert completed == [
            f"wave 1/1 completed: {len(healthy)} updated, {hung} failed (within budget {budget})"
        ]
        assert set(_serving(provider, fleet, healthy).values()) == {"v2"}
    else:
        assert f"{hung} failed > budget {budget}" in status["message"], _why(status)


def test_max_concurrency_bounds_the_calls_in_flight(provider: Provider) -> None:
    """maxConcurrency 1: each call waits for the one before it. Every agent is stopped, so each
    call lasts the whole agent timeout, and the failures it records come that far apart."""
    fleet = provider.fleet(3)
    workers = fleet.workers(3)
    spec = provider.spec(
        "v2",
        fleet,
        strategy={"waves": ["100%"], "maxConcurrency": 1},
        failurePolicy={"onFailure": "Halt"},
    )
    with _hung(fleet, workers):
        provider.rollouts.create(NAME, spec)
        status = provider.rollouts.wait_phase(NAME, ENDED, timeout=90)
    entries = status.get("workers") or {}
    assert {p: e["reason"] for p, e in entries.items()} == {w.name: "AgentUnreachable" for w in workers}
    ends = sorted(_stamp(e["lastTransitionTime"]) for e in entries.values())
    gaps = [b - a for a, b in itertools.pairwise(ends)]
    # Whole-second stamps: a gap of AGENT_TIMEOUT_S can show as one second less.
    assert all(gap >= AGENT_TIMEOUT_S - 1 for gap in gaps), (gaps, entries)


def test_a_call_lost_with_the_operator_is_sent_by_the_next_one(provider: Provider) -> None:
    """The operator recorded the canary as called, but its calls never got through (the agent
    was busy with its boot load: 409), and it died. The next operator, knowing only the status,
    asks the agent, finds it never took the call, and calls it."""
    with provider.source_stalled():
        fleet = provider.fleet(1, at_rest=False)  # its boot load waits for the source
        (worker,) = fleet.workers(1)
        provider.rollouts.create(
            NAME, provider.spec("v2", fleet, strategy={"waves": ["100%"]}, timeouts={"workerSeconds": 20})
        )

        def refused_after_intent() -> dict[str, Any] | None:
            status = provider.rollouts.status(NAME)
            waves = status.get("waves") or []
            recorded = bool(waves) and waves[0].get("called") == [worker.name]
            busy = update_calls(worker, fleet.token, UpdateResult.CONFLICT) >= 1
            return status if recorded and busy else None

        wait_for(refused_after_intent, 60, "the call recorded, then refused as busy", interval=0.1)
        provider.kill_operator()
        frozen = provider.rollouts.status(NAME)
    assert frozen["phase"] == "Progressing"
    assert worker.name not in (frozen.get("workers") or {})
    wait_for(lambda: agent_state(worker, fleet.token) == AgentState.IDLE, 60, "the boot load to end")
    assert load_calls(worker, fleet.token) == 0, "no call reached the agent while it was free"

    provider.start_operator()
    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=90)
    assert status["phase"] == "Succeeded", _why(status)
    assert load_calls(worker, fleet.token) == 1
    assert _serving(provider, fleet, [worker]) == {worker.name: "v2"}
