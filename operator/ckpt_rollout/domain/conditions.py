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


_C = ConditionType
# Which condition types are True in each phase (every other type is False).
_TRUE: dict[Phase, frozenset[ConditionType]] = {
    Phase.PENDING: frozenset({_C.PROGRESSING, _C.RECONCILING}),
    Phase.PROGRESSING: frozenset({_C.PROGRESSING, _C.RECONCILING}),
    Phase.PAUSED: frozenset({_C.PROGRESSING, _C.PAUSED, _C.RECONCILING}),
    Phase.SUCCEEDED: frozenset({_C.COMPLETE, _C.READY}),
    Phase.ROLLING_BACK: frozenset({_C.PROGRESSING, _C.FAILED, _C.RECONCILING}),
    # Failed and RolledBack: the desired version is not live and won't be without a change.
    Phase.FAILED: frozenset({_C.FAILED, _C.STALLED}),
    Phase.ROLLED_BACK: frozenset({_C.FAILED, _C.STALLED}),
}
# Progressing says why it is what it is in these phases, whatever the verdict's own reason.
_PROGRESSING_REASON: dict[Phase, RolloutReason] = {
    Phase.PAUSED: RolloutReason.ROLLOUT_PAUSED,
    Phase.SUCCEEDED: RolloutReason.ROLLOUT_COMPLETED,
    Phase.ROLLING_BACK: RolloutReason.ROLLING_BACK,
}


def _table(v: Verdict) -> dict[ConditionType, tuple[bool, str]]:
    """Condition type -> (status, reason) for a verdict."""
    if v.stalled:  # blocked whatever the phase: only Stalled holds
        return {t: (t is _C.STALLED, v.reason) for t in ConditionType}
    table = {t: (t in _TRUE[v.phase], v.reason) for t in ConditionType}
    if (reason := _PROGRESSING_REASON.get(v.phase)) is not None:
        table[_C.PROGRESSING] = (table[_C.PROGRESSING][0], reason)
    return table


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
            _condition(
                type_,
                wanted,
                reason,
                message,
                now if changed else cond.get("lastTransitionTime", now),
                generation,
            )
        )
    if not found:
        out.append(_condition(type_, wanted, reason, message, now, generation))
    return out


def _condition(
    type_: str, status: str, reason: str, message: str, transition: str, generation: int | None
) -> Condition:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
        "observedGeneration": generation,
    }


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
