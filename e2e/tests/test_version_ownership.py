"""Who owns spec.version: each ownership pattern of examples/gitops/ownership-*.yaml, on the
local control plane with real agents. Git's manifest is applied as its GitOps controller
applies it (server-side apply with the controller's field manager, forcing ownership), the
trainer moves the version on, the controller applies Git's manifest again, and the trainer's
version stays: no revert, and no second rollout (startedAt unchanged, no agent got another
update_weights). Argo CD without RespectIgnoreDifferences does revert: the same check fails.

"The operator has seen the re-apply" is made observable, not waited out: after it, a
harmless spec field is bumped (timeouts.progressDeadlineSeconds, by a third field manager),
and the check reads the status once status.observedGeneration has caught up with it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.spec import DeclaredRolloutSpec
from ckpt_api.vocabulary import ConditionStatus, EventReason, EventType, Phase, RolloutReason
from ckpt_e2e.gitops_sync import ARGOCD_MANAGER, FLUX_MANAGER, argocd_sync, flux_apply, server_side_apply
from ckpt_e2e.procs import wait_for
from ckpt_e2e.providers import Provider, WorkerFleet
from ckpt_e2e.rollout_env import conditions, serving_versions, update_calls

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "gitops"
TRAINER = "ckpt-rollout-release"  # the field manager `ckpt-rollout release` writes with
PROBE = "e2e-probe"
NAME = "fleet"
ENDED = {Phase.SUCCEEDED.value, Phase.FAILED.value, Phase.ROLLED_BACK.value}


def _example(file: str, kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all((EXAMPLES / file).read_text()) if d and d["kind"] == kind]
    return dict(doc)


def _git_manifest(
    provider: Provider, fleet: WorkerFleet, file: str, version: str | None = None
) -> dict[str, Any]:
    """The example's CR as this test's Git holds it: its ownership parts kept, pointed at this
    test's fleet and source (and version, when Git holds one)."""
    cr = _example(file, "CheckpointRollout")
    cr["metadata"] = {**cr["metadata"], "name": NAME, "namespace": provider.namespace}
    probe = provider.spec(version or "v1", fleet)
    cr["spec"] = {**cr["spec"], "source": probe["source"], "selector": probe["selector"]}
    if version is not None:
        cr["spec"]["version"] = version
    DeclaredRolloutSpec.model_validate(cr["spec"])  # what Git holds is a valid spec
    return cr


def _version_configmap(provider: Provider, cr: dict[str, Any], version: str) -> dict[str, Any]:
    ref = cr["spec"]["versionFrom"]["configMapKeyRef"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": ref["name"], "namespace": provider.namespace},
        "data": {ref["key"]: version},
    }


def _trainer_sets_spec_version(provider: Provider, version: str) -> None:
    provider.rollouts.api.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        provider.namespace,
        PLURAL,
        NAME,
        {"spec": {"version": version}},
        field_manager=TRAINER,
    )


def _succeeded(provider: Provider, version: str) -> dict[str, Any]:
    status = provider.rollouts.wait_phase(NAME, ENDED, timeout=120, version=version)
    assert status["phase"] == Phase.SUCCEEDED, status
    return status


@dataclass(frozen=True)
class Mark:
    """What shows whether a rollout happened since: its start and every agent's call count."""

    target: str
    started_at: str
    calls: float


def _mark(provider: Provider, fleet: WorkerFleet, status: dict[str, Any]) -> Mark:
    calls = sum(update_calls(w, fleet.token) for w in fleet.workers(2))
    return Mark(status["targetVersion"], status["startedAt"], calls)


def _seen_by_operator(provider: Provider) -> dict[str, Any]:
    """The status once the operator has stepped on the CR as it is now (see the docstring)."""
    obj = provider.rollouts.get(NAME)
    deadline = obj["spec"]["timeouts"]["progressDeadlineSeconds"] + 1
    bumped = provider.rollouts.api.patch_namespaced_custom_object(
        GROUP,
        VERSION,
        provider.namespace,
        PLURAL,
        NAME,
        {"spec": {"timeouts": {"progressDeadlineSeconds": deadline}}},
        field_manager=PROBE,
    )
    generation = bumped["metadata"]["generation"]

    def caught_up() -> dict[str, Any] | None:
        status = provider.rollouts.status(NAME)
        return status if status.get("observedGeneration") == generation else None

    status: dict[str, Any] = wait_for(caught_up, 30, f"observedGeneration {generation}", interval=0.2)
    return status


def _no_second_rollout(provider: Provider, fleet: WorkerFleet, before: Mark) -> list[str]:
    """What differs from ``before`` once the operator has seen the CR as it is now."""
    status = _seen_by_operator(provider)
    now = _mark(provider, fleet, status)
    problems = []
    if now.target != before.target:
        problems.append(f"targetVersion {before.target} -> {now.target}")
    if now.started_at != before.started_at:
        problems.append(f"a rollout started at {now.started_at}")
    if now.calls != before.calls:
        problems.append(f"agents got {now.calls - before.calls:g} more update_weights")
    return problems


def _serving(provider: Provider, fleet: WorkerFleet) -> set[str | None]:
    workers = fleet.workers(2)
    return set(
        serving_versions(workers, fleet.token, {v: provider.version_dir(v) for v in ("v2", "v3")}).values()
    )


