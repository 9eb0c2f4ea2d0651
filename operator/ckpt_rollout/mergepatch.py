"""JSON merge patch (RFC 7386) applied locally, so the operator's view of its status matches
what the apiserver stores after the same patch."""

from typing import Any


def apply_merge_patch(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = apply_merge_patch(result.get(key), value)
    return result
