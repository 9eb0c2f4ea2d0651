"""The elected operator stops leading before anyone else may: it exits as soon as it sees another
holder on the Lease, and when the apiserver hangs (every call stalls, none fails) its watchdog
exits it before the lease it last renewed could lapse to a standby."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from ckpt_api.vocabulary import LEASE_NAME
from ckpt_e2e.fixtures import ClusterHandle
from ckpt_e2e.procs import wait_for
from ckpt_e2e.rollout_env import OperatorProcess
from ckpt_e2e.rollout_fixtures import OperatorIdentity

pytestmark = pytest.mark.integration

# ckpt_rollout.controller.leader's defaults: the lease lasts 15 s and is renewed every 5 s.
LEASE_S = 15


@pytest.fixture
def leader(
    crd_installed: None, namespace: str, operator_identity: OperatorIdentity, tmp_path: Path
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(
        operator_identity.kubeconfig,
        namespace,
        operator_identity.token_file,
        tmp_path / "op",
        ["--leader-election", "--lease-namespace", namespace],
    ).start()
    try:
        yield op
    finally:
        op.stop()


def _holder(cluster: ClusterHandle, namespace: str) -> str | None:
    out = cluster.kubectl.in_namespace(namespace).run(
        "get", "lease", LEASE_NAME, "-o", "jsonpath={.spec.holderIdentity}", check=False
    )
    return out.stdout.strip() or None


def _wait_leading(op: OperatorProcess, cluster: ClusterHandle, namespace: str) -> None:
    assert op.proc is not None
    identity = f"{socket.gethostname()}-{op.proc.pid}"
    wait_for(lambda: _holder(cluster, namespace) == identity, 60, f"{identity} to hold the Lease")


def test_a_leader_that_sees_another_holder_exits(
    leader: OperatorProcess, cluster: ClusterHandle, namespace: str
) -> None:
    _wait_leading(leader, cluster, namespace)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    cluster.kubectl.in_namespace(namespace).run(
        "patch",
        "lease",
        LEASE_NAME,
        "--type=merge",
        "-p",
        f'{{"spec": {{"holderIdentity": "usurper", "renewTime": "{now}", "leaseDurationSeconds": 60}}}}',
    )
    wait_for(lambda: not leader.alive, 3 * LEASE_S, "the old leader to exit")
    assert leader.proc is not None
    assert leader.proc.returncode == 1
    assert "lost lease" in leader.log_path.read_text()
    assert "held by usurper" in leader.log_path.read_text()
    assert _holder(cluster, namespace) == "usurper", "it left the Lease to its holder"


def test_a_hung_apiserver_makes_the_leader_exit_while_its_lease_still_holds(
    leader: OperatorProcess, cluster: ClusterHandle, namespace: str
) -> None:
    assert cluster.local is not None, "freezing kube-apiserver needs the local control plane"
    _wait_leading(leader, cluster, namespace)
    with cluster.local.apiserver_frozen():
        # Bounded well past the lease: a renewal blocked on a hung call used to keep it leading
        # for ever.
        wait_for(lambda: not leader.alive, 4 * LEASE_S, "the leader to exit while the apiserver hangs", 0.05)
        exited_at = datetime.now(UTC)
    assert leader.proc is not None
    assert leader.proc.returncode == 1
    assert "no renewal for" in leader.log_path.read_text()
    lease = cluster.kubectl.in_namespace(namespace).json("get", "lease", LEASE_NAME)["spec"]
    renewed = datetime.strptime(lease["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    # It had stopped before a standby could have taken the lease it last renewed.
    assert exited_at < renewed + timedelta(seconds=lease["leaseDurationSeconds"]), (exited_at, lease)