@pytest.mark.parametrize("manager", [ARGOCD_MANAGER, FLUX_MANAGER])
def test_version_from_a_configmap_git_never_lists(provider: Provider, manager: str) -> None:
    """Pattern 1: Git's CR has versionFrom; the trainer writes the ConfigMap key. Argo CD and
    Flux apply the same file the same way."""
    fleet = provider.fleet(2)
    git = _git_manifest(provider, fleet, "ownership-version-from.yaml")
    assert "version" not in git["spec"]
    server_side_apply(provider.kubectl, _version_configmap(provider, git, "v2"), TRAINER)
    server_side_apply(provider.kubectl, git, manager)
    _succeeded(provider, "v2")

    server_side_apply(provider.kubectl, _version_configmap(provider, git, "v3"), TRAINER)
    before = _mark(provider, fleet, _succeeded(provider, "v3"))
    assert _serving(provider, fleet) == {"v3"}

    server_side_apply(provider.kubectl, git, manager)  # the controller's next reconcile
    assert _no_second_rollout(provider, fleet, before) == []
    cm = provider.kubectl.json("get", "configmap", git["spec"]["versionFrom"]["configMapKeyRef"]["name"])
    assert cm["data"] == {"version": "v3"}
    assert "version" not in provider.rollouts.get(NAME)["spec"]


def test_argocd_respect_ignore_differences_keeps_the_trainers_version(provider: Provider) -> None:
    """Pattern 2: Git holds spec.version, the trainer patches it, the Application ignores
    /spec/version and respects that on sync. The negative control: the same sync without
    RespectIgnoreDifferences reverts the trainer and rolls Git's version out again."""
    fleet = provider.fleet(2)
    file = "ownership-argocd-ignore-version.yaml"
    app = _example(file, "Application")
    git = _git_manifest(provider, fleet, file, version="v2")
    argocd_sync(provider.kubectl, app, git, live=None)
    _succeeded(provider, "v2")

    _trainer_sets_spec_version(provider, "v3")
    before = _mark(provider, fleet, _succeeded(provider, "v3"))

    applied = argocd_sync(provider.kubectl, app, git, live=provider.rollouts.get(NAME))
    assert applied["spec"]["version"] == "v3", "RespectIgnoreDifferences applies the live value"
    assert _no_second_rollout(provider, fleet, before) == []
    assert provider.rollouts.get(NAME)["spec"]["version"] == "v3"
    assert _serving(provider, fleet) == {"v3"}

    options = [o for o in app["spec"]["syncPolicy"]["syncOptions"] if not o.startswith("RespectIgnore")]
    plain = {
        **app,
        "spec": {**app["spec"], "syncPolicy": {**app["spec"]["syncPolicy"], "syncOptions": options}},
    }
    argocd_sync(provider.kubectl, plain, git, live=provider.rollouts.get(NAME))
    assert provider.rollouts.get(NAME)["spec"]["version"] == "v2"
    _succeeded(provider, "v2")
    assert _no_second_rollout(provider, fleet, before), "the check sees a revert when there is one"


def test_flux_if_not_present_creates_the_cr_once(provider: Provider) -> None:
    """Pattern 3: Flux creates the annotated CR and skips it from then on."""
    fleet = provider.fleet(2)
    git = _git_manifest(provider, fleet, "ownership-flux-if-not-present.yaml", version="v2")
    assert flux_apply(provider.kubectl, git), "absent: Flux creates it"
    _succeeded(provider, "v2")

    _trainer_sets_spec_version(provider, "v3")
    before = _mark(provider, fleet, _succeeded(provider, "v3"))
    assert not flux_apply(provider.kubectl, git), "present: Flux leaves it alone"
    assert _no_second_rollout(provider, fleet, before) == []
    assert provider.rollouts.get(NAME)["spec"]["version"] == "v3"


def test_an_unreadable_version_source_stalls_until_fixed(provider: Provider) -> None:
    """versionFrom naming a ConfigMap that is not there, then a value that is no version:
    Stalled with the reason and a Warning event, no agent called; a valid value rolls out."""
    fleet = provider.fleet(2)
    git = _git_manifest(provider, fleet, "ownership-version-from.yaml")
    server_side_apply(provider.kubectl, git, ARGOCD_MANAGER)

    def stalled(why: str) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = provider.rollouts.status(NAME)
            return status if why in (status.get("message") or "") else None

        status: dict[str, Any] = wait_for(reached, 30, f"stalled: {why}", interval=0.2)
        held = {t for t, c in conditions(status).items() if c["status"] == ConditionStatus.TRUE}
        assert held == {"Stalled"}, status
        assert conditions(status)["Stalled"]["reason"] == RolloutReason.VERSION_SOURCE_INVALID
        assert status["phase"] == Phase.PENDING, status
        assert "targetVersion" not in status, status
        return status

    stalled("no such ConfigMap")
    server_side_apply(provider.kubectl, _version_configmap(provider, git, "../v2"), TRAINER)
    status = stalled("contains '/'")
    assert status["message"].startswith("spec.versionFrom: ConfigMap rollout-worker-version key version: ")
    warnings = wait_for(
        lambda: (
            [
                e["message"]
                for e in provider.rollouts.events(NAME)
                if e["reason"] == EventReason.VERSION_SOURCE_INVALID and e["type"] == EventType.WARNING
            ]
            or None
        ),
        30,
        "the VersionSourceInvalid events",
        interval=0.2,
    )
    assert any("no such ConfigMap" in m for m in warnings), warnings
    assert sum(update_calls(w, fleet.token) for w in fleet.workers(2)) == 0

    server_side_apply(provider.kubectl, _version_configmap(provider, git, "v2"), TRAINER)
    status = _succeeded(provider, "v2")
    assert conditions(status)["Stalled"]["status"] == ConditionStatus.FALSE
    assert _serving(provider, fleet) == {"v2"}
