"""The scenario suite: what a user of ckpt-rollout can count on, end to end.

Cluster-agnostic: the local control plane by default (kwok pods running real agents, the
operator as a process), any cluster with CKPT_E2E_KUBECONFIG (e2e/kind/run.sh: the chart's
operator, worker-image pods); see ckpt_e2e.providers for what differs. The scenarios whose
assertion needs a kubelet run a second time on the local control plane's real node with what the
kind path installs (the chart's operator pod, worker-image pods; ckpt_e2e.realnode_env): CI's run
of the users' path. The rest are the operator's and the agents' logic, which kwok pods running
real agents exercise alike; running them twice bought minutes, not coverage.
Every scenario asserts on the CR status, on the events, and on what each worker actually
serves (/v1/infer against the published weights), plus how many loads each agent accepted where
double work matters.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

import pytest

from ckpt_e2e.procs import wait_for
from ckpt_e2e.providers import Provider, WorkerFleet
from ckpt_e2e.rollout_env import (
    Worker,
    agent_state,
    conditions,
    http_json,
    load_calls,
    serving_versions,
)

# Every scenario on kwok pods with agent processes and the operator as a process (the provider
# fixture's default, "local", or the cluster CKPT_E2E_KUBECONFIG names).
pytestmark = [pytest.mark.integration, pytest.mark.scenario]
# ... and, for those whose assertion needs a kubelet, on the real node's chart-installed operator
# pod and worker-image pods too ("real-node", skipped on another cluster).
ALSO_ON_THE_REAL_NODE = pytest.mark.parametrize("provider", ["local", "real-node"], indirect=True)

NAME = "fleet"
SMALL = ("v1", "v2", "v3")
BIG = ("b1", "b2", "b3")
ENDED = {"Succeeded", "Failed", "RolledBack"}
MIN_OUTAGE_S = 3.0


def _serving(provider: Provider, fleet: WorkerFleet, workers: list[Worker], versions: tuple[str, ...]) -> Any:
    """pod -> which published version its /v1/infer answer matches."""
    return serving_versions(workers, fleet.token, {v: provider.version_dir(v) for v in versions})


def _calls(fleet: WorkerFleet, workers: list[Worker]) -> dict[str, float]:
    """pod -> update_weights requests that reached its agent free (every result but the 409s a
    busy agent answers by design; a 200 "already live" re-call counts)."""
    return {w.name: load_calls(w, fleet.token) for w in workers}


def _reasons(provider: Provider) -> list[str]:
    return [e["reason"] for e in provider.rollouts.events(NAME)]


def _why(status: dict[str, Any]) -> str:
    """What a failed phase assertion shows: the message, the failed workers, the waves."""
    return f"{status.get('message')}; workers={status.get('workers')}; waves={status.get('waves')}"


def _wave_called(provider: Provider, index: int) -> dict[str, Any]:
    """The status once wave ``index`` has called its pods."""

    def called() -> dict[str, Any] | None:
        status = provider.rollouts.status(NAME)
        waves = status.get("waves") or []
        return status if len(waves) > index and waves[index].get("called") else None

    return wait_for(called, 120, f"wave {index} calls", interval=0.05)


def _loading(provider: Provider, fleet: WorkerFleet, workers: dict[str, Worker], index: int) -> list[str]:
    """Wave ``index``'s pods once all are called and loading. Loads of even the big versions
    take a fraction of a second; scenarios that act mid-load start the wave inside
    ``provider.source_stalled()`` (peer relay off: the source is the only place to read from),
    which holds every load in progress until the block ends."""
    called: list[str] = _wave_called(provider, index)["waves"][index]["called"]

    def all_loading() -> bool:
        return all(agent_state(workers[p], fleet.token) == "loading" for p in called)

    wait_for(all_loading, 60, f"wave {index + 1} loads in progress", interval=0.1)
    return called


HELD = {"pauseAfterWave": [0], "peerRelay": False}  # + promote inside source_stalled(): wave 2 held


@contextmanager
def _second_wave_loading(provider: Provider) -> Iterator[tuple[WorkerFleet, dict[str, Worker], str]]:
    """Three pods on b1 rolling to b2 in waves [1, 100%]: the canary done, the second wave
    promoted with the source stalled. Yields (the fleet, its workers as they were, a pod of the
    second wave mid-load) while every load is held; the source answers again on exit."""
    fleet = provider.fleet(3, initial_version="b1", big=True)
    workers = {w.name: w for w in fleet.workers(3)}
    provider.rollouts.create(NAME, provider.spec("b2", fleet, strategy={"waves": [1, "100%"], **HELD}))
    provider.rollouts.wait_phase(NAME, {"Paused"})
    with provider.source_stalled():
        provider.cli("promote", NAME)
        victim, _ = _loading(provider, fleet, workers, 1)
        yield fleet, workers, victim


# Real node: the image rollout end to end — worker-image pods behind their readiness gate, as the
# image's uid on a read-only root, relaying to each other with their projected tokens, driven by
# the chart's operator pod.
@ALSO_ON_THE_REAL_NODE
def test_happy_path(provider: Provider) -> None:
    kubectl = provider.kubectl
    fleet = provider.fleet(5)
    workers = fleet.workers(5)
    assert set(_serving(provider, fleet, workers, SMALL).values()) == {"v1"}

    provider.rollouts.create(
        NAME, provider.spec("v2", fleet, verifyChecksum=True, strategy={"waves": [1, "60%", "100%"]})
    )
    kubectl.run("wait", "--for=condition=Complete", f"ckr/{NAME}", "--timeout=180s", timeout=200)

    status = provider.rollouts.status(NAME)
    assert status["phase"] == "Succeeded"
    assert (status["targetVersion"], status["stableVersion"], status["previousVersion"]) == ("v2", "v2", "v1")
    assert (status["updatedReplicas"], status["replicas"], status["failedReplicas"]) == (5, 5, 0)
    assert [len(w["pods"]) for w in status["waves"]] == [1, 2, 2]
    assert [(w["kind"], w["phase"], w["updated"]) for w in status["waves"]] == [
        ("Spec", "Completed", 1),
        ("Spec", "Completed", 2),
        ("Spec", "Completed", 2),
    ]
    assert status.get("workers", {}) == {}, "successes are folded into wave counters"
    conds = conditions(status)
    assert {t: conds[t]["status"] for t in ("Complete", "Ready", "Progressing", "Failed")} == {
        "Complete": "True",
        "Ready": "True",
        "Progressing": "False",
        "Failed": "False",
    }
    assert set(_serving(provider, fleet, workers, SMALL).values()) == {"v2"}
    assert set(_calls(fleet, workers).values()) == {1}
    # Peer relay (on by default): past the canary each wave is chains from the updated pods,
    # the source feeding one chain too while members are left: wave 2 (2 members) takes one
    # from the canary and one from the source, wave 3 (2 members, 3 holders) takes both from peers.
    (canary,) = status["waves"][0]["pods"]
    lasts = {w.name: http_json(w.url("/v1/status"), token=fleet.token)["last_load"] for w in workers}
    assert {name for name, last in lasts.items() if last["peer"] is None} == {
        canary,
        status["waves"][1]["pods"][1],
    }
    for last in lasts.values():
        assert last["fallback_reason"] is None, last
        assert last["bytes_from_peer"] == (0 if last["peer"] is None else last["bytes"]), last
    size = lasts[canary]["bytes"]
    assert [(w["bytesFromSource"], w["bytesFromPeers"]) for w in status["waves"]] == [
        (size, 0),
        (size, size),
        (0, 2 * size),
    ]

    reasons = _reasons(provider)
    assert reasons.count("RolloutStarted") == 1
    assert reasons.count("WaveStarted") == 3
    assert reasons.count("WaveCompleted") == 3
    assert "RolloutCompleted" in reasons
    assert "WorkerFailed" not in reasons

    table = kubectl.run("get", "ckr", NAME).stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "VERSION", "TARGET", "PHASE", "UPDATED", "REPLICAS", "WAVE", "AGE"]
    assert table.splitlines()[1].split()[1:7] == ["v2", "v2", "Succeeded", "5", "5", "3/3"]


def test_pipelined_relay_takes_the_second_wave_from_peers(provider: Provider) -> None:
    """waves [1, "100%"]: the second wave's members are chains fed by the canary and the source,
    members feeding each other while they load (relayWhileLoading); most of its bytes come from
    peers, as the status records, and every worker serves v2."""
    fleet = provider.fleet(5, initial_version="b1", big=True)
    workers = fleet.workers(5)
    provider.rollouts.create(NAME, provider.spec("b2", fleet, strategy={"waves": [1, "100%"]}))
    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=240)
    assert status["phase"] == "Succeeded", _why(status)
    lasts = {w.name: http_json(w.url("/v1/status"), token=fleet.token)["last_load"] for w in workers}
    size = max(last["bytes"] for last in lasts.values())
    second = status["waves"][1]
    assert len(second["pods"]) == 4
    # One chain from the canary, one from the source: the source sends the canary's copy and one more.
    assert (second["bytesFromSource"], second["bytesFromPeers"]) == (size, 3 * size)
    fed_by = {name: last["peer"] for name, last in lasts.items()}
    assert sum(peer is None for peer in fed_by.values()) == 2
    assert all(last["fallback_reason"] is None for last in lasts.values()), lasts
    # Members fed by members of their own wave (the chains' second links).
    by_ip = {w.ip: w.name for w in workers}
    parents = {by_ip.get(urlsplit(peer).hostname or "") for peer in fed_by.values() if peer} - {None}
    assert parents & set(second["pods"]), fed_by
    assert set(_serving(provider, fleet, workers, BIG).values()) == {"b2"}


def test_corrupted_tensor_with_verify_changes_no_worker(provider: Provider) -> None:
    """v-corrupt has one flipped byte in layers.1.weight; the manifest's checksum catches it."""
    fleet = provider.fleet(4)
    workers = fleet.workers(4)
    provider.rollouts.create(
        NAME,
        provider.spec(
            "v-corrupt",
            fleet,
            verifyChecksum=True,
            strategy={"waves": [1, "100%"]},
            failurePolicy={"maxFailures": 0, "onFailure": "Halt"},
        ),
    )
    status = provider.rollouts.wait_phase(NAME, ENDED)
    assert status["phase"] == "Failed"
    assert len(status["waves"]) == 1, "no wave after the failed canary"
    assert status["waves"][0]["phase"] == "Failed"
    (canary,) = status["waves"][0]["pods"]
    entry = status["workers"][canary]
    assert (entry["phase"], entry["reason"]) == ("Failed", "ChecksumMismatch")
    assert "layers.1.weight" in entry["message"]
    assert status["failedReplicas"] == 1
    failed = conditions(status)["Failed"]
    assert (failed["status"], failed["reason"]) == ("True", "ChecksumMismatch")

    # The canary still serves v1; nobody else was even asked.
    assert set(_serving(provider, fleet, workers, SMALL).values()) == {"v1"}
    assert _calls(fleet, workers) == {w.name: (1 if w.name == canary else 0) for w in workers}
    reasons = _reasons(provider)
    assert {"WorkerFailed", "RolloutFailed"} <= set(reasons)
    assert "RollbackStarted" not in reasons


