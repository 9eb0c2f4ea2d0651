"""The agents' smoke check after a load, on the local control plane with real agents and paddle
tensors: v-nan holds a NaN in one weight and every checksum valid, so verifyChecksum passes it;
the canary's smoke check (on by default, strategy.healthCheck) fails, the canary serves v1 again
before its pod is Ready, the rollout rolls back, and no other worker is ever called."""

from __future__ import annotations

import pytest

from ckpt_api.vocabulary import HealthCheckOutcome, Phase, WorkerPhase, WorkerReason
from ckpt_e2e.providers import Provider
from ckpt_e2e.rollout_env import conditions, http_json, http_text, load_calls, metric_value, serving_versions

pytestmark = pytest.mark.integration

NAME = "fleet"
ENDED = {Phase.SUCCEEDED, Phase.FAILED, Phase.ROLLED_BACK}


def test_a_nan_version_is_stopped_at_the_canary_and_rolled_back(provider: Provider) -> None:
    fleet = provider.fleet(3)
    workers = fleet.workers(3)
    spec = provider.spec("v-nan", fleet, verifyChecksum=True, strategy={"waves": [1, "100%"]})
    provider.rollouts.create(NAME, spec)
    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=120)

    assert status["phase"] == Phase.ROLLED_BACK, status
    (wave,) = status["waves"]
    (canary,) = wave["pods"]
    entry = status["workers"][canary]
    assert (entry["phase"], entry["reason"]) == (WorkerPhase.FAILED, WorkerReason.HEALTH_CHECK_FAILED), entry
    assert "smoke check: output " in entry["message"], entry
    assert " is NaN" in entry["message"], entry
    assert entry["message"].endswith("; v1 loaded back"), entry
    failed = conditions(status)["Failed"]
    assert (failed["status"], failed["reason"]) == ("True", WorkerReason.HEALTH_CHECK_FAILED)
    assert status["rollback"]["version"] == "v1"

    by_name = {w.name: w for w in workers}
    agent = http_json(by_name[canary].url("/v1/status"), token=fleet.token)
    assert (agent["version"], agent["weights_lost"]) == ("v1", False), agent
    assert agent["last_load"]["health_check"]["passed"] is False
    metrics = http_text(by_name[canary].url("/metrics"), token=fleet.token)
    assert metric_value(metrics, "ckpt_agent_health_checks_total", {"result": HealthCheckOutcome.FAILED}) == 1

    # Every worker serves v1; the canary was the only one ever asked to load v-nan.
    versions = {v: provider.version_dir(v) for v in ("v1", "v-nan")}
    assert set(serving_versions(workers, fleet.token, versions).values()) == {"v1"}
    calls = {w.name: load_calls(w, fleet.token) for w in workers}
    assert {name: n for name, n in calls.items() if name != canary} == dict.fromkeys(set(calls) - {canary}, 0)
    assert calls[canary] >= 1
