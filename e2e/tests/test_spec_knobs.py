"""The spec knobs a user tunes, each seen doing its job in a real rollout on the local control
plane (real agents, paddle tensors): a timed pause between waves, the failure budget in both
its forms, maxConcurrency, and a call the operator recorded but never got through before it
died, sent by the next operator.

Workers are made to hang by SIGSTOP on their agent process: the kernel still accepts the
operator's connection, no answer ever comes, and the call ends on the operator's agent timeout
(3 s in the harness, OperatorProcess). A call without an answer is no failure by itself (#32 item
14): the operator asks the agent's status, and the worker fails at its timeout
(`timeouts.workerSeconds`, short here), the message naming what held it up.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import time
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
# timeouts.workerSeconds of the hung workers' rollouts: past the 10 s a healthy worker waits on
# a silent relay peer (a hung one) before it reads the source instead.
WORKER_S = 15
HUNG_TIMEOUTS = {"workerSeconds": WORKER_S, "progressDeadlineSeconds": 300}
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
        timeouts=HUNG_TIMEOUTS,
    )
    with _hung(fleet, stuck):
        provider.rollouts.create(NAME, spec)
        # Read while they are still stopped: once resumed they take the queued call.
        status = provider.rollouts.wait_phase(NAME, ENDED, timeout=90)
    assert status["phase"] == phase, _why(status)
    entries = (status.get("workers") or {}).items()
    failed = {p: e["reason"] for p, e in entries if e["phase"] == "Failed"}
    assert failed == {w.name: "WorkerTimeout" for w in stuck}, _why(status)
    for pod, entry in entries:
        if entry["phase"] == "Failed":
            assert f"no outcome within {WORKER_S}s (last: AgentUnreachable: " in entry["message"], (
                pod,
                entry,
            )
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


def _connected(workers: list[Worker]) -> set[str]:
    """The workers whose agent port some client holds an established connection to (the client's
    end of each connection names the agent's address as its peer)."""
    out = subprocess.run(
        ["ss", "-Htn", "state", "established"], capture_output=True, text=True, check=True, timeout=10
    ).stdout
    peers = {line.split()[3] for line in out.splitlines() if len(line.split()) >= 4}
    return {w.name for w in workers if f"{w.ip}:{w.port}" in peers}


def test_max_concurrency_bounds_the_calls_in_flight(provider: Provider) -> None:
    """maxConcurrency 1: each call waits for the one before it. Every agent is stopped, so each
    call holds its connection, unanswered, for the whole agent timeout: the agents are first
    contacted one after another, at least that far apart (a pull goes only to an agent already
    called, so the first connection an agent sees is its call)."""
    fleet = provider.fleet(3)
    workers = fleet.workers(3)
    spec = provider.spec(
        "v2",
        fleet,
        strategy={"waves": ["100%"], "maxConcurrency": 1},
        failurePolicy={"onFailure": "Halt"},
        timeouts=HUNG_TIMEOUTS,
    )
    with _hung(fleet, workers):
        provider.rollouts.create(NAME, spec)
        first_seen: dict[str, float] = {}
        deadline = time.monotonic() + 90
        while len(first_seen) < len(workers) and time.monotonic() < deadline:
            now = time.monotonic()
            for pod in _connected(workers):
                first_seen.setdefault(pod, now)
            time.sleep(0.05)
        status = provider.rollouts.wait_phase(NAME, ENDED, timeout=120)
    assert len(first_seen) == len(workers), first_seen
    starts = sorted(first_seen.values())
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(gap >= AGENT_TIMEOUT_S - 0.5 for gap in gaps), gaps
    entries = status.get("workers") or {}
    assert {p: e["reason"] for p, e in entries.items()} == {w.name: "WorkerTimeout" for w in workers}


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