def test_truncated_shard_without_verify_keeps_old_weights(provider: Provider) -> None:
    """v-truncated's shard lost its second half at the source; without checksums the agent still
    finds out (short read), reports TruncatedShard, and never applies a partial model."""
    fleet = provider.fleet(3)
    workers = fleet.workers(3)
    provider.rollouts.create(NAME, provider.spec("v-truncated", fleet, strategy={"waves": [1, "100%"]}))
    status = provider.rollouts.wait_phase(NAME, ENDED)
    # Default policy (maxFailures 0, Rollback): the failed canary kept its weights, so the
    # rollback has nobody to move.
    assert status["phase"] == "RolledBack", _why(status)
    (canary,) = status["waves"][0]["pods"]
    entry = status["workers"][canary]
    assert (entry["phase"], entry["reason"]) == ("Failed", "TruncatedShard")
    assert ".safetensors" in entry["message"]
    assert entry.get("checksumVerified") is not True
    assert status["rollback"]["version"] == "v1"
    assert status["rollback"]["pods"] == []
    assert "TruncatedShard" in status["message"]
    failed = conditions(status)["Failed"]
    assert (failed["status"], failed["reason"]) == ("True", "TruncatedShard")

    assert set(_serving(provider, fleet, workers, SMALL).values()) == {"v1"}
    assert _calls(fleet, workers) == {w.name: (1 if w.name == canary else 0) for w in workers}
    reasons = _reasons(provider)
    assert {"WorkerFailed", "RollbackStarted", "RolledBack"} <= set(reasons)
    assert "RolloutCompleted" not in reasons


