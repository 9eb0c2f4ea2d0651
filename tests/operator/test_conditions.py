"""Condition evaluation: vocabulary per phase, lastTransitionTime kept when unchanged."""

import pytest

from ckpt_api.vocabulary import ConditionType, Phase
from ckpt_rollout.domain.conditions import Verdict, evaluate_conditions, set_condition


def _status(conditions: list[dict[str, object]]) -> dict[object, object]:
    return {c["type"]: c["status"] for c in conditions}


@pytest.mark.parametrize(
    ("phase", "expected"),
    [
        (
            Phase.PROGRESSING,
            {
                "Progressing": "True",
                "Complete": "False",
                "Failed": "False",
                "Ready": "False",
                "Reconciling": "True",
                "Stalled": "False",
                "Paused": "False",
            },
        ),
        (
            Phase.PAUSED,
            {
                "Progressing": "True",
                "Paused": "True",
                "Ready": "False",
                "Reconciling": "True",
                "Stalled": "False",
                "Complete": "False",
                "Failed": "False",
            },
        ),
        (
            Phase.SUCCEEDED,
            {
                "Progressing": "False",
                "Complete": "True",
                "Failed": "False",
                "Ready": "True",
                "Reconciling": "False",
                "Stalled": "False",
                "Paused": "False",
            },
        ),
        (
            Phase.FAILED,
            {
                "Progressing": "False",
                "Complete": "False",
                "Failed": "True",
                "Ready": "False",
                "Reconciling": "False",
                "Stalled": "True",
                "Paused": "False",
            },
        ),
        (
            Phase.ROLLING_BACK,
            {
                "Progressing": "True",
                "Complete": "False",
                "Failed": "True",
                "Ready": "False",
                "Reconciling": "True",
                "Stalled": "False",
                "Paused": "False",
            },
        ),
        (
            Phase.ROLLED_BACK,
            {
                "Progressing": "False",
                "Complete": "False",
                "Failed": "True",
                "Ready": "False",
                "Reconciling": "False",
                "Stalled": "True",
                "Paused": "False",
            },
        ),
    ],
)
def test_conditions_per_phase(phase: Phase, expected: dict[str, str]) -> None:
    conds = evaluate_conditions(Verdict(phase, "Why", "msg"), [], now="t0", generation=3)
    assert _status(conds) == expected
    assert all(c["observedGeneration"] == 3 for c in conds)
    assert all(c["lastTransitionTime"] == "t0" for c in conds)


def test_transition_time_kept_when_status_unchanged_and_moved_when_it_flips() -> None:
    first = evaluate_conditions(Verdict(Phase.PROGRESSING, "A", "a"), [], now="t0", generation=1)
    second = evaluate_conditions(Verdict(Phase.PROGRESSING, "B", "b"), first, now="t1", generation=2)
    third = evaluate_conditions(Verdict(Phase.SUCCEEDED, "Done", "c"), second, now="t2", generation=2)
    by_type = {c["type"]: c for c in second}
    assert by_type["Progressing"]["lastTransitionTime"] == "t0"
    assert by_type["Progressing"]["reason"] == "B"
    assert by_type["Progressing"]["observedGeneration"] == 2
    by_type = {c["type"]: c for c in third}
    assert by_type["Complete"]["lastTransitionTime"] == "t2"
    assert by_type["Failed"]["lastTransitionTime"] == "t0"


def test_set_condition_keeps_foreign_conditions() -> None:
    foreign = {"type": "Custom", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "t"}
    out = set_condition(
        [foreign], type_="Ready", status=True, reason="R", message="", now="n", generation=None
    )
    assert foreign in out
    assert {c["type"] for c in out} == {"Custom", "Ready"}


@pytest.mark.parametrize(
    ("phase", "progressing"),
    [
        (Phase.PROGRESSING, "Why"),
        (Phase.PAUSED, "RolloutPaused"),
        (Phase.SUCCEEDED, "RolloutCompleted"),
        (Phase.ROLLING_BACK, "RollingBack"),
        (Phase.FAILED, "Why"),
    ],
)
def test_progressing_says_why_it_holds_in_paused_succeeded_and_rolling_back(
    phase: Phase, progressing: str
) -> None:
    conds = evaluate_conditions(Verdict(phase, "Why", "msg"), [], now="t0", generation=1)
    reasons = {c["type"]: c["reason"] for c in conds}
    assert reasons.pop("Progressing") == progressing
    assert set(reasons.values()) == {"Why"}


def test_a_condition_without_a_transition_time_gets_one() -> None:
    written = {"type": "Ready", "status": "False", "reason": "X", "message": ""}
    out = set_condition(
        [written], type_="Ready", status=False, reason="Y", message="m", now="n", generation=1
    )
    assert out == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Y",
            "message": "m",
            "lastTransitionTime": "n",
            "observedGeneration": 1,
        }
    ]


def test_conditions_are_listed_in_vocabulary_order_and_foreign_ones_last() -> None:
    foreign = {"type": "Custom", "status": "True", "reason": "X", "message": "", "lastTransitionTime": "t"}
    ready = {"type": "Ready", "status": "False", "reason": "X", "message": "", "lastTransitionTime": "t"}
    conds = evaluate_conditions(
        Verdict(Phase.PROGRESSING, "A", "a"), [foreign, ready], now="t0", generation=1
    )
    assert [c["type"] for c in conds] == [*ConditionType, "Custom"]
