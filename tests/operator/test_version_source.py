"""spec.versionFrom: the stored spec's rules, the resolver, and the stalled/recovered statuses."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from ckpt_api.spec import CheckpointRolloutSpec, ConfigMapKeyRef, DeclaredRolloutSpec
from ckpt_api.status import CheckpointRolloutStatus
from ckpt_api.vocabulary import Phase, RolloutReason
from ckpt_rollout.domain.spec_gates import Held, recovered_status, stalled_status
from ckpt_rollout.domain.version_source import (
    ConfigMapState,
    SourceInvalid,
    resolve_version,
    source_ref,
    with_version,
)

BASE: dict[str, Any] = {"source": {"uri": "http://src:8000"}, "selector": {"matchLabels": {"app": "w"}}}
FROM = {"configMapKeyRef": {"name": "trainer-version", "key": "version"}}
REF = ConfigMapKeyRef(name="trainer-version", key="version")
NOW = "2026-01-01T00:00:10Z"
GONE = Held(RolloutReason.VERSION_SOURCE_INVALID, "spec.versionFrom: gone")


@pytest.mark.parametrize(
    ("extra", "error"),
    [
        ({"version": "v1"}, None),
        ({"versionFrom": FROM}, None),
        ({}, "exactly one of version and versionFrom"),
        ({"version": "v1", "versionFrom": FROM}, "exactly one of version and versionFrom"),
        ({"versionFrom": {"configMapKeyRef": {"name": "Trainer", "key": "v"}}}, "name"),
        ({"versionFrom": {"configMapKeyRef": {"name": "t", "key": "a/b"}}}, "key"),
        ({"versionFrom": {"configMapKeyRef": {"name": "t"}}}, "key"),
        ({"versionFrom": {}}, "configMapKeyRef"),
        (
            {
                "versionFrom": FROM,
                "source": {"uri": "http://src:8000", "manifestDigest": "sha256:" + "0" * 64},
            },
            "cannot be used with versionFrom",
        ),
    ],
    ids=["version", "versionFrom", "neither", "both", "bad-name", "bad-key", "no-key", "no-ref", "pinned"],
)
def test_the_stored_spec_has_exactly_one_version_source(extra: dict[str, Any], error: str | None) -> None:
    if error is None:
        DeclaredRolloutSpec.model_validate({**BASE, **extra})
        return
    with pytest.raises(ValidationError, match=error):
        DeclaredRolloutSpec.model_validate({**BASE, **extra})


def test_a_step_spec_needs_the_version_resolved() -> None:
    with pytest.raises(ValidationError):
        CheckpointRolloutSpec.model_validate({**BASE, "versionFrom": FROM})
    resolved = with_version({"metadata": {}, "spec": {**BASE, "versionFrom": FROM}}, "v7")
    assert CheckpointRolloutSpec.model_validate(resolved["spec"]).version == "v7"


def _cm(data: dict[str, str] | None = None, **kwargs: Any) -> ConfigMapState:
    return ConfigMapState(exists=True, data=data or {}, **kwargs)


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        (_cm({"version": "global_step_1200"}), "global_step_1200"),
        (_cm({"version": "global_step_1200\n"}), "global_step_1200"),  # --from-file's newline
        (_cm({"version": "v2", "other": "x"}), "v2"),
        (ConfigMapState(), "no such ConfigMap"),
        (_cm({"other": "v2"}), "has no such key"),
        (_cm(binary_keys=frozenset({"version"})), "binaryData"),
        (_cm({"version": ""}), "must not be empty"),
        (_cm({"version": "../etc"}), "contains '/'"),
        (_cm({"version": "v 2"}), "must start with a letter or digit"),
        (ConfigMapState(error="403 Forbidden"), "cannot be read: 403 Forbidden"),
    ],
    ids=[
        "value",
        "newline",
        "other-keys",
        "absent",
        "no-key",
        "binary",
        "empty",
        "slash",
        "space",
        "forbidden",
    ],
)
def test_resolve_version(state: ConfigMapState, expected: str) -> None:
    got = resolve_version(REF, state)
    if isinstance(got, SourceInvalid):
        assert got.message.startswith("spec.versionFrom: ConfigMap trainer-version key version: ")
        assert expected in got.message
    else:
        assert got == expected


@pytest.mark.parametrize(
    ("spec", "expected"),
    [({"version": "v1"}, None), ({"versionFrom": FROM}, REF), ({"versionFrom": None}, None)],
)
def test_source_ref(spec: dict[str, Any], expected: ConfigMapKeyRef | None) -> None:
    assert source_ref(spec) == expected


def test_with_version_leaves_the_snapshot_as_it_was() -> None:
    obj = {"metadata": {"name": "r"}, "spec": {**BASE, "versionFrom": FROM}, "status": {"phase": "Succeeded"}}
    resolved = with_version(obj, "v3")
    assert resolved["spec"] == {**BASE, "version": "v3"}
    assert resolved["status"] == obj["status"]
    assert obj["spec"]["versionFrom"] == FROM
    assert "version" not in obj["spec"]


def _conds(status: CheckpointRolloutStatus) -> dict[str, tuple[str, str]]:
    return {c.type: (c.status.value, c.reason) for c in status.conditions}


@pytest.mark.parametrize("phase", [None, Phase.SUCCEEDED, Phase.PROGRESSING])
def test_stalled_keeps_the_phase_and_only_stalled_holds(phase: Phase | None) -> None:
    before = CheckpointRolloutStatus(phase=phase, message="v1 is live on 2 pods")
    stalled = stalled_status(before, GONE, now=NOW, generation=3)
    assert stalled.phase is (phase or Phase.PENDING)
    assert stalled.message == "spec.versionFrom: gone"
    assert stalled.observed_generation == 3
    held = {t for t, (s, _) in _conds(stalled).items() if s == "True"}
    assert held == {"Stalled"}
    assert {r for _, r in _conds(stalled).values()} == {RolloutReason.VERSION_SOURCE_INVALID}
    assert recovered_status(before, "back", now=NOW, generation=3) is None, "never stalled: left alone"


def test_recovered_gives_the_phase_its_conditions_back() -> None:
    before = CheckpointRolloutStatus(phase=Phase.SUCCEEDED, message="v1 is live on 2 pods")
    stalled = stalled_status(before, GONE, now=NOW, generation=3)
    recovered = recovered_status(
        stalled, "target version v1 read from ConfigMap t key v", now=NOW, generation=3
    )
    assert recovered is not None
    assert recovered.phase is Phase.SUCCEEDED
    held = {t for t, (s, _) in _conds(recovered).items() if s == "True"}
    assert held == {"Complete", "Ready"}
    assert _conds(recovered)["Stalled"] == ("False", RolloutReason.VERSION_SOURCE_RESOLVED)
    assert recovered_status(recovered, "again", now=NOW, generation=3) is None


@pytest.mark.parametrize(
    "value", ["db-password: hunter2", "../../hunter2", "hunter2..x", "hunter2 <b>internal</b>"]
)
def test_an_invalid_value_is_never_repeated_in_the_status(value: str) -> None:
    """The operator reads the ConfigMap with its own rights; the CR's author reads the status
    and may have none on the ConfigMap, so the message says what is wrong, not what is there."""
    got = resolve_version(REF, _cm({"version": value}))
    assert isinstance(got, SourceInvalid)
    assert "hunter2" not in got.message
    assert "the value" in got.message
