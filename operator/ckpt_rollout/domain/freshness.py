"""Which copy of a CheckpointRollout is the newest: kopf's live body or what our own last status
patch returned.

The daemon works from kopf's live body (updated by the watch) instead of a GET per step. Right
after our own patch the watch may not have delivered it yet, and acting on the older copy could
re-call pods whose call the patch recorded; so each step takes whichever copy has the newer
resourceVersion. Kubernetes calls resourceVersions opaque; on etcd (every apiserver we support)
they are the store's revision, an integer that only grows. If either is not an integer the
caller must GET instead of guessing.
"""

from collections.abc import Mapping
from typing import Any


def resource_version(obj: Mapping[str, Any] | None) -> int | None:
    if not obj:
        return None
    value = (obj.get("metadata") or {}).get("resourceVersion")
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def freshest(live: Mapping[str, Any], written: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The newer of the two, or None when they cannot be ordered (then GET)."""
    live_rv = resource_version(live)
    if written is None:
        return live if live_rv is not None else None
    written_rv = resource_version(written)
    if live_rv is None or written_rv is None:
        return None
    return live if live_rv >= written_rv else written
