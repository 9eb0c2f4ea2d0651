"""Status evaluation: phase + progress -> conditions (metav1.Condition), pure and table-tested.

Vocabulary follows Deployment/Argo (Progressing, Complete, Failed, Paused) plus kstatus
(Ready, Reconciling, Stalled) so `kubectl wait`, Argo CD and Flux health checks all work."""

from dataclasses import dataclass
from typing import Any

from ckpt_api.status import Phase

Condition = dict[str, Any]

CONDITION_TYPES = ("Progressing", "Complete", "Failed", "Paused", "Ready", "Reconciling", "Stalled")


@dataclass(frozen=True)
class Verdict:
    phase: Phase
    reason: str
    message: str
    stalled: bool = False  # blocked by something only a user can fix (e.g. SelectorConflict)


def _table(v: Verdict) -> dict[str, tuple[bool, str]]:
    """Condition type -> (status, reason) for a verdict."""
    r = v.reason
    p = v.phase
    if v.stalled:
        return {
            "Progressing": (False, r),
            "Complete": (False, r),
            "Failed": (False, r),
            "Paused": (False, r),
            "Ready": (False, r),
            "Reconciling": (False, r),
            "Stalled": (True, r),
        }
    if p in (Phase.PENDING, Phase.PROGRESSING):
        return {
            "Progressing": (True, r),
            "Complete": (False, r),
            "Failed": (False, r),
            "Paused": (False, r),
            "Ready": (False, r),
            "Reconciling": (True, r),
            "Stalled": (False, r),
        }
    if p is Phase.PAUSED:
        return {
            "Progressing": (True, "RolloutPaused"),
            "Complete": (False, r),
            "Failed": (False, r),
            "Paused": (True, r),
            "Ready": (False, r),
            "Reconciling": (True, r),
            "Stalled": (False, r),
        }
    if p is Phase.SUCCEEDED:
        return {
            "Progressing": (False, "RolloutCompleted"),
            "Complete": (True, r),
            "Failed": (False, r),
            "Paused": (False, r),
            "Ready": (True, r),
            "Reconciling": (False, r),
            "Stalled": (False, r),
        }
    if p is Phase.ROLLING_BACK:
        return {
            "Progressing": (True, "RollingBack"),
            "Complete": (False, r),
            "Failed": (True, r),
            "Paused": (False, r),
            "Ready": (False, r),
            "Reconciling": (True, r),
            "Stalled": (False, r),
        }
    # Failed and RolledBack: the desired version is not live and won't be without a change.
    return {
        "Progressing": (False, r),
        "Complete": (False, r),
        "Failed": (True, r),
        "Paused": (False, r),
        "Ready": (False, r),
        "Reconciling": (False, r),
        "Stalled": (True, r),
    }


def set_condition(
    conditions: list[Condition],
    *,
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int | None,
) -> list[Condition]:
    """Upsert one condition; lastTransitionTime moves only when the status flips."""
    wanted = "True" if status else "False"
    out: list[Condition] = []
    found = False
    for cond in conditions:
        if cond.get("type") != type_:
            out.append(cond)
            continue
        found = True
        changed = cond.get("status") != wanted
        out.append(
            {
                "type": type_,
                "status": wanted,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now if changed else cond.get("lastTransitionTime", now),
                "observedGeneration": generation,
            }
        )
    if not found:
        out.append(
            {
                "type": type_,
                "status": wanted,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
                "observedGeneration": generation,
            }
        )
    return out


def evaluate_conditions(
    verdict: Verdict, existing: list[Condition], *, now: str, generation: int | None
) -> list[Condition]:
    conditions = list(existing)
    for type_, (status, reason) in _table(verdict).items():
        conditions = set_condition(
            conditions,
            type_=type_,
            status=status,
            reason=reason,
            message=verdict.message,
            now=now,
            generation=generation,
        )
    order = {t: i for i, t in enumerate(CONDITION_TYPES)}
    return sorted(conditions, key=lambda c: order.get(c["type"], len(order)))
