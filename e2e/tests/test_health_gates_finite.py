"""The load-time finite check (`spec.checks.finite`) on the local control plane, with real agents
and paddle tensors: v-nan (ckpt_e2e.catalog) holds a NaN in layers.1.weight and valid checksums.
The canary's agent refuses it before applying anything (NonFiniteTensor, naming the tensor), the
rollout rolls back with nobody to move, and no other pod is called."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_api.vocabulary import LoadResult, WorkerReason
from ckpt_e2e.providers import Provider
from ckpt_e2e.rollout_env import conditions, http_text, load_calls, metric_value, serving_versions

pytestmark = pytest.mark.integration

NAME = "fleet"
ENDED = {"Succeeded", "Failed", "RolledBack"}


def _why(status: dict[str, Any]) -> str:
    return f"{status.get('message')}; workers={status.get('workers')}; waves={status.get('waves')}"


def test_a_nan_version_is_refused_by_the_canary_and_rolled_back(provider: Provider) -> None:
    fleet = provider.fleet(3)
    workers = fleet.workers(3)
    spec = provider.spec("v-nan", fleet, checks={"finite": True}, strategy={"waves": [1, "100%"]})
    provider.rollouts.create(NAME, spec)
    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=120)

    assert status["phase"] == "RolledBack", _why(status)
    assert len(status["waves"]) == 1, "no wave after the refused canary"
    (canary,) = status["waves"][0]["pods"]
    entry = status["workers"][canary]
    assert (entry["phase"], entry["reason"]) == ("Failed", WorkerReason.NON_FINITE_TENSOR), _why(status)
    assert entry["message"].startswith("tensor 'layers.1.weight' (F32) holds NaN at element "), entry
    failed = conditions(status)["Failed"]
    assert (failed["status"], failed["reason"]) == ("True", WorkerReason.NON_FINITE_TENSOR)
    # Refused before apply: the canary kept v1, so the rollback had nobody to move.
    assert (status["rollback"]["version"], status["rollback"]["pods"]) == ("v1", [])

    by_name = {w.name: w for w in workers}
    versions = {v: provider.version_dir(v) for v in ("v1", "v-nan")}
    assert set(serving_versions(workers, fleet.token, versions).values()) == {"v1"}
    assert {w.name: load_calls(w, fleet.token) for w in workers} == {
        w.name: (1 if w.name == canary else 0) for w in workers
    }
    refused = metric_value(
        http_text(by_name[canary].url("/metrics"), token=fleet.token),
        "ckpt_agent_loads_total",
        {"result": LoadResult.FAILED, "reason": WorkerReason.NON_FINITE_TENSOR},
    )
    assert refused == 1
