"""spec.versionFrom: a rollout's target version read from a ConfigMap key that a trainer owns
and Git never lists. Pure: the daemon hands in what its ConfigMap watch last saw, and the
machine only ever sees a spec whose version is concrete (spec_gates holds a rollout whose
ConfigMap names none)."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ckpt_api.spec import ConfigMapKeyRef
from ckpt_api.versions import validate_version


@dataclass(frozen=True)
class ConfigMapState:
    """One ConfigMap as the operator's watch last saw it."""

    exists: bool = False
    data: Mapping[str, str] = field(default_factory=dict)
    binary_keys: frozenset[str] = frozenset()
    error: str = ""  # why it could not be read (e.g. RBAC), empty when it could


@dataclass(frozen=True)
class SourceInvalid:
    message: str


def source_ref(spec: Mapping[str, Any]) -> ConfigMapKeyRef | None:
    """The ConfigMap key a stored spec takes its version from, if it uses versionFrom."""
    version_from = spec.get("versionFrom")
    if not version_from:
        return None
    return ConfigMapKeyRef.model_validate(version_from["configMapKeyRef"])


def describe(ref: ConfigMapKeyRef) -> str:
    return f"ConfigMap {ref.name} key {ref.key}"


def resolve_version(ref: ConfigMapKeyRef, state: ConfigMapState) -> str | SourceInvalid:
    """The version the ConfigMap key holds, or why it names none."""
    where = f"spec.versionFrom: {describe(ref)}"
    if state.error:
        return SourceInvalid(f"{where}: cannot be read: {state.error}")
    if not state.exists:
        return SourceInvalid(f"{where}: no such ConfigMap in the rollout's namespace")
    if ref.key not in state.data:
        if ref.key in state.binary_keys:
            return SourceInvalid(f"{where}: the key is in binaryData; the version must be in data")
        return SourceInvalid(f"{where}: the ConfigMap has no such key")
    # A value written with `kubectl create configmap --from-file` ends in a newline.
    value = state.data[ref.key].strip()
    try:
        # Never the value itself: the operator reads the ConfigMap with its own rights, and the
        # CR's author, who reads status, may have none on it.
        return validate_version(value, named="the value")
    except ValueError as exc:
        return SourceInvalid(f"{where}: {exc}")


def with_version(obj: Mapping[str, Any], version: str) -> dict[str, Any]:
    """The CR as a step reads it: spec.version resolved, versionFrom gone. A new dict: the
    snapshot the daemon took stays as the apiserver returned it."""
    spec = {k: v for k, v in obj["spec"].items() if k != "versionFrom"}
    return {**obj, "spec": {**spec, "version": version}}