def test_agent_killed_mid_load(provider: Provider) -> None:
    """A worker crashes while it loads; its Deployment replaces the pod. The rollout counts the
    old pod as gone (not failed), brings the replacement (booted on b1) to b2 in its place in the
    wave, and succeeds with every worker on b2."""
    with _second_wave_loading(provider) as (fleet, workers, victim):
        provider.crash_worker(fleet, victim)
        # Its replacement answers before the wave can end (its boot load waits for the source
        # too): a real pod takes seconds to start, a kwok pod none, and the rollout must see it.
        fleet.workers(3)

    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=240)
    assert status["phase"] == "Succeeded", _why(status)
    now = fleet.workers(3)
    (replacement,) = [w for w in now if w.name not in workers]
    assert victim not in {w.name for w in now}
    wave = status["waves"][1]
    assert (wave["phase"], wave["updated"], wave["gone"], wave["failed"]) == ("Completed", 2, 1, 0)
    assert (wave["replaced"], replacement.name in wave["pods"]) == ([victim], True)
    assert len(status["waves"]) == 2, "no drift wave: the replacement took the victim's place"
    assert (status["updatedReplicas"], status["replicas"]) == (3, 3)
    assert conditions(status)["Complete"]["status"] == "True"

    assert set(_serving(provider, fleet, now, BIG).values()) == {"b2"}
    assert set(_calls(fleet, now).values()) == {1}
    reasons = _reasons(provider)
    assert reasons.count("WaveStarted") == 3  # the two waves, and the replacement joining
    assert "RolloutCompleted" in reasons
    assert "WorkerFailed" not in reasons


