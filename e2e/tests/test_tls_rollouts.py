"""TLS between the operator, agents and peers on the local control plane: every harness agent
serves https with a certificate for its namespace's agent name (ckpt_api.tls.agent_server_name)
and the operator dials pod IPs verifying that name. An operator trusting another CA cannot
update an agent (the worker fails naming TLS verification); with the right CA the rollout
succeeds and later waves read their peers over verified TLS; a peer whose certificate comes from
another CA is skipped for the source; --plain-http works when both sides are told."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ckpt_e2e.pki import AgentPKI
from ckpt_e2e.rollout_env import (
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    http_json,
    rollout_spec,
    session_agent_pki,
)
from ckpt_e2e.rollout_fixtures import Fleet, OperatorIdentity

pytestmark = pytest.mark.integration

TWO_WAVES = {"strategy": {"waves": [1, "100%"]}}


@contextmanager
def _operator(
    identity: OperatorIdentity, namespace: str, workdir: Path, **tls: Any
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(identity.kubeconfig, namespace, identity.token_file, workdir, **tls)
    op.start()
    try:
        yield op
    finally:
        op.stop()


def _last_loads(fleet: Fleet, count: int) -> dict[str, dict[str, Any]]:
    return {
        w.name: http_json(w.url("/v1/status"), token=fleet.token)["last_load"] for w in fleet.workers(count)
    }


@pytest.fixture
def other_ca(tmp_path: Path) -> AgentPKI:
    other = AgentPKI(tmp_path / "other-ca")
    session_agent_pki().trust(other.ca_cert)  # the test's own reads of its agents, nothing else
    return other


def test_an_operator_trusting_another_ca_cannot_update_an_agent(
    crd_installed: None,
    fleet_factory: Callable[..., Fleet],
    operator_identity: OperatorIdentity,
    checkpoint_source: CheckpointSource,
    rollouts: Rollouts,
    namespace: str,
    other_ca: AgentPKI,
    tmp_path: Path,
) -> None:
    fleet = fleet_factory(1)
    with _operator(operator_identity, namespace, tmp_path / "op", agent_ca=other_ca.ca_cert):
        rollouts.create("tls", rollout_spec(checkpoint_source.url, "v2", fleet.labels))
        status = rollouts.wait_phase("tls", {"Failed", "RolledBack"}, version="v2")
    ((pod, entry),) = status["workers"].items()
    assert entry["phase"] == "Failed", entry
    assert entry["reason"] == "AgentUnreachable", entry
    assert "TLS verification of the agent failed" in entry["message"], entry
    assert "certificate verify failed" in entry["message"], entry
    # Never reached: the agent still serves v1 and was asked for nothing.
    (worker,) = fleet.workers(1)
    assert worker.name == pod
    assert http_json(worker.url("/v1/status"), token=fleet.token)["version"] == "v1"


def test_with_the_right_ca_a_rollout_succeeds_and_peers_are_read_over_tls(
    fleet_factory: Callable[..., Fleet],
    operator: OperatorProcess,
    checkpoint_source: CheckpointSource,
    rollouts: Rollouts,
) -> None:
    assert operator.agent_ca == session_agent_pki().ca_cert
    fleet = fleet_factory(2)
    rollouts.create("tls", rollout_spec(checkpoint_source.url, "v2", fleet.labels, **TWO_WAVES))
    rollouts.wait_phase("tls", {"Succeeded"}, version="v2")

    relayed = [load for load in _last_loads(fleet, 2).values() if load["peer"] is not None]
    assert len(relayed) == 1, "the second wave's pod pulls from the canary"
    (load,) = relayed
    assert load["peer"].startswith("https://"), load
    assert load["fallback_reason"] is None, load
    assert load["bytes_from_peer"] > 0, load


def test_a_peer_with_a_certificate_from_another_ca_is_skipped(
    crd_installed: None,
    fleet_factory: Callable[..., Fleet],
    operator_identity: OperatorIdentity,
    checkpoint_source: CheckpointSource,
    rollouts: Rollouts,
    namespace: str,
    other_ca: AgentPKI,
    tmp_path: Path,
) -> None:
    """Two pods whose certificates (and the CA each verifies peers with) come from two CAs: the
    operator trusts both, so the rollout goes on; whichever pod is the canary, the other one's
    peer fails verification and it loads from the source."""
    ours = fleet_factory(1, name="ours")
    theirs = fleet_factory(1, name="theirs", agent_pki=other_ca)
    both = tmp_path / "both-cas.crt"
    both.write_bytes(session_agent_pki().ca_cert.read_bytes() + other_ca.ca_cert.read_bytes())
    labels = {"app": ours.labels["app"]}
    with _operator(operator_identity, namespace, tmp_path / "op", agent_ca=both):
        rollouts.create("tls", rollout_spec(checkpoint_source.url, "v2", labels, **TWO_WAVES))
        rollouts.wait_phase("tls", {"Succeeded"}, version="v2")

    loads = {**_last_loads(ours, 1), **_last_loads(theirs, 1)}
    relayed = [load for load in loads.values() if load["peer"] is not None]
    assert len(relayed) == 1, loads
    (load,) = relayed
    assert load["peer"].startswith("https://"), load
    assert "certificate verify failed" in load["fallback_reason"], load
    assert load["bytes_from_peer"] == 0, load
    assert load["bytes_from_source"] > 0, load


def test_plain_http_when_both_sides_are_told(
    crd_installed: None,
    fleet_factory: Callable[..., Fleet],
    operator_identity: OperatorIdentity,
    checkpoint_source: CheckpointSource,
    rollouts: Rollouts,
    namespace: str,
    tmp_path: Path,
) -> None:
    fleet = fleet_factory(2, plain_http=True)
    with _operator(operator_identity, namespace, tmp_path / "op", agent_tls=False):
        rollouts.create("plain", rollout_spec(checkpoint_source.url, "v2", fleet.labels, **TWO_WAVES))
        rollouts.wait_phase("plain", {"Succeeded"}, version="v2")
    relayed = [load for load in _last_loads(fleet, 2).values() if load["peer"] is not None]
    assert [load["peer"].split("://")[0] for load in relayed] == ["http"]
    assert relayed[0]["fallback_reason"] is None
