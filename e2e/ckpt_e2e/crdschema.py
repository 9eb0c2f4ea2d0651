"""What the apiserver would prune or reject from a status write: a walk of a value against the
generated CRD's structural schema, for tests that collect what the operator and the agents
write."""

from __future__ import annotations

from typing import Any

from ckpt_api.crd import build_crd

Schema = dict[str, Any]

_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "object": (dict,),
    "array": (list,),
}


def status_schema() -> Schema:
    """The CRD's `status` schema, as the apiserver enforces it."""
    version = build_crd()["spec"]["versions"][0]
    schema: Schema = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    return schema


def schema_problems(value: Any, schema: Schema, path: str = "status") -> list[str]:
    """Fields of ``value`` the schema does not declare (the apiserver drops them silently) and
    values of the wrong type. A null is a merge patch's deletion: always fine."""
    if value is None:
        return []
    if schema.get("x-kubernetes-int-or-string"):
        return [] if isinstance(value, int | str) and not isinstance(value, bool) else [f"{path}: {value!r}"]
    expected = schema.get("type")
    if expected is not None:
        numeric = expected in ("integer", "number")
        if not isinstance(value, _TYPES[expected]) or (numeric and isinstance(value, bool)):
            return [f"{path}: {value!r} is not {expected}"]
    problems: list[str] = []
    if isinstance(value, dict):
        if schema.get("x-kubernetes-preserve-unknown-fields"):
            return []
        properties: dict[str, Schema] = schema.get("properties", {})
        additional = schema.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                problems += schema_problems(item, properties[key], f"{path}.{key}")
            elif isinstance(additional, dict):
                problems += schema_problems(item, additional, f"{path}.{key}")
            else:
                problems.append(f"{path}.{key}: not in the CRD schema (the apiserver prunes it)")
    elif isinstance(value, list):
        items = schema.get("items", {})
        for i, item in enumerate(value):
            problems += schema_problems(item, items, f"{path}[{i}]")
    return problems
