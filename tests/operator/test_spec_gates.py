"""What holds a rollout before the machine sees it (ckpt_rollout.domain.spec_gates): an invalid spec, a
source the policy refuses, a versionFrom naming no version; and the conditions once it clears."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_api.source_policy import SourcePolicy
from ckpt_api.status import CheckpointRolloutStatus
from ckpt_api.vocabulary import Phase, RolloutReason
from ckpt_rollout.domain.spec_gates import Held, Passed, gate, recovered_status, stalled_on, stalled_status
from ckpt_rollout.domain.version_source import ConfigMapState

SPEC: dict[str, Any] = {
    "version": "v2",
    "source": {"uri": "http://ckpt.internal:8000"},
    "selector": {"matchLabels": {"app": "w"}},
}
FROM = {"configMapKeyRef": {"name": "trainer", "key": "version"}}
NOW = "2026-01-01T00:00:10Z"
POLICY = SourcePolicy.parse(["http://ckpt.internal:8000", "http://10.0.0.0/8"])


def _obj(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"namespace": "rl", "name": "fleet", "generation": 2}, "spec": {**SPEC, **spec}}


def _no_configmaps(key: tuple[str, str]) -> ConfigMapState | None:
    raise AssertionError(f"{key} looked up for a rollout without versionFrom")


@pytest.mark.parametrize(
    ("spec", "reason", "message"),
    [
        (
            {"strategy": {"waves": [3, 2]}},
            RolloutReason.INVALID_SPEC,
            "the spec is invalid: spec.strategy.waves: Value error, wave counts must be strictly increasing",
        ),
        (
            {"timeouts": {"workerSeconds": 0, "progressDeadlineSeconds": 0, "extra": 1, "more": 2}},
            RolloutReason.INVALID_SPEC,
            "(and 1 more error)",
        ),
        ({"version": "v2\n"}, RolloutReason.INVALID_SPEC, "spec.version"),
        (
            {"source": {"uri": "http://192.168.1.1:8000"}},
            RolloutReason.INVALID_SOURCE,
            "spec.source.uri: source 'http://192.168.1.1:8000' is not among the allowed sources",
        ),
        (
            {"source": {"uri": "http://169.254.169.254/"}},
            RolloutReason.INVALID_SOURCE,
            "is a link-local address",
        ),
    ],
    ids=["waves", "three-errors", "trailing-newline", "not-allowed", "link-local"],
)
def test_held(spec: dict[str, Any], reason: str, message: str) -> None:
    held = gate(_obj(**spec), _no_configmaps, POLICY)
    assert isinstance(held, Held)
    assert held.reason == reason
    assert message in held.message


def test_a_valid_spec_with_an_allowed_source_passes_as_it_is() -> None:
    obj = _obj(source={"uri": "http://10.1.2.3:8000/x"})
    passed = gate(obj, _no_configmaps, POLICY)
    assert passed == Passed(obj, "spec accepted: rolling out v2")
    assert passed.obj is not obj, "a copy: the daemon's snapshot stays as the apiserver returned it"


def test_a_name_only_a_cidr_rule_could_allow_is_left_to_the_agents() -> None:
    """The operator does not resolve names (the pods' DNS may answer otherwise): the agents check
    every address the name resolves to."""
    assert isinstance(gate(_obj(source={"uri": "http://elsewhere:8000"}), _no_configmaps, POLICY), Passed)
    only_names = SourcePolicy.parse(["http://ckpt.internal:8000"])
    held = gate(_obj(source={"uri": "http://elsewhere:8000"}), _no_configmaps, only_names)
    assert isinstance(held, Held)
    assert held.reason == RolloutReason.INVALID_SOURCE


def test_no_policy_allows_any_source() -> None:
    assert isinstance(gate(_obj(source={"uri": "http://anywhere:1"}), _no_configmaps, SourcePolicy()), Passed)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (None, None),
        (ConfigMapState(), "no such ConfigMap"),
        (ConfigMapState(exists=True, data={"version": "v9\n"}), "v9"),
    ],
    ids=["not-listed-yet", "missing", "resolved"],
)
def test_version_from_is_resolved_after_the_other_gates(
    state: ConfigMapState | None, expected: str | None
) -> None:
    spec = {k: v for k, v in SPEC.items() if k != "version"}
    obj = {"metadata": {"namespace": "rl", "name": "fleet"}, "spec": {**spec, "versionFrom": FROM}}
    looked: list[tuple[str, str]] = []

    def lookup(key: tuple[str, str]) -> ConfigMapState | None:
        looked.append(key)
        return state

    verdict = gate(obj, lookup, POLICY)
    assert looked == [("rl", "trainer")]
    if expected is None:
        assert verdict is None
    elif isinstance(verdict, Held):
        assert verdict.reason == RolloutReason.VERSION_SOURCE_INVALID
        assert expected in verdict.message
    else:
        assert isinstance(verdict, Passed)
        assert verdict.obj["spec"]["version"] == expected
        assert "versionFrom" not in verdict.obj["spec"]
        assert verdict.message == "target version v9 read from ConfigMap trainer key version"


def test_an_invalid_spec_is_held_before_its_source_or_configmap_are_looked_at() -> None:
    obj = _obj(versionFrom=FROM, source={"uri": "http://169.254.169.254/"})
    held = gate(obj, _no_configmaps, POLICY)
    assert isinstance(held, Held)
    assert held.reason == RolloutReason.INVALID_SPEC
    assert "exactly one of version and versionFrom" in held.message


@pytest.mark.parametrize(
    ("reason", "cleared"),
    [
        (RolloutReason.INVALID_SPEC, RolloutReason.SPEC_ACCEPTED),
        (RolloutReason.INVALID_SOURCE, RolloutReason.SOURCE_ALLOWED),
        (RolloutReason.VERSION_SOURCE_INVALID, RolloutReason.VERSION_SOURCE_RESOLVED),
    ],
)
def test_each_gate_stalls_and_clears_with_its_own_reason(reason: str, cleared: str) -> None:
    before = CheckpointRolloutStatus(phase=Phase.PROGRESSING, message="wave 1/2: 1 pod")
    stalled = stalled_status(before, Held(reason, "fix me"), now=NOW, generation=2)
    assert (stalled.phase, stalled.message, stalled_on(stalled)) == (Phase.PROGRESSING, "fix me", reason)
    conditions = {c.type: (c.status.value, c.reason) for c in stalled.conditions}
    assert conditions["Stalled"] == ("True", reason)
    assert stalled_on(before) is None
    recovered = recovered_status(stalled, "fixed", now=NOW, generation=2)
    assert recovered is not None
    assert {c.type: (c.status.value, c.reason) for c in recovered.conditions}["Stalled"] == ("False", cleared)
    assert stalled_on(recovered) is None
    assert recovered_status(recovered, "again", now=NOW, generation=2) is None