# Real node: the chart's operator pod deleted and its Deployment's next pod (probes, in-cluster
# client) resuming from the status.
@ALSO_ON_THE_REAL_NODE
def test_operator_killed_mid_wave(provider: Provider) -> None:
    """The operator dies while wave 2 loads; the loads end with no operator watching. A new
    operator resumes from the CR status alone: it calls nobody twice and finishes the rollout."""
    fleet = provider.fleet(5, initial_version="b1", big=True)
    workers = {w.name: w for w in fleet.workers(5)}
    provider.rollouts.create(
        NAME, provider.spec("b2", fleet, verifyChecksum=True, strategy={"waves": [1, "60%", "100%"], **HELD})
    )
    provider.rollouts.wait_phase(NAME, {"Paused"})
    with provider.source_stalled():
        provider.cli("promote", NAME)
        held = _loading(provider, fleet, workers, 1)
        provider.kill_operator()
        frozen = provider.rollouts.status(NAME)
    assert frozen["phase"] == "Progressing"
    assert frozen["waves"][1]["phase"] == "Running", "killed in the middle of wave 2"
    wait_for(
        lambda: all(agent_state(workers[p], fleet.token) == "idle" for p in held), 60, "wave 2 loads to end"
    )

    provider.start_operator()
    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=240)
    assert status["phase"] == "Succeeded", _why(status)
    assert [w["phase"] for w in status["waves"]] == ["Completed"] * 3
    assert [w["updated"] for w in status["waves"]] == [1, 2, 2]
    assert status["updatedReplicas"] == 5
    # The new operator resumed from the status: nobody was called twice.
    assert set(_calls(fleet, list(workers.values())).values()) == {1}
    assert set(_serving(provider, fleet, list(workers.values()), BIG).values()) == {"b2"}
    reasons = _reasons(provider)
    assert reasons.count("RolloutStarted") == 1
    assert reasons.count("WaveStarted") == 3
    assert "RolloutCompleted" in reasons


