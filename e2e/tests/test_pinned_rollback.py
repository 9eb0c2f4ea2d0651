"""Rollbacks pinned to the digest of the version they return to (#16), on the local control plane
with real agents: the operator records the manifest digest its agents report for a version it
rolled out (status.manifestDigests, kept across an operator restart), and a later rollback to
that version carries it as manifestDigest — which also makes the agent verify the bytes (a pin
implies verification), though the CR never asked for verifyChecksum."""

from __future__ import annotations

import pytest

from ckpt_api.manifest import MANIFEST_NAME, manifest_digest
from ckpt_e2e.providers import Provider
from ckpt_e2e.rollout_env import conditions, http_json

pytestmark = [pytest.mark.integration, pytest.mark.scenario]

NAME = "fleet"
ENDED = {"Succeeded", "Failed", "RolledBack"}


def test_rollback_pinned_to_stable_digest(provider: Provider) -> None:
    """(A short name: the test's namespace and pod names are made from it.)"""
    fleet = provider.fleet(2)
    workers = {w.name: w for w in fleet.workers(2)}
    v2_digest = manifest_digest((provider.version_dir("v2") / MANIFEST_NAME).read_bytes())
    # Unpinned and unverified, as most rollouts are: what the operator knows of v2's digest it
    # learns from the agents. (Peer relay off: bytes from a peer are always verified.)
    strategy = {"waves": [1, "100%"], "peerRelay": False}
    provider.rollouts.create(NAME, provider.spec("v2", fleet, strategy=strategy))
    status = provider.rollouts.wait_phase(NAME, ENDED)
    assert status["phase"] == "Succeeded", status.get("message")
    assert status["stableVersion"] == "v2"
    assert status["manifestDigests"] == {"v2": v2_digest}
    for worker in workers.values():
        agent = http_json(worker.url("/v1/status"), token=fleet.token)
        assert (agent["version"], agent["checksum_verified"]) == ("v2", False)

    # The digest lives in the CR status, not in the operator's memory.
    provider.kill_operator()
    provider.start_operator()
    provider.rollouts.patch_spec(NAME, {"version": "v3", "strategy": {"pauseAfterWave": [0]}})
    status = provider.rollouts.wait_phase(NAME, {"Paused"}, version="v3")
    assert status["manifestDigests"]["v2"] == v2_digest
    (canary,) = status["waves"][0]["pods"]

    # The canary is judged bad: aborted, it is rolled back to v2, pinned.
    provider.cli("abort", NAME)
    status = provider.rollouts.wait_phase(NAME, {"RolledBack", "Failed"}, version="v3")
    assert status["phase"] == "RolledBack", status.get("message")
    assert (status["rollback"]["version"], status["rollback"]["pods"]) == ("v2", [canary])
    assert status["stableVersion"] == "v2"
    assert status["manifestDigests"]["v2"] == v2_digest
    assert conditions(status)["Failed"]["reason"] == "Aborted"
    started = [e["message"] for e in provider.rollouts.events(NAME) if e["reason"] == "RollbackStarted"]
    assert started
    assert all("unpinned" not in m for m in started), started

    rolled_back = http_json(workers[canary].url("/v1/status"), token=fleet.token)
    assert (rolled_back["version"], rolled_back["manifest_digest"]) == ("v2", v2_digest)
    # verifyChecksum is false in the CR: only the pin made the agent check v2's bytes.
    assert rolled_back["checksum_verified"] is True
    assert rolled_back["last_load"]["checksum_verified"] is True
    (other,) = set(workers) - {canary}
    untouched = http_json(workers[other].url("/v1/status"), token=fleet.token)
    assert (untouched["version"], untouched["checksum_verified"]) == ("v2", False)
