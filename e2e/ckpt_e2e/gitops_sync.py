"""How Argo CD and Flux apply a manifest from Git, reduced to what decides whether they revert
a field someone else set: server-side apply with the controller's field manager, forcing
ownership as both do; Argo CD's ignoreDifferences with RespectIgnoreDifferences (the live value
of an ignored field goes into what it applies); Flux's create-only annotation."""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from .kubectl import Kubectl

ARGOCD_MANAGER = "argocd-controller"
FLUX_MANAGER = "kustomize-controller"
FLUX_SSA_ANNOTATION = "kustomize.toolkit.fluxcd.io/ssa"
FLUX_IF_NOT_PRESENT = "IfNotPresent"
RESPECT_IGNORE_DIFFERENCES = "RespectIgnoreDifferences=true"


def server_side_apply(kubectl: Kubectl, obj: Mapping[str, Any], manager: str) -> None:
    kubectl.run(
        "apply",
        "--server-side",
        f"--field-manager={manager}",
        "--force-conflicts",
        "-f",
        "-",
        input=json.dumps(obj),
    )


def _pointer(path: str) -> list[str]:
    """RFC 6901: "/spec/version" -> ["spec", "version"]."""
    return [p.replace("~1", "/").replace("~0", "~") for p in path.split("/")[1:]]


def _get(obj: Mapping[str, Any], parts: list[str]) -> tuple[bool, Any]:
    node: Any = obj
    for part in parts:
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _set(obj: dict[str, Any], parts: list[str], value: Any) -> None:
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def ignored_pointers(application: Mapping[str, Any], obj: Mapping[str, Any]) -> list[str]:
    """The Application's ignoreDifferences jsonPointers that apply to ``obj``."""
    group = obj["apiVersion"].rpartition("/")[0]
    return [
        pointer
        for rule in application["spec"].get("ignoreDifferences") or []
        if rule.get("kind") == obj["kind"] and rule.get("group", "") == group
        for pointer in rule.get("jsonPointers") or []
    ]


def argocd_target(
    application: Mapping[str, Any], desired: Mapping[str, Any], live: Mapping[str, Any] | None
) -> dict[str, Any]:
    """What an Argo CD sync applies: Git's manifest, with the live values of the ignored
    fields when the Application respects its ignoreDifferences (and the object exists)."""
    target = copy.deepcopy(dict(desired))
    options = (application["spec"].get("syncPolicy") or {}).get("syncOptions") or []
    if live is None or RESPECT_IGNORE_DIFFERENCES not in options:
        return target
    for pointer in ignored_pointers(application, desired):
        found, value = _get(live, _pointer(pointer))
        if found:
            _set(target, _pointer(pointer), value)
    return target


def argocd_sync(
    kubectl: Kubectl,
    application: Mapping[str, Any],
    desired: Mapping[str, Any],
    live: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """One sync of ``desired``; returns what was applied."""
    target = argocd_target(application, desired, live)
    server_side_apply(kubectl, target, ARGOCD_MANAGER)
    return target


def flux_apply(kubectl: Kubectl, desired: Mapping[str, Any]) -> bool:
    """One kustomize-controller apply of ``desired``; False when it skipped an existing object
    marked create-only (what the apiserver said to a server-side create proves it exists)."""
    annotations = desired.get("metadata", {}).get("annotations") or {}
    if annotations.get(FLUX_SSA_ANNOTATION) == FLUX_IF_NOT_PRESENT:
        created = kubectl.run("create", "--dry-run=server", "-f", "-", input=json.dumps(desired), check=False)
        if created.returncode != 0:
            if "AlreadyExists" not in created.stderr and "already exists" not in created.stderr:
                raise AssertionError(f"create --dry-run=server failed otherwise: {created.stderr}")
            return False
    server_side_apply(kubectl, desired, FLUX_MANAGER)
    return True
