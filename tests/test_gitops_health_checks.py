"""The Argo CD health Lua on statuses the operator's own condition evaluator writes, in the
real Lua 5.1 (no cluster). e2e/tests/test_gitops_health.py runs it on real rollouts too."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from ckpt_api.vocabulary import Phase, RolloutReason
from ckpt_e2e.gitops import (
    ARGOCD_CM,
    HEALTH_KEY,
    HEALTH_LUA,
    ROOT,
    Health,
    argocd_health,
    kstatus,
    lua_literal,
)
from ckpt_rollout.domain.conditions import Verdict, evaluate_conditions

GENERATION = 4
NOW = "2026-12-01T12:00:00Z"


def _rollout(verdict: Verdict | None, *, observed: int | None = GENERATION) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "rollout.ckpt.dev/v1alpha1",
        "kind": "CheckpointRollout",
        "metadata": {"name": "fleet", "namespace": "rl", "generation": GENERATION},
        "spec": {"version": "v2", "selector": {"matchLabels": {}}, "strategy": {"waves": [1, "100%"]}},
    }
    if verdict is not None:
        obj["status"] = {
            "phase": verdict.phase,
            "observedGeneration": observed,
            "message": verdict.message,
            "workers": {},
            "conditions": evaluate_conditions(verdict, [], now=NOW, generation=observed),
        }
    return obj


def test_the_configmap_embeds_the_script_verbatim() -> None:
    """One source of truth: argocd-cm's key holds exactly the .lua file the tests run."""
    (doc,) = list(yaml.safe_load_all(ARGOCD_CM.read_text()))
    assert (doc["apiVersion"], doc["kind"], doc["metadata"]["name"]) == ("v1", "ConfigMap", "argocd-cm")
    assert doc["data"] == {HEALTH_KEY: HEALTH_LUA.read_text()}


def test_the_flux_kustomization_waits_on_the_rollouts_it_applies_from_the_repository() -> None:
    """wait: kstatus health of everything applied; the source is flux-helmrelease.yaml's."""
    gitops = ROOT / "examples" / "gitops"
    (kustomization,) = list(yaml.safe_load_all((gitops / "flux-kustomization.yaml").read_text()))
    flux_install = yaml.safe_load_all((gitops / "flux-helmrelease.yaml").read_text())
    repos = [d for d in flux_install if d["kind"] == "GitRepository"]
    assert kustomization["kind"] == "Kustomization"
    assert kustomization["spec"]["wait"] is True
    ref = kustomization["spec"]["sourceRef"]
    assert [(r["kind"], r["metadata"]["name"], r["metadata"]["namespace"]) for r in repos] == [
        (ref["kind"], ref["name"], kustomization["metadata"]["namespace"])
    ]


# Quotes, backslashes, a newline and non-ASCII must reach Argo CD's UI unchanged.
AWKWARD = 'wave 1/2: pod "w-0" said C:\\ckpt\nnot found — ünïcode'


@pytest.mark.parametrize(
    ("verdict", "health"),
    [
        (Verdict(Phase.PENDING, RolloutReason.NO_WORKERS, "no pods match"), "Progressing"),
        (Verdict(Phase.PROGRESSING, RolloutReason.WAVE_STARTED, "wave 1/2 started"), "Progressing"),
        (Verdict(Phase.ROLLING_BACK, RolloutReason.ROLLING_BACK, "rolling 1 pod back"), "Progressing"),
        (Verdict(Phase.PAUSED, RolloutReason.ROLLOUT_PAUSED, "paused after wave 1"), "Suspended"),
        (Verdict(Phase.SUCCEEDED, RolloutReason.ROLLOUT_COMPLETED, "v2 on 3/3 pods"), "Healthy"),
        (Verdict(Phase.FAILED, "VersionNotFound", AWKWARD), "Degraded"),
        (Verdict(Phase.ROLLED_BACK, RolloutReason.ROLLED_BACK, "back on v1"), "Degraded"),
        (Verdict(Phase.PENDING, RolloutReason.SELECTOR_CONFLICT, "b selects them", stalled=True), "Degraded"),
        # Stalled whatever the phase: one verdict with kstatus's Failed (below).
        (
            Verdict(Phase.SUCCEEDED, RolloutReason.SELECTOR_CONFLICT, "b selects them", stalled=True),
            "Degraded",
        ),
        (Verdict(Phase.PAUSED, RolloutReason.SELECTOR_CONFLICT, "b selects them", stalled=True), "Degraded"),
        (
            Verdict(Phase.PROGRESSING, RolloutReason.SELECTOR_CONFLICT, "b selects them", stalled=True),
            "Degraded",
        ),
    ],
    ids=lambda v: f"{v.phase}{'-stalled' if v.stalled else ''}" if isinstance(v, Verdict) else v,
)
def test_each_phase_maps_to_its_argo_health_with_the_message(verdict: Verdict, health: str) -> None:
    assert argocd_health(_rollout(verdict)) == Health(health, verdict.message)