# Real node: the kubelet, the operator pod's in-cluster client (Service IP, kube-proxy) and the
# agents' projected tokens across an apiserver restart.
@ALSO_ON_THE_REAL_NODE
def test_kube_apiserver_restarted_mid_rollout(provider: Provider) -> None:
    """The apiserver goes away while wave 2 loads and stays away until the loads are over:
    the agents cannot report, the operator cannot write. Once it is back the rollout ends
    Succeeded, from what the agents say, without calling anyone twice, and the operator's
    rollout loop rode through the outage (kopf would restart a crashed one a minute later)."""
    fleet = provider.fleet(4, initial_version="b1", big=True)
    workers = {w.name: w for w in fleet.workers(4)}
    provider.rollouts.create(NAME, provider.spec("b2", fleet, strategy={"waves": [1, "100%"]}))
    called = _wave_called(provider, 1)["waves"][1]["called"]
    # This test's own token freshly reviewed by each agent, as the operator's is by its calls and
    # pulls: agents keep an allowed caller's answer through an outage (STALE_IF_UNAVAILABLE_S),
    # never one they have not reviewed lately.
    for pod in called:
        agent_state(workers[pod], fleet.token)
    with provider.apiserver_down():
        down_since = time.monotonic()

        def loads_over() -> bool:
            return all(agent_state(workers[p], fleet.token) not in ("loading", None) for p in called)

        wait_for(loads_over, 120, "wave 2 loads to end while the apiserver is down", interval=0.2)
        # An outage as long as a real restart's, so every client (operator loop, watches,
        # agents' reports) meets it, not only the ones that happen to run right now.
        time.sleep(max(0.0, MIN_OUTAGE_S - (time.monotonic() - down_since)))
    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=240)
    assert status["phase"] == "Succeeded", _why(status)
    assert [(w["phase"], w["updated"]) for w in status["waves"]] == [("Completed", 1), ("Completed", 3)]
    assert conditions(status)["Complete"]["status"] == "True"
    assert set(_calls(fleet, list(workers.values())).values()) == {1}
    assert set(_serving(provider, fleet, list(workers.values()), BIG).values()) == {"b2"}

    # Events are posted in the background: right after the restart kopf's first posts can fail
    # on a dead connection and go out on its retry, a moment after the status.
    def completed() -> list[str] | None:
        reasons = _reasons(provider)
        return reasons if "RolloutCompleted" in reasons else None

    reasons = wait_for(completed, 60, "the RolloutCompleted event")
    assert "WorkerFailed" not in reasons
    assert "failed with an exception" not in provider.operator_log()


def test_version_bumped_mid_rollout(provider: Provider) -> None:
    """spec.version moves to b3 while the canary loads b2: the b2 rollout is superseded, the
    canary catches up to b3 first (after its b2 load ends), then b3's waves run."""
    fleet = provider.fleet(3, initial_version="b1", big=True)
    workers = {w.name: w for w in fleet.workers(3)}
    with provider.source_stalled():
        provider.rollouts.create(
            NAME, provider.spec("b2", fleet, strategy={"waves": [1, "100%"], "peerRelay": False})
        )
        (canary,) = _loading(provider, fleet, workers, 0)
        provider.rollouts.patch_spec(NAME, {"version": "b3"})
        wait_for(lambda: provider.rollouts.status(NAME).get("targetVersion") == "b3", 30, "the b3 rollout")

    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=180, version="b3")
    assert status["phase"] == "Succeeded", _why(status)
    assert (status["targetVersion"], status["stableVersion"], status["supersededVersion"]) == (
        "b3",
        "b3",
        "b2",
    )
    # The pod the superseded rollout had called catches up first, then the waves run.
    assert status["waves"][0]["kind"] == "CatchUp"
    assert status["waves"][0]["pods"] == [canary]
    assert [w["kind"] for w in status["waves"][1:]] == ["Spec", "Spec"]
    now = list(workers.values())
    assert set(_serving(provider, fleet, now, BIG).values()) == {"b3"}
    # b2 then b3 on the canary (b3 waited for the b2 load to end), b3 alone everywhere else.
    assert _calls(fleet, now) == {w.name: (2 if w.name == canary else 1) for w in now}
    reasons = _reasons(provider)
    assert reasons.count("RolloutStarted") == 2
    assert "Superseded" in reasons
    assert "RolloutCompleted" in reasons


