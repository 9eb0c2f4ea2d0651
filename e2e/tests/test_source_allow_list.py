"""The operator's source allow-list (--allowed-sources) on the local control plane with real
agents: a rollout naming another source is Stalled (InvalidSource, a Warning event) and no agent
is called; pointing it at an allowed source rolls it out."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.vocabulary import ConditionStatus, EventReason, EventType, RolloutReason
from ckpt_e2e.procs import wait_for
from ckpt_e2e.providers import LocalProvider, Provider
from ckpt_e2e.rollout_env import conditions, serving_versions, update_calls

pytestmark = pytest.mark.integration

NAME = "fleet"


def test_a_source_outside_the_allow_list_stalls_until_the_rollout_names_an_allowed_one(
    provider: Provider,
) -> None:
    assert isinstance(provider, LocalProvider), "restarts the harness's operator with a flag"
    operator = provider.operator
    operator.stop()
    operator.extra_args = [*operator.extra_args, f"--allowed-sources={provider.source_uri}"]
    operator.start()

    fleet = provider.fleet(2)
    workers = fleet.workers(2)
    outside = "http://127.0.0.2:9/"
    spec = provider.spec("v2", fleet)
    provider.rollouts.create(NAME, {**spec, "source": {"uri": outside}})

    def stalled() -> dict[str, Any] | None:
        status = provider.rollouts.status(NAME)
        stall = conditions(status).get("Stalled")
        return status if stall and stall["status"] == ConditionStatus.TRUE else None

    status = wait_for(stalled, 30, "the rollout stalled on its source", interval=0.2)
    assert conditions(status)["Stalled"]["reason"] == RolloutReason.INVALID_SOURCE
    allowed = provider.source_uri.rstrip("/")
    assert status["message"] == (
        f"spec.source.uri: source {outside!r} is not among the allowed sources ({allowed})"
    ), status
    assert "targetVersion" not in status, "nothing started"
    warnings = wait_for(
        lambda: [
            e for e in provider.rollouts.events(NAME)
            if (e["type"], e["reason"]) == (EventType.WARNING, EventReason.INVALID_SOURCE)
        ] or None,
        30,
        "the InvalidSource event",
        interval=0.2,
    )  # fmt: skip
    assert warnings[0]["message"] == status["message"]
    assert {w.name: update_calls(w, fleet.token) for w in workers} == {w.name: 0 for w in workers}

    provider.rollouts.api.patch_namespaced_custom_object(
        GROUP, VERSION, provider.namespace, PLURAL, NAME, {"spec": {"source": spec["source"]}}
    )
    status = provider.rollouts.wait_phase(NAME, {"Succeeded", "Failed", "RolledBack"}, timeout=120)
    assert status["phase"] == "Succeeded", status
    stall = conditions(status)["Stalled"]
    assert stall["status"] == ConditionStatus.FALSE
    versions = {v: provider.version_dir(v) for v in ("v1", "v2")}
    assert set(serving_versions(workers, fleet.token, versions).values()) == {"v2"}