def test_no_status_yet_is_progressing() -> None:
    assert argocd_health(_rollout(None)).status == "Progressing"


@pytest.mark.parametrize("observed", [GENERATION - 1, None])
def test_a_spec_the_operator_has_not_seen_is_progressing_whatever_the_old_status_says(
    observed: int | None,
) -> None:
    """Right after Git syncs a new version the status still says Succeeded for the old one."""
    old = Verdict(Phase.SUCCEEDED, RolloutReason.ROLLOUT_COMPLETED, "v1 on 3/3 pods")
    behind = f"Waiting for the operator to observe generation {GENERATION}"
    assert argocd_health(_rollout(old, observed=observed)) == Health("Progressing", behind)


def test_an_unknown_phase_is_unknown_not_healthy() -> None:
    obj = _rollout(Verdict(Phase.SUCCEEDED, RolloutReason.ROLLOUT_COMPLETED, "done"))
    obj["status"]["phase"] = "Hibernating"
    assert argocd_health(obj) == Health("Unknown", "Unknown phase Hibernating: done")


def test_a_script_using_what_argo_cd_does_not_open_fails(tmp_path: Path) -> None:
    """The harness gives the script Argo CD's libraries only: `os` is not there."""
    script = tmp_path / "uses-os.lua"
    script.write_text('hs = {status = "Healthy", message = os.getenv("HOME")}\nreturn hs\n')
    with pytest.raises(RuntimeError, match="os"):
        argocd_health(_rollout(None), script)


@pytest.mark.parametrize(
    ("value", "literal"),
    [
        ({"a": [1, 2.5, True, None]}, '{["a"]={1, 2.5, true, nil}}'),
        ({"gone": None, "x": {}}, '{["x"]={}}'),
        ('say "hi"\n', '"say \\034hi\\034\\010"'),
    ],
)
def test_json_becomes_lua_table_constructors(value: Any, literal: str) -> None:
    assert lua_literal(value) == literal


VERDICTS = [
    Verdict(Phase.PENDING, RolloutReason.NO_WORKERS, "no pods match"),
    Verdict(Phase.PROGRESSING, RolloutReason.WAVE_STARTED, "wave 1/2 started"),
    Verdict(Phase.SUCCEEDED, RolloutReason.ROLLOUT_COMPLETED, "v2 on 3/3 pods"),
    Verdict(Phase.ROLLED_BACK, RolloutReason.ROLLED_BACK, "back on v1"),
    *(
        Verdict(phase, RolloutReason.SELECTOR_CONFLICT, "b selects them", stalled=True)
        for phase in (Phase.PENDING, Phase.PROGRESSING, Phase.PAUSED, Phase.SUCCEEDED)
    ),
]


def test_argo_cd_and_kstatus_give_one_verdict() -> None:
    """Argo CD's Degraded is kstatus's Failed (what Flux waits on), Healthy its Current, for every
    status the operator writes, a stalled one whatever its phase included."""
    objs = [_rollout(v) for v in VERDICTS]
    pairs = [(argocd_health(o).status, k.status) for o, k in zip(objs, kstatus(objs), strict=True)]
    for (argo, flux), verdict in zip(pairs, VERDICTS, strict=True):
        assert (argo == "Degraded") == (flux == "Failed"), (verdict, argo, flux)
        assert (argo == "Healthy") == (flux == "Current"), (verdict, argo, flux)