def test_scale_up_during_a_rollout(provider: Provider) -> None:
    """Two pods join while the last wave loads: the wave keeps its members, the newcomers (booted
    on b1) get a drift wave, and all five end on b2."""
    fleet = provider.fleet(3, initial_version="b1", big=True)
    first = {w.name: w for w in fleet.workers(3)}
    provider.rollouts.create(NAME, provider.spec("b2", fleet, strategy={"waves": [1, "100%"], **HELD}))
    provider.rollouts.wait_phase(NAME, {"Paused"})
    with provider.source_stalled():
        provider.cli("promote", NAME)
        _loading(provider, fleet, first, 1)
        fleet.scale(5)
        workers = fleet.workers(5)  # their agents answer; their boot loads wait for the source too

    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=240)
    assert status["phase"] == "Succeeded", _why(status)
    joined = sorted(w.name for w in workers if w.name not in first)
    assert len(joined) == 2
    assert [w["kind"] for w in status["waves"]] == ["Spec", "Spec", "Drift"]
    assert status["waves"][1]["updated"] == 2
    assert sorted(status["waves"][2]["pods"]) == joined
    assert (status["updatedReplicas"], status["replicas"]) == (5, 5)
    assert set(_serving(provider, fleet, workers, BIG).values()) == {"b2"}
    assert set(_calls(fleet, workers).values()) == {1}
    reasons = _reasons(provider)
    assert reasons.count("WaveStarted") == 3
    assert "RolloutCompleted" in reasons
    assert "WorkerFailed" not in reasons


def test_pause_resume_and_promote(provider: Provider) -> None:
    """Staged paused, resumed with `ckpt-rollout resume`, held after the canary by
    pauseAfterWave, let go with `ckpt-rollout promote`."""
    fleet = provider.fleet(4)
    workers = fleet.workers(4)
    provider.rollouts.create(
        NAME,
        provider.spec(
            "v2", fleet, paused=True, strategy={"waves": [1, "50%", "100%"], "pauseAfterWave": [0]}
        ),
    )
    status = provider.rollouts.wait_phase(NAME, {"Paused"})
    assert not status.get("waves"), "nobody is called while spec.paused"
    assert conditions(status)["Paused"]["status"] == "True"
    assert set(_calls(fleet, workers).values()) == {0}

    provider.cli("resume", NAME)

    def held_after_canary() -> dict[str, Any] | None:
        s = provider.rollouts.status(NAME)
        return s if s.get("phase") == "Paused" and s.get("waveProgress") == "1/3" else None

    status = wait_for(held_after_canary, 120, "paused after the canary wave", interval=0.2)
    (canary,) = status["waves"][0]["pods"]
    assert conditions(status)["Paused"]["status"] == "True"
    assert "for promote" in status["message"]
    assert "Paused" in provider.cli("status", NAME)
    serving = _serving(provider, fleet, workers, SMALL)
    assert serving == {w.name: ("v2" if w.name == canary else "v1") for w in workers}

    provider.cli("promote", NAME)
    status = provider.rollouts.wait_phase(NAME, ENDED)
    assert status["phase"] == "Succeeded", _why(status)
    assert [len(w["pods"]) for w in status["waves"]] == [1, 1, 2]
    assert conditions(status)["Paused"]["status"] == "False"
    assert status["pausedSeconds"] > 0
    assert set(_serving(provider, fleet, workers, SMALL).values()) == {"v2"}
    assert set(_calls(fleet, workers).values()) == {1}
    reasons = _reasons(provider)
    assert reasons.count("Paused") == 2
    assert reasons.count("Resumed") == 2
    assert "RolloutCompleted" in reasons


