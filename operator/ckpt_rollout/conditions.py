"""Status evaluation: phase + progress -> conditions (metav1.Condition), pure and table-tested.

The condition types (ckpt_api.vocabulary.ConditionType) follow Deployment/Argo plus kstatus, so
`kubectl wait`, Argo CD and Flux health checks all work."""

from dataclasses import dataclass
from typing import Any

from ckpt_api.vocabulary import ConditionStatus, ConditionType, Phase, RolloutReason

Condition = dict[str, Any]


@dataclass(frozen=True)
class Verdict:
    phase: Phase
    reason: str
    message: str
    stalled: bool = False  # blocked by something only a user can fix (e.g. SelectorConflict)


def _table(v: Verdict) -> dict[ConditionType, tuple[bool, str]]:
    """Condition type -> (status, reason) for a verdict."""
    r = v.reason
    p = v.phase
    if v.stalled:
        return {
            ConditionType.PROGRESSING: (False, r),
            ConditionType.COMPLETE: (False, r),
            ConditionType.FAILED: (False, r),
            ConditionType.PAUSED: (False, r),
            ConditionType.READY: (False, r),
            ConditionType.RECONCILING: (False, r),
            ConditionType.STALLED: (True, r),
        }
    if p in (Phase.PENDING, Phase.PROGRESSING):
        return {
            ConditionType.PROGRESSING: (True, r),
            ConditionType.COMPLETE: (False, r),
            ConditionType.FAILED: (False, r),
            ConditionType.PAUSED: (False, r),
            ConditionType.READY: (False, r),
            ConditionType.RECONCILING: (True, r),
            ConditionType.STALLED: (False, r),
        }
    if p is Phase.PAUSED:
        return {
            ConditionType.PROGRESSING: (True, RolloutReason.ROLLOUT_PAUSED),
            ConditionType.COMPLETE: (False, r),
            ConditionType.FAILED: (False, r),
            ConditionType.PAUSED: (True, r),
            ConditionType.READY: (False, r),
            ConditionType.RECONCILING: (True, r),
            ConditionType.STALLED: (False, r),
        }
    if p is Phase.SUCCEEDED:
        return {
            ConditionType.PROGRESSING: (False, RolloutReason.ROLLOUT_COMPLETED),
            ConditionType.COMPLETE: (True, r),
            ConditionType.FAILED: (False, r),
            ConditionType.PAUSED: (False, r),
            ConditionType.READY: (True, r),
            ConditionType.RECONCILING: (False, r),
            ConditionType.STALLED: (False, r),
        }
    if p is Phase.ROLLING_BACK:
        return {
            ConditionType.PROGRESSING: (True, RolloutReason.ROLLING_BACK),
            ConditionType.COMPLETE: (False, r),
            ConditionType.FAILED: (True, r),
            ConditionType.PAUSED: (False, r),
            ConditionType.READY: (False, r),
            ConditionType.RECONCILING: (True, r),
            ConditionType.STALLED: (False, r),
        }
    # Failed and RolledBack: the desired version is not live and won't be without a change.
    return {
        ConditionType.PROGRESSING: (False, r),
        ConditionType.COMPLETE: (False, r),
        ConditionType.FAILED: (True, r),
        ConditionType.PAUSED: (False, r),
        ConditionType.READY: (False, r),
        ConditionType.RECONCILING: (False, r),
        ConditionType.STALLED: (True, r),
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
    wanted = ConditionStatus.TRUE if status else ConditionStatus.FALSE
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
    order: dict[str, int] = {t: i for i, t in enumerate(ConditionType)}
    return sorted(conditions, key=lambda c: order.get(c["type"], len(order)))
