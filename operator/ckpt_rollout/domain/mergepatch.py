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


def merge_diff(old: Any, new: Any) -> Any:
    """The merge patch that turns ``old`` into ``new`` (objects recursed, lists replaced whole);
    {} when they are equal. Only what changed is sent, so entries others wrote in between (an
    agent's status.workers push) are left alone."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        if key not in old:
            patch[key] = value
        elif old[key] != value:
            if isinstance(value, dict) and isinstance(old[key], dict):
                patch[key] = merge_diff(old[key], value)
            else:
                patch[key] = value
    return patch