def test_abort(provider: Provider) -> None:
    """`ckpt-rollout abort` after the canary: the canary goes back to v1; the next version
    then rolls out normally, and so does the aborted version set again."""
    fleet = provider.fleet(3)
    workers = fleet.workers(3)
    provider.rollouts.create(
        NAME, provider.spec("v2", fleet, strategy={"waves": [1, "100%"], "pauseAfterWave": [0]})
    )
    status = provider.rollouts.wait_phase(NAME, {"Paused"})
    (canary,) = status["waves"][0]["pods"]
    assert _serving(provider, fleet, workers, SMALL)[canary] == "v2"

    provider.cli("abort", NAME)
    status = provider.rollouts.wait_phase(NAME, {"RolledBack", "Failed"})
    assert status["phase"] == "RolledBack", _why(status)
    assert (status["rollback"]["version"], status["rollback"]["pods"]) == ("v1", [canary])
    assert status["rollback"]["phase"] == "Completed"
    failed = conditions(status)["Failed"]
    assert (failed["status"], failed["reason"]) == ("True", "Aborted")
    assert set(_serving(provider, fleet, workers, SMALL).values()) == {"v1"}
    assert _calls(fleet, workers) == {w.name: (2 if w.name == canary else 0) for w in workers}
    reasons = _reasons(provider)
    assert {"RollbackStarted", "RolledBack"} <= set(reasons)

    provider.rollouts.patch_spec(NAME, {"version": "v3", "strategy": {"pauseAfterWave": []}})
    status = provider.rollouts.wait_phase(NAME, ENDED, version="v3")
    assert status["phase"] == "Succeeded", _why(status)
    assert status["previousVersion"] == "v1"
    assert set(_serving(provider, fleet, workers, SMALL).values()) == {"v3"}
    assert _calls(fleet, workers) == {w.name: (3 if w.name == canary else 1) for w in workers}

    # The abort named v2's first rollout: v2 set again rolls out afresh (the annotation stays).
    provider.rollouts.patch_spec(NAME, {"version": "v2"})
    status = provider.rollouts.wait_phase(NAME, ENDED, version="v2")
    assert status["phase"] == "Succeeded", _why(status)
    assert set(_serving(provider, fleet, workers, SMALL).values()) == {"v2"}


@pytest.mark.parametrize(
    ("worker_s", "deadline_s", "reason"),
    [(2, 60, "WorkerTimeout"), (4, 4, "ProgressDeadlineExceeded")],
    ids=["worker-timeout-first", "deadline-first"],
)
def test_a_hung_load_fails_on_the_first_timer_with_its_exact_reason(
    provider: Provider, worker_s: int, deadline_s: int, reason: str
) -> None:
    """Loads that never end: the worker timeout fails the worker when it comes first; with equal
    limits the deadline wins (it is checked before the wave, and runs from the rollout's start,
    before any call)."""
    fleet = provider.fleet(2, initial_version="b1", big=True)
    with provider.source_stalled():
        spec = provider.spec(
            "b2",
            fleet,
            strategy={"waves": ["100%"]},
            timeouts={"workerSeconds": worker_s, "progressDeadlineSeconds": deadline_s},
            failurePolicy={"onFailure": "Halt"},
        )
        provider.rollouts.create(NAME, spec)
        status = provider.rollouts.wait_phase(NAME, ENDED, timeout=60)
    assert status["phase"] == "Failed", _why(status)
    assert conditions(status)["Failed"]["reason"] == reason, _why(status)
    workers = status.get("workers") or {}
    if reason == "WorkerTimeout":
        assert {e["reason"] for e in workers.values()} == {"WorkerTimeout"}, _why(status)
    else:
        assert "WorkerTimeout" not in {e.get("reason") for e in workers.values()}, _why(status)
