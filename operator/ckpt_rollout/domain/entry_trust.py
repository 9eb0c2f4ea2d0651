"""Which status.workers entries the operator may act on. Workers write their own entries, and
the chart's ValidatingAdmissionPolicy lets a worker write only its own pod's; where that policy
is not installed (no chart, an apiserver without admission policies), any worker could write any
entry, so the operator ignores those it cannot tie to a pod of its rollout:

- a key that is neither a pod the CR selects now nor a member of one of its waves (one that
  left a wave, replaced, included) or of its rollback (a member that went away keeps its entry:
  what it reported before it left counts);
- an entry whose podUID (the agent writes its pod's) is not the live pod's: it was written by
  an earlier pod of that name.

Entries without a podUID (the operator's own, an older agent's) are tied by their key alone.
Ignored entries stay in the CR untouched (the operator's writes are diffs of what it read). Pure.
"""

from collections.abc import Mapping

from ckpt_api.status import CheckpointRolloutStatus


def untrusted_entries(status: CheckpointRolloutStatus, live_uids: Mapping[str, str]) -> dict[str, str]:
    """Entries to ignore, each with why. ``live_uids``: the selected pods, by name, with their
    UIDs ("" where unknown)."""
    members = {p for w in status.waves for p in [*w.pods, *w.replaced]}
    if status.rollback is not None:
        members.update(status.rollback.pods)
    ignored: dict[str, str] = {}
    for name, entry in status.workers.items():
        if name not in live_uids:
            if name not in members:
                ignored[name] = "not a pod this rollout selects or called"
            continue
        live = live_uids[name]
        if entry.pod_uid and live and entry.pod_uid != live:
            ignored[name] = f"written by pod UID {entry.pod_uid}, not the live pod's {live}"
    return ignored


def trusted_status(status: CheckpointRolloutStatus, ignored: Mapping[str, str]) -> CheckpointRolloutStatus:
    """``status`` without the ignored entries."""
    if not ignored:
        return status
    workers = {n: e for n, e in status.workers.items() if n not in ignored}
    return status.model_copy(update={"workers": workers})
