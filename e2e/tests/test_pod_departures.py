"""Pods that leave mid-rollout, as drains, evictions and rolling restarts make them leave: the
canary still proves the version before anyone else is called, and a pod deleted gracefully (its
agent cancels its load and says so as it shuts down) is gone, not failed: the rollout goes on and
ends with every pod on the target. Scenarios like test_scenarios', with its helpers; on kwok
pods, whose pod runtime lets a pod leave as a kubelet does (Provider.stops_like_a_kubelet)."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from test_scenarios import BIG, ENDED, NAME, _calls, _loading, _reasons, _second_wave_loading, _serving, _why

from ckpt_e2e.providers import Provider

pytestmark = [pytest.mark.integration, pytest.mark.scenario]


def _delete(provider: Provider, pod: str) -> None:
    """`kubectl delete pod` as a user (or a rolling restart) does it: with its grace period."""
    provider.kubectl.run("delete", "pod", pod, "--wait=false")


def _evict(provider: Provider, pod: str) -> None:
    """The Eviction API, as `kubectl drain` uses it."""
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod, "namespace": provider.namespace},
    }
    provider.kubectl.run(
        "create", "--raw", f"/api/v1/namespaces/{provider.namespace}/pods/{pod}/eviction", "-f", "-",
        input=json.dumps(eviction),
    )  # fmt: skip


LEAVE: dict[str, Callable[[Provider, str], None]] = {"graceful-delete": _delete, "eviction": _evict}


def test_the_canary_replaced_mid_load_is_followed_by_another_canary(provider: Provider) -> None:
    """The canary's pod is replaced while it loads (it crashes: no report). The first wave takes
    another pod, which loads b2 before the rest are called: the canary wave completes with one
    pod updated, never with none."""
    fleet = provider.fleet(3, initial_version="b1", big=True)
    workers = {w.name: w for w in fleet.workers(3)}
    spec = provider.spec("b2", fleet, strategy={"waves": [1, "100%"], "peerRelay": False})
    with provider.source_stalled():
        provider.rollouts.create(NAME, spec)
        (canary,) = _loading(provider, fleet, workers, 0)
        provider.crash_worker(fleet, canary)
        fleet.workers(3)  # its replacement answers (booting on b1, which waits for the source too)

    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=240)
    assert status["phase"] == "Succeeded", _why(status)
    first = status["waves"][0]
    assert (first["phase"], first["updated"], first["gone"], first["failed"]) == ("Completed", 1, 1, 0)
    assert first["replaced"] == [canary]
    (second,) = first["pods"]
    assert second != canary
    now = fleet.workers(3)
    assert canary not in {w.name for w in now}
    assert (status["updatedReplicas"], status["replicas"], status["failedReplicas"]) == (3, 3, 0)
    assert set(_serving(provider, fleet, now, BIG).values()) == {"b2"}
    assert set(_calls(fleet, now).values()) == {1}, "nobody loaded b2 twice"
    assert "WorkerFailed" not in _reasons(provider)


@pytest.mark.parametrize("leave", list(LEAVE))
def test_a_pod_that_leaves_mid_wave_is_gone_and_the_rollout_goes_on(provider: Provider, leave: str) -> None:
    """A member of the second wave leaves gracefully while it loads: its agent cancels the load
    and reports it as it shuts down. With the default maxFailures 0 the rollout still succeeds:
    the member is gone, not failed, and its replacement is brought to b2."""
    with _second_wave_loading(provider) as (fleet, _, victim):
        provider.stops_like_a_kubelet(victim)
        LEAVE[leave](provider, victim)
    # The source answers again: the victim's agent, told to stop meanwhile, cancels its load at
    # the next bytes and reports that as it shuts down.
    fleet.workers(3)  # its replacement answers

    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=240)
    assert status["phase"] == "Succeeded", _why(status)
    assert [(w["phase"], w["failed"]) for w in status["waves"]] == [("Completed", 0)] * len(status["waves"])
    assert sum(w["gone"] for w in status["waves"]) == 1
    now = fleet.workers(3)
    assert victim not in {w.name for w in now}
    assert (status["updatedReplicas"], status["replicas"], status["failedReplicas"]) == (3, 3, 0)
    assert not status.get("workers"), "nothing failed, and what the victim said went with it"
    assert set(_serving(provider, fleet, now, BIG).values()) == {"b2"}
    reasons = _reasons(provider)
    assert "WorkerFailed" not in reasons
    assert "RolloutCompleted" in reasons
