"""Replicas that span pods (spec.replicaGroups) on the local control plane: 3 replicas of 2 pods,
labelled as a LeaderWorkerSet labels them (group-key, worker-index, the size annotation), each
leader's agent driving a two-node SGLang stand-in (ckpt_e2e.standins.multinode, a process per
replica) whose node-1 ranks read the follower's staging directory, and each follower running
engine `member`. Real operator, real agents, real apiserver.

- The canary is one replica: its follower stages first, its leader's engine is updated once, and
  the other replicas stay untouched while the rollout is paused; promote brings the rest.
- A follower that cannot stage (its agent stopped, so its load times out) fails its replica
  without the leader ever being called; over the budget, the replicas that switched go back
  through their leaders, the followers taking the copy they kept.
- A replica whose check fails after its switch is restored by its leader on every node.
- A follower deleted while it stages takes its replica out of the rollout (leader never called);
  the whole replicas switch.
- An operator killed mid-gang updates each engine once; abort brings every replica back.
- A replica missing a pod is left alone, and brought to the version once whole.
- A real LeaderWorkerSet (its controller built from its module) rolls out replica by replica.
Throughout, every stand-in is asked whether each of its nodes holds one and the same version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.spec import LWS_GROUP_KEY_LABEL, LWS_SIZE_ANNOTATION, LWS_WORKER_INDEX_LABEL
from ckpt_api.vocabulary import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    WEIGHTS_READY_CONDITION,
    Phase,
    WeightsReadyReason,
    WorkerPhase,
    WorkerReason,
)
from ckpt_e2e.fixtures import PodRuntimeFactory
from ckpt_e2e.kubectl import Kubectl
from ckpt_e2e.launchers import Launcher, ProcessLauncher
from ckpt_e2e.lws import leaderworkerset_controller
from ckpt_e2e.podruntime import PodInfo, PodRuntime
from ckpt_e2e.procs import spawn_server, stop, wait_for
from ckpt_e2e.rollout_env import (
    AGENT_PROCESS,
    WORKER_LABEL,
    AgentOptions,
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    Worker,
    agent_state,
    ready_workers,
    rollout_spec,
    worker_pod_spec,
)
from ckpt_e2e.rollout_fixtures import OperatorIdentity
from ckpt_e2e.serviceaccounts import WORKER_ACCOUNT, ChartAccounts

pytestmark = pytest.mark.integration

NAME = "groups"
FLEET = "replicas"
REPLICAS = 3
LEADERS = [f"r{g}-0" for g in range(REPLICAS)]
FOLLOWER = {leader: f"r{g}-1" for g, leader in enumerate(LEADERS)}
LABELS = {"app": WORKER_LABEL, "fleet": FLEET}
ENDED = {"Succeeded", "Failed", "RolledBack"}


def pod(name: str, group: int, index: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {**LABELS, LWS_GROUP_KEY_LABEL: f"key{group}", LWS_WORKER_INDEX_LABEL: str(index)},
            "annotations": {LWS_SIZE_ANNOTATION: "2"},
        },
        "spec": worker_pod_spec(WORKER_ACCOUNT),
    }


CANARY_FIRST = {"waves": [1, "100%"]}


def grouped_spec(
    source: CheckpointSource, strategy: dict[str, Any], labels: dict[str, str] = LABELS
) -> dict[str, Any]:
    """A rollout of v2 over replicas as LeaderWorkerSet labels them."""
    return rollout_spec(source.url, "v2", labels, replicaGroups={}, strategy=strategy)


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@dataclass
class ReplicaFleet:
    runtime: PodRuntime
    token: str
    nodes: Path
    standins: dict[str, str]  # leader -> the stand-in's URL
    procs: list[subprocess.Popen[bytes]]  # the stand-ins' processes
    mixed: list[str] = field(default_factory=list)  # what the watcher saw mixed

    def engine(self, leader: str) -> dict[str, Any]:
        return dict(get_json(f"{self.standins[leader]}/standin/nodes"))

    def serving(self, leader: str) -> str | None:
        """The version every node of ``leader``'s replica holds (None: mixed)."""
        view = self.engine(leader)
        if not view["one_version"]:
            return None
        (source,) = view["sources"][0]
        return Path(source).name

    def staged(self, pod: str) -> list[str]:
        root = self.nodes / pod
        return sorted(p.name for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []

    def agent_pid(self, pod: str) -> int:
        return self.runtime.running()[pod].pid

    def fault(self, leader: str, generation: str | None) -> None:
        """What ``leader``'s replica generates from now on (ckpt_e2e.standins.multinode)."""
        body = json.dumps({"generation": generation}).encode()
        req = urllib.request.Request(f"{self.standins[leader]}/standin/fault", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=5) as resp:
            assert resp.status == 200


def _watch(fleet: ReplicaFleet, stopped: threading.Event) -> None:
    while not stopped.wait(0.1):
        for leader in LEADERS:
            try:
                view = fleet.engine(leader)
            except (urllib.error.URLError, TimeoutError, ConnectionError):
                continue  # a stand-in a test has frozen: asked again next round
            if not view["one_version"]:
                fleet.mixed.append(f"{leader}: {view['sources']}")


def start_standins(
    followers: dict[str, str],
    nodes: Path,
    checkpoint_source: CheckpointSource,
    logs: Path,
    procs: list[subprocess.Popen[bytes]],
) -> dict[str, str]:
    """A two-node SGLang stand-in per replica (``followers``: leader -> its follower), booted on
    v1, its node 1 reading the follower's staging directory; their URLs by leader."""
    standins = {}
    for leader, follower in followers.items():
        argv = [sys.executable, "-m", "ckpt_e2e.standins.multinode", "--port", "0"]
        argv += ["--boot-dir", str(checkpoint_source.version_dir("v1"))]
        argv += ["--leader-root", str(nodes / leader), "--follower-root", str(nodes / follower)]
        proc, url = spawn_server(argv, logs / f"standin-{leader}.log", "multi-node SGLang stand-in")
        procs.append(proc)
        standins[leader] = url
    return standins


def replica_agents(
    standins: dict[str, str], nodes: Path, checkpoint_source: CheckpointSource, chart_accounts: ChartAccounts
) -> AgentOptions:
    """Agents for the replicas' pods: a leader's drives its replica's stand-in, a follower's
    stages (engine member); each its own staging directory, booting on v1."""

    def pod_args(info: PodInfo) -> list[str]:
        staging = ["--staging-dir", str(nodes / info.name)]
        if info.labels.get(LWS_WORKER_INDEX_LABEL) == "0":
            return ["--engine", "sglang", "--engine-url", standins[info.name], *staging]
        return ["--engine", "member", *staging]

    return AgentOptions(
        source_url=checkpoint_source.url,
        initial_version="v1",
        kubeconfig=chart_accounts.worker_kubeconfig_for,
        relay_token=chart_accounts.worker_relay_token_for,
        pod_args=pod_args,
    )


@pytest.fixture
def replica_fleet(
    kubectl: Kubectl,
    pod_runtime: PodRuntimeFactory,
    checkpoint_source: CheckpointSource,
    operator_identity: OperatorIdentity,
    chart_accounts: ChartAccounts,
    tmp_path: Path,
) -> Iterator[ReplicaFleet]:
    nodes = tmp_path / "nodes"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        standins = start_standins(FOLLOWER, nodes, checkpoint_source, tmp_path, procs)
        options = replica_agents(standins, nodes, checkpoint_source, chart_accounts)
        runtime = pod_runtime(f"app={WORKER_LABEL},fleet={FLEET}", options.launch)
        token = operator_identity.token_file.read_text()
        fleet = ReplicaFleet(runtime, token, nodes, standins, procs)
        # Followers first: a leader's agent boots by asking its engine for v1, which every node
        # then reads from its own staging directory.
        kubectl.apply([pod(FOLLOWER[leader], g, 1) for g, leader in enumerate(LEADERS)])
        followers = ready_workers(runtime, REPLICAS, token)
        wait_for(
            lambda: all(
                agent_state(w, token) == "idle" and fleet.staged(w.name) == ["v1"] for w in followers
            ),
            90,
            "the followers to stage v1",
        )
        kubectl.apply([pod(leader, g, 0) for g, leader in enumerate(LEADERS)])
        workers = ready_workers(runtime, 2 * REPLICAS, token)
        wait_for(lambda: all(agent_state(w, token) == "idle" for w in workers), 90, "every agent idle on v1")
        assert {fleet.serving(leader) for leader in LEADERS} == {"v1"}
        stopped = threading.Event()
        watcher = threading.Thread(target=_watch, args=(fleet, stopped), daemon=True)
        watcher.start()
        yield fleet
        stopped.set()
        watcher.join(5)
    finally:
        for proc in procs:
            stop(proc)


def _annotate(rollouts: Rollouts, key: str, value: str) -> None:
    body = {"metadata": {"annotations": {key: value}}}
    rollouts.api.patch_namespaced_custom_object(GROUP, VERSION, rollouts.namespace, PLURAL, NAME, body)


def _promote(rollouts: Rollouts, value: str) -> None:
    _annotate(rollouts, PROMOTE_ANNOTATION, value)


def _why(status: dict[str, Any]) -> str:
    return f"{status.get('message')}; workers={status.get('workers')}; waves={status.get('waves')}"


def _updates(fleet: ReplicaFleet) -> dict[str, list[str]]:
    """The versions each replica's engine was asked to load (its boot load of v1 excluded)."""
    return {leader: fleet.engine(leader)["updates"][1:] for leader in LEADERS}


def test_replicas_switch_one_by_one_and_a_member_that_cannot_stage_leaves_its_replica_alone(
    replica_fleet: ReplicaFleet,
    rollouts: Rollouts,
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
) -> None:
    fleet = replica_fleet
    strategy = {"waves": [1, "100%"], "pauseAfterWave": [0]}
    rollouts.create(NAME, grouped_spec(checkpoint_source, strategy))

    paused = rollouts.wait_phase(NAME, {"Paused"}, timeout=120, version="v2")
    (canary,) = paused["waves"][0]["pods"]
    assert canary in LEADERS, paused["waves"]
    assert (paused["replicas"], paused["updatedReplicas"]) == (3, 1), _why(paused)
    serving = {leader: fleet.serving(leader) for leader in LEADERS}
    assert serving == {leader: "v2" if leader == canary else "v1" for leader in LEADERS}
    assert _updates(fleet) == {leader: ["v2"] if leader == canary else [] for leader in LEADERS}
    assert fleet.staged(FOLLOWER[canary]) == ["v1", "v2"], "the follower keeps what its replica served"

    _promote(rollouts, "0@v2")
    done = rollouts.wait_phase(NAME, ENDED, timeout=120, version="v2")
    assert done["phase"] == "Succeeded", _why(done)
    assert (done["replicas"], done["updatedReplicas"], done["failedReplicas"]) == (3, 3, 0)
    assert done["message"] == "v2 is live on 3 replicas"
    assert {leader: fleet.serving(leader) for leader in LEADERS} == dict.fromkeys(LEADERS, "v2")
    assert _updates(fleet) == {leader: ["v2"] for leader in LEADERS}, "one engine update per replica"

    # v3, with a follower outside the canary replica stopped: its replica cannot stage.
    strategy = {"waves": [1, "100%"], "pauseAfterWave": [0]}
    timeouts = {"workerSeconds": 15, "progressDeadlineSeconds": 300}
    rollouts.patch_spec(NAME, {"version": "v3", "strategy": strategy, "timeouts": timeouts})
    paused = rollouts.wait_phase(NAME, {"Paused"}, timeout=120, version="v3")
    (canary,) = paused["waves"][0]["pods"]
    stuck = next(leader for leader in LEADERS if leader != canary)
    healthy = next(leader for leader in LEADERS if leader not in (canary, stuck))
    pid = fleet.agent_pid(FOLLOWER[stuck])
    os.kill(pid, signal.SIGSTOP)
    try:
        _promote(rollouts, "0@v3")
        ended = rollouts.wait_phase(NAME, ENDED, timeout=180, version="v3")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert ended["phase"] == "RolledBack", _why(ended)
    # The stuck replica's leader was never called: its engine saw no v3 at all.
    updates = _updates(fleet)
    assert updates[stuck] == ["v2"], updates
    assert updates[canary] == ["v2", "v3", "v2"], updates
    assert updates[healthy][-1] == "v2", updates
    assert {leader: fleet.serving(leader) for leader in LEADERS} == dict.fromkeys(LEADERS, "v2")
    assert ended["rollback"]["pods"] == sorted({canary, healthy} & set(ended["rollback"]["pods"]))
    assert canary in ended["rollback"]["pods"], ended["rollback"]
    assert not fleet.mixed, fleet.mixed


def test_an_operator_killed_mid_gang_updates_each_engine_once_and_abort_brings_every_replica_back(
    replica_fleet: ReplicaFleet,
    rollouts: Rollouts,
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
) -> None:
    fleet = replica_fleet
    rollouts.create(NAME, grouped_spec(checkpoint_source, CANARY_FIRST))

    def gang_started() -> bool:
        waves = rollouts.status(NAME).get("waves") or []
        return bool(waves and waves[0].get("called"))

    wait_for(gang_started, 60, "the canary replica's follower to be called")
    operator.kill()  # SIGKILL mid-gang: whatever it had in memory is gone
    operator.start()
    done = rollouts.wait_phase(NAME, ENDED, timeout=120, version="v2")
    assert done["phase"] == "Succeeded", _why(done)
    assert _updates(fleet) == {leader: ["v2"] for leader in LEADERS}, "exactly one engine update per replica"
    assert {leader: fleet.serving(leader) for leader in LEADERS} == dict.fromkeys(LEADERS, "v2")

    strategy = {"waves": [1, "100%"], "pauseAfterWave": [0]}
    rollouts.patch_spec(NAME, {"version": "v3", "strategy": strategy})
    paused = rollouts.wait_phase(NAME, {"Paused"}, timeout=120, version="v3")
    (canary,) = paused["waves"][0]["pods"]
    assert fleet.serving(canary) == "v3"
    _annotate(rollouts, ABORT_ANNOTATION, f"{paused['startedAt']}@v3")
    ended = rollouts.wait_phase(NAME, ENDED, timeout=120, version="v3")
    assert ended["phase"] == "RolledBack", _why(ended)
    assert ended["rollback"]["pods"] == [canary], ended["rollback"]
    assert {leader: fleet.serving(leader) for leader in LEADERS} == dict.fromkeys(LEADERS, "v2")
    updates = _updates(fleet)
    assert updates == {leader: ["v2", "v3", "v2"] if leader == canary else ["v2"] for leader in LEADERS}
    # The follower took back the copy it kept: v2 was never pulled again.
    assert fleet.staged(FOLLOWER[canary]) == ["v2", "v3"]
    assert not fleet.mixed, fleet.mixed


def _weights_ready(kubectl: Kubectl) -> dict[str, tuple[str, str]]:
    """Each pod's WeightsReady condition (its readiness gate): (status, reason)."""
    pods = json.loads(kubectl.run("get", "pods", "-o", "json").stdout)["items"]
    return {
        p["metadata"]["name"]: (c["status"], c["reason"])
        for p in pods
        for c in p["status"].get("conditions", [])
        if c["type"] == WEIGHTS_READY_CONDITION
    }


def test_a_replicas_pods_are_not_ready_while_it_switches_and_ready_once_it_has(
    replica_fleet: ReplicaFleet,
    rollouts: Rollouts,
    checkpoint_source: CheckpointSource,
    kubectl: Kubectl,
    operator: OperatorProcess,
) -> None:
    """Readiness follows the replica, not the pod: a follower that has staged stays NotReady
    (Staged) while its leader switches the engine, and is Ready once the operator confirms it."""
    fleet = replica_fleet
    for proc in fleet.procs:  # every engine hangs: the canary's leader cannot finish its switch
        os.kill(proc.pid, signal.SIGSTOP)
    try:
        rollouts.create(NAME, grouped_spec(checkpoint_source, CANARY_FIRST))

        def switching() -> tuple[str, str] | None:
            status = rollouts.status(NAME)
            waves = status.get("waves") or []
            called = waves[0].get("called") or [] if waves else []
            if len(called) != 2:
                return None
            follower, leader = called
            entry = (status.get("workers") or {}).get(follower) or {}
            return (leader, follower) if entry.get("reason") == WorkerReason.STAGED else None

        leader, follower = wait_for(switching, 60, "the canary's follower staged and its leader called")

        def staged_condition() -> dict[str, tuple[str, str]] | None:
            ready = _weights_ready(kubectl)
            return ready if ready.get(follower, ("", ""))[1] == WeightsReadyReason.STAGED else None

        ready = wait_for(staged_condition, 30, f"{follower}'s WeightsReady condition to say Staged")
        assert ready[follower] == ("False", WeightsReadyReason.STAGED), ready
        assert ready[leader] == ("False", WeightsReadyReason.LOADING), ready
    finally:
        for proc in fleet.procs:
            os.kill(proc.pid, signal.SIGCONT)
    done = rollouts.wait_phase(NAME, ENDED, timeout=120, version="v2")
    assert done["phase"] == Phase.SUCCEEDED, _why(done)
    wait_for(
        lambda: set(_weights_ready(kubectl).values()) == {("True", WeightsReadyReason.LOADED)},
        30,
        "every pod WeightsReady once every replica switched",
    )
    assert {leader: fleet.serving(leader) for leader in LEADERS} == dict.fromkeys(LEADERS, "v2")
    assert not fleet.mixed, fleet.mixed


def test_a_replica_whose_check_fails_after_the_switch_goes_back_on_every_node(
    replica_fleet: ReplicaFleet,
    rollouts: Rollouts,
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
) -> None:
    """An engine failure after the switch (the leader's check finds the replica generating
    nothing): the leader's agent restores v1 through the engine, and every node reads it again,
    the follower's from the copy it kept while the replica switched."""
    fleet = replica_fleet
    for leader in LEADERS:
        fleet.fault(leader, "empty")
    rollouts.create(NAME, grouped_spec(checkpoint_source, CANARY_FIRST))
    ended = rollouts.wait_phase(NAME, ENDED, timeout=120, version="v2")
    assert ended["phase"] == Phase.ROLLED_BACK, _why(ended)
    (canary,) = ended["waves"][0]["pods"]
    entry = ended["workers"][canary]
    assert (entry["phase"], entry["reason"]) == (WorkerPhase.FAILED, WorkerReason.HEALTH_CHECK_FAILED), entry
    assert entry["message"].endswith("; v1 loaded back"), entry
    assert {leader: fleet.serving(leader) for leader in LEADERS} == dict.fromkeys(LEADERS, "v1")
    # One switch and one restore, both through the leader; no other replica was switched.
    updates = _updates(fleet)
    assert updates == {leader: ["v2", "v1"] if leader == canary else [] for leader in LEADERS}, updates
    # v2 stays staged beside v1 on the follower (what a retry would take without pulling).
    assert fleet.staged(FOLLOWER[canary]) == ["v1", "v2"]
    assert not fleet.mixed, fleet.mixed


def test_a_member_deleted_mid_gang_takes_its_replica_out_and_the_rest_switch(
    replica_fleet: ReplicaFleet,
    rollouts: Rollouts,
    checkpoint_source: CheckpointSource,
    kubectl: Kubectl,
    operator: OperatorProcess,
) -> None:
    """The canary replica's follower is deleted while it stages (the source frozen, so its pull
    cannot finish first): that replica is no longer whole, its leader is never called, and the
    rollout goes on with the whole replicas."""
    fleet = replica_fleet
    assert checkpoint_source.proc is not None
    source_pid = checkpoint_source.proc.pid
    os.kill(source_pid, signal.SIGSTOP)  # connections are accepted, nothing is answered
    try:
        rollouts.create(NAME, grouped_spec(checkpoint_source, CANARY_FIRST))

        def staging() -> list[str] | None:
            waves = rollouts.status(NAME).get("waves") or []
            return list(waves[0].get("called") or []) if waves else None

        (follower,) = wait_for(staging, 60, "the canary replica's follower to be called")
        broken = next(leader for leader, f in FOLLOWER.items() if f == follower)
        staging_pod = fleet.runtime.running()[follower].pod
        agent = Worker(follower, staging_pod.ip)
        wait_for(lambda: agent_state(agent, fleet.token) == "loading", 30, f"{follower} to be staging")
        kubectl.run("delete", "pod", follower, "--wait=true")
    finally:
        os.kill(source_pid, signal.SIGCONT)
    done = rollouts.wait_phase(NAME, ENDED, timeout=120, version="v2")
    assert done["phase"] == Phase.SUCCEEDED, _why(done)
    assert (done["replicas"], done["updatedReplicas"]) == (2, 2), _why(done)
    assert fleet.serving(broken) == "v1", "the replica that lost a member mid-gang was left as it was"
    assert _updates(fleet)[broken] == []
    assert {fleet.serving(leader) for leader in LEADERS if leader != broken} == {"v2"}
    assert not fleet.mixed, fleet.mixed


def test_a_replica_missing_a_pod_waits_whole_and_is_brought_to_the_version_when_it_is(
    replica_fleet: ReplicaFleet,
    rollouts: Rollouts,
    checkpoint_source: CheckpointSource,
    kubectl: Kubectl,
    operator: OperatorProcess,
) -> None:
    fleet = replica_fleet
    strategy = {"waves": [1, "100%"], "pauseAfterWave": [0]}
    rollouts.create(NAME, grouped_spec(checkpoint_source, strategy))
    paused = rollouts.wait_phase(NAME, {"Paused"}, timeout=120, version="v2")
    (canary,) = paused["waves"][0]["pods"]
    broken = next(leader for leader in LEADERS if leader != canary)
    group = LEADERS.index(broken)
    kubectl.run("delete", "pod", FOLLOWER[broken], "--wait=true")

    _promote(rollouts, "0@v2")
    done = rollouts.wait_phase(NAME, ENDED, timeout=120, version="v2")
    assert done["phase"] == "Succeeded", _why(done)
    assert (done["replicas"], done["updatedReplicas"]) == (2, 2), _why(done)
    assert done["message"] == "v2 is live on 2 replicas"
    assert fleet.serving(broken) == "v1", "a replica that is not whole is left alone"
    assert _updates(fleet)[broken] == []

    # Its pod comes back (LeaderWorkerSet would recreate it): the replica is whole again and
    # gets the stable version, its follower staging first.
    kubectl.apply([pod(FOLLOWER[broken], group, 1)])

    def caught_up() -> dict[str, Any] | None:
        status = rollouts.status(NAME)
        return status if status.get("updatedReplicas") == 3 and status.get("phase") == "Succeeded" else None

    status = wait_for(caught_up, 120, "the whole replica to be brought to v2")
    assert status["replicas"] == 3
    assert fleet.serving(broken) == "v2"
    assert _updates(fleet) == {leader: ["v2"] for leader in LEADERS}
    assert not fleet.mixed, fleet.mixed


def test_a_leaderworkerset_rolls_out_replica_by_replica(
    kubectl: Kubectl,
    namespace: str,
    pod_runtime: PodRuntimeFactory,
    checkpoint_source: CheckpointSource,
    operator_identity: OperatorIdentity,
    chart_accounts: ChartAccounts,
    rollouts: Rollouts,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    """The same rollout over pods the real LeaderWorkerSet controller made and labelled."""
    name = "deepseek"
    followers = {f"{name}-{g}": f"{name}-{g}-1" for g in range(REPLICAS)}
    nodes = tmp_path / "nodes"
    procs: list[subprocess.Popen[bytes]] = []
    try:
        standins = start_standins(followers, nodes, checkpoint_source, tmp_path, procs)
        options = replica_agents(standins, nodes, checkpoint_source, chart_accounts)
        # LeaderWorkerSet creates a group's leader before its workers: a leader's agent, whose
        # start-up load of v1 goes to every node of its engine, starts once its follower staged v1.
        agent = options.launcher

        def launcher(info: PodInfo) -> Launcher:
            if info.labels.get(LWS_WORKER_INDEX_LABEL) != "0":
                return agent(info)
            staged = nodes / followers[info.name] / "v1"
            wait = 'until [ -d "$0" ]; do sleep 0.2; done; exec "$@"'
            return ProcessLauncher(["sh", "-c", wait, str(staged), *AGENT_PROCESS.entrypoint])

        options.launcher = launcher
        with leaderworkerset_controller(kubectl, namespace, tmp_path / "lws"):
            runtime = pod_runtime(f"app={WORKER_LABEL},fleet={name}", options.launch)
            kubectl.apply(leaderworkerset(name))
            token = operator_identity.token_file.read_text()
            workers = ready_workers(runtime, 2 * REPLICAS, token, timeout=180)
            wait_for(lambda: all(agent_state(w, token) == "idle" for w in workers), 120, "every agent on v1")
            pods = {p.pod.name: p.pod for p in runtime.running().values()}
            assert sorted(pods) == sorted([*followers, *followers.values()])
            leaders = [n for n, p in pods.items() if p.labels.get(LWS_WORKER_INDEX_LABEL) == "0"]
            assert sorted(leaders) == sorted(followers), "the controller's webhook marked the leaders"

            strategy = {"waves": [1, "100%"], "pauseAfterWave": [0]}
            labels = {"app": WORKER_LABEL, "fleet": name}
            rollouts.create(NAME, grouped_spec(checkpoint_source, strategy, labels))
            paused = rollouts.wait_phase(NAME, {"Paused"}, timeout=120, version="v2")
            (canary,) = paused["waves"][0]["pods"]
            assert (paused["replicas"], paused["updatedReplicas"]) == (3, 1), _why(paused)
            engines = {leader: dict(get_json(f"{url}/standin/nodes")) for leader, url in standins.items()}
            assert {leader: view["updates"][1:] for leader, view in engines.items()} == {
                leader: ["v2"] if leader == canary else [] for leader in followers
            }
            _promote(rollouts, "0@v2")
            done = rollouts.wait_phase(NAME, ENDED, timeout=120, version="v2")
            assert done["phase"] == "Succeeded", _why(done)
            assert done["message"] == "v2 is live on 3 replicas"
            for leader, url in standins.items():
                view = get_json(f"{url}/standin/nodes")
                assert view["updates"][1:] == ["v2"], (leader, view)
                assert view["one_version"], (leader, view)
    finally:
        for proc in procs:
            stop(proc)


def leaderworkerset(name: str) -> dict[str, Any]:
    template = {
        "metadata": {"labels": {"app": WORKER_LABEL, "fleet": name}},
        "spec": worker_pod_spec(WORKER_ACCOUNT),
    }
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": REPLICAS,
            "leaderWorkerTemplate": {"size": 2, "leaderTemplate": template, "workerTemplate": template},
        },
    }
