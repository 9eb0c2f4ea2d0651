"""A wave's analysis as `status`, `watch` (table and change lines) and the dashboard's model show
it: the Analyzing phase, how far the analysis got, its last measurement; and the refusal of
`promote --skip-analysis` (and the dashboard's button) when no analysis runs."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_rollout.tools.actions import refusal
from ckpt_rollout.tools.views import analysis_cell, status_table
from ckpt_rollout.tools.watchtable import change_lines, render_table, rollout_view

ANALYSIS_SPEC = {"intervalSeconds": 10, "durationSeconds": 60, "queries": []}
RUNNING = {
    "phase": "Running",
    "startedAt": "2027-01-15T08:00:00Z",
    "measurements": 2,
    "failedMeasurements": 1,
    "message": "query errors returned 0.9, which misses result < 0.5",
    "results": [
        {
            "name": "errors",
            "value": 0.9,
            "passed": False,
            "message": "returned 0.9, which misses result < 0.5",
        },
        {"name": "up", "value": 1.0, "passed": True, "message": "returned 1, which meets result == 1"},
    ],
}


def _obj(analysis: dict[str, Any] | None, *, phase: str = "Analyzing", target: str = "v2") -> dict[str, Any]:
    wave: dict[str, Any] = {"index": 0, "specIndex": 0, "pods": ["a"], "called": ["a"], "phase": phase}
    if analysis is not None:
        wave["analysis"] = analysis
    return {
        "metadata": {"name": "fleet", "namespace": "rl"},
        "spec": {"version": "v2", "strategy": {"analysis": ANALYSIS_SPEC}},
        "status": {
            "phase": "Progressing",
            "targetVersion": target,
            "waves": [wave],
            "workers": {"a": {"version": "v2", "phase": "Updated"}},
        },
    }


@pytest.mark.parametrize(
    ("analysis", "spec", "cell"),
    [
        (None, ANALYSIS_SPEC, None),
        (RUNNING, ANALYSIS_SPEC, "Running 2/6 (1 failed)"),
        (
            {"phase": "Passed", "measurements": 3},
            {"intervalSeconds": 1, "durationSeconds": 3},
            "Passed 3/3 (0 failed)",
        ),
        ({"phase": "Running"}, {"intervalSeconds": 10, "durationSeconds": 0}, "Running 0/1 (0 failed)"),
        # The analysis was removed from the spec since: the count needed is no longer known.
        ({"phase": "Skipped", "measurements": 1}, None, "Skipped 1 (0 failed)"),
    ],
)
def test_analysis_cell(
    analysis: dict[str, Any] | None, spec: dict[str, Any] | None, cell: str | None
) -> None:
    wave = {"analysis": analysis} if analysis else {}
    assert analysis_cell(wave, {"strategy": {"analysis": spec}} if spec else {}) == cell


def test_status_shows_the_analyzing_wave_and_its_last_measurement() -> None:
    lines = status_table(_obj(RUNNING)).splitlines()
    (wave_row,) = [line for line in lines if line.startswith("1 ")]
    assert "Analyzing" in wave_row.split()
    assert wave_row.endswith("Running 2/6 (1 failed)")
    assert (
        "Analysis:   wave 1: Running 2/6 (1 failed), query errors returned 0.9, which misses result < 0.5"
        in lines
    )
    rows = {line.split()[0]: line.split()[1:3] for line in lines if line.startswith(("errors ", "up "))}
    assert rows == {"errors": ["0.9", "False"], "up": ["1.0", "True"]}


def test_status_without_an_analysis_shows_none() -> None:
    text = status_table(_obj(None, phase="Running"))
    assert "Analysis:" not in text
    (wave_row,) = [line for line in text.splitlines() if line.startswith("1 ")]
    assert wave_row.split()[-1] == "-"


def test_watch_table_and_change_lines_follow_the_analysis() -> None:
    first = rollout_view(_obj({**RUNNING, "measurements": 1, "failedMeasurements": 0}))
    table = render_table(first)
    (wave_row,) = [line for line in table.splitlines() if line.startswith("1 ")]
    assert wave_row.split()[2] == "Analyzing"
    assert "Running 1/6 (0 failed)" in wave_row
    assert wave_row.split()[-1] == "a=Updated"
    assert change_lines(None, first)[1:3] == [
        "wave 1: Analyzing (1 pod: a)",
        "wave 1 analysis: Running 1/6 (0 failed)",
    ]
    second = rollout_view(_obj(RUNNING))
    assert change_lines(first, second) == ["wave 1 analysis: Running 2/6 (1 failed)"]
    assert change_lines(second, second) == []


@pytest.mark.parametrize(
    ("obj", "refused"),
    [
        (_obj(RUNNING), None),
        (_obj({"phase": "Passed"}, phase="Completed"), "no wave is being analyzed; nothing to skip"),
        # spec.version moved on from the version whose wave is Analyzing: that one is over.
        (_obj(RUNNING, target="v1"), "no wave is being analyzed; nothing to skip"),
    ],
)
def test_skip_analysis_is_refused_unless_an_analysis_runs(obj: dict[str, Any], refused: str | None) -> None:
    assert refusal("skip-analysis", obj) == refused


def test_promote_is_refused_during_an_analysis() -> None:
    assert (
        refusal("promote", _obj(RUNNING))
        == "not paused after a wave (phase is Progressing); nothing to promote"
    )
