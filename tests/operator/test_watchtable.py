"""The live view of a rollout (watch's table and change lines, the dashboard's model), from CRs."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_rollout.tools.views import human_bytes
from ckpt_rollout.tools.watchtable import change_lines, render_table, rollout_view


def _obj(
    *,
    target: str = "v2",
    waves: list[dict[str, Any]] | None = None,
    workers: dict[str, Any] | None = None,
    phase: str = "Progressing",
    paused: bool = False,
) -> dict[str, Any]:
    return {
        "metadata": {"name": "fleet", "namespace": "rl"},
        "spec": {"version": "v2", "paused": paused},
        "status": {
            "phase": phase,
            "targetVersion": target,
            "stableVersion": "v1",
            "previousVersion": "v0",
            "replicas": 3,
            "updatedReplicas": 1,
            "waveProgress": "1/2",
            "waves": waves or [],
            "workers": workers or {},
        },
    }


CANARY_DONE = {"index": 0, "pods": ["a"], "called": ["a"], "updated": 1, "phase": "Completed"}
SECOND = {"index": 1, "pods": ["b", "c"], "called": ["b"], "phase": "Running"}
LOADED_B = {"version": "v2", "phase": "Updated", "bytes": 4_000_000, "seconds": 2.0}


@pytest.mark.parametrize(
    ("waves", "workers", "states"),
    [
        # Successes folded into a completed wave's counters: the member is Updated.
        ([CANARY_DONE], {}, {"a": "Updated"}),
        # Called, no report yet: Loading; not called: Pending.
        ([SECOND], {}, {"b": "Loading", "c": "Pending"}),
        # The worker's own entry for the target wins.
        ([SECOND], {"b": LOADED_B}, {"b": "Updated", "c": "Pending"}),
        ([SECOND], {"b": {"version": "v2", "phase": "Failed"}}, {"b": "Failed", "c": "Pending"}),
        # An entry of an older version says nothing about this one.
        ([SECOND], {"b": {"version": "v1", "phase": "Failed"}}, {"b": "Loading", "c": "Pending"}),
        # A running wave's called member without an entry is still loading, even in a wave that
        # later failed: only a completed wave folds successes.
        ([{**SECOND, "phase": "Failed"}], {}, {"b": "Loading", "c": "Pending"}),
        # Replica groups: the wave's members are leaders; followers it called (to stage) are
        # shown with it, a leader waiting for them Pending.
        (
            [{"index": 0, "pods": ["r0-0"], "called": ["r0-1"], "phase": "Running"}],
            {"r0-1": {"version": "v2", "phase": "Loading"}},
            {"r0-0": "Pending", "r0-1": "Loading"},
        ),
        (
            [{**CANARY_DONE, "pods": ["r0-0"], "called": ["r0-1", "r0-0"]}],
            {},
            {"r0-0": "Updated", "r0-1": "Updated"},
        ),
    ],
)
def test_member_states(waves: list[dict[str, Any]], workers: dict[str, Any], states: dict[str, str]) -> None:
    view = rollout_view(_obj(waves=waves, workers=workers))
    members = {m["pod"]: m["state"] for w in view["waves"] for m in w["members"]}
    assert members == states
    assert {w["pod"]: w["state"] for w in view["workers"]} == states


def test_worker_rate_and_wave_numbers() -> None:
    view = rollout_view(_obj(waves=[CANARY_DONE, SECOND], workers={"b": LOADED_B}))
    assert [w["wave"] for w in view["waves"]] == [1, 2]
    b = next(w for w in view["workers"] if w["pod"] == "b")
    assert (b["wave"], b["bytes"], b["rate"]) == (2, 4_000_000, 2_000_000.0)
    a = next(w for w in view["workers"] if w["pod"] == "a")
    assert (a["version"], a["rate"]) == ("v2", None), "folded into its wave: the target, no bytes"
    c = next(w for w in view["workers"] if w["pod"] == "c")
    assert c["version"] is None


def test_a_worker_outside_every_wave_keeps_its_entry() -> None:
    view = rollout_view(_obj(workers={"z": {"version": "v1", "phase": "Failed", "wave": 2, "reason": "X"}}))
    (z,) = view["workers"]
    assert (z["pod"], z["state"], z["wave"], z["reason"]) == ("z", "Failed", 3, "X")


def test_an_older_targets_status_is_not_shown_as_this_ones() -> None:
    view = rollout_view(_obj(target="v1", waves=[CANARY_DONE], workers={"b": LOADED_B}))
    assert (view["phase"], view["waves"], view["workers"], view["updated"]) == ("Pending", [], [], 0)
    assert (view["stableVersion"], view["replicas"]) == ("v1", 3)


@pytest.mark.parametrize(
    ("size", "text"),
    [(None, "-"), (0, "0 B"), (999, "999 B"), (1000, "1.0 kB"), (4_500_000, "4.5 MB"), (2e12, "2.0 TB")],
)
def test_human_bytes(size: float | None, text: str) -> None:
    assert human_bytes(size) == text


def test_table_has_a_row_per_wave_and_worker() -> None:
    text = render_table(rollout_view(_obj(waves=[CANARY_DONE, SECOND], workers={"b": LOADED_B}, paused=True)))
    lines = text.splitlines()
    assert lines[0] == "rl/fleet v2: Progressing (spec.paused), 1/3 updated, 0 failed, waves 1/2"
    wave_rows = [line.split() for line in lines if line[:1].isdigit()]
    assert [row[:3] for row in wave_rows] == [["1", "-", "Completed"], ["2", "-", "Running"]]
    assert wave_rows[1][-2:] == ["b=Updated", "c=Pending"]
    worker_rows = {line.split()[0]: line.split() for line in lines if line[:1] in "abc" and " " in line}
    assert worker_rows["b"][:5] == ["b", "2", "Updated", "v2", "4.0"]
    assert "2.0 MB/s" in " ".join(worker_rows["b"])
    assert worker_rows["c"][:4] == ["c", "2", "Pending", "-"]


def test_change_lines_name_only_what_changed() -> None:
    first = rollout_view(_obj(waves=[CANARY_DONE]))
    assert change_lines(None, first) == [
        "rl/fleet v2: Progressing, 1/3 updated, 0 failed, waves 1/2",
        "wave 1: Completed (1 pod: a)",
        "worker a: Updated v2",
    ]
    assert change_lines(first, first) == []
    second = rollout_view(_obj(waves=[CANARY_DONE, SECOND], workers={"b": LOADED_B}))
    assert change_lines(first, second) == [
        "wave 2: Running (2 pods: b, c)",
        "worker b: Updated v2, 4.0 MB in 2.00s (2.0 MB/s)",
        "worker c: Pending",
    ]
    failed = rollout_view(
        _obj(
            waves=[CANARY_DONE, SECOND],
            workers={"b": {"version": "v2", "phase": "Failed", "reason": "Mismatch", "message": "t0"}},
            phase="RollingBack",
        )
    )
    assert change_lines(second, failed) == [
        "rl/fleet v2: RollingBack, 1/3 updated, 0 failed, waves 1/2",
        "worker b: Failed v2: Mismatch: t0",
    ]


def test_every_selected_pod_is_a_worker_and_a_completed_wave_says_what_it_folded() -> None:
    done = {**CANARY_DONE, "bytesFromSource": 4_000_000, "bytesFromPeers": 1_000_000}
    view = rollout_view(_obj(waves=[done, SECOND]), {"a": {"node": "n1"}, "d": {"node": "n2"}})
    workers = {w["pod"]: (w["wave"], w["state"], w["node"], w["message"]) for w in view["workers"]}
    assert workers == {
        "a": (1, "Updated", "n1", "figures folded into wave 1"),
        "b": (2, "Loading", None, None),
        "c": (2, "Pending", None, None),
        "d": (None, "Pending", "n2", "in no wave yet"),
    }
    assert [w["summary"] for w in view["waves"]] == [
        "1 updated, 0 failed, 0 gone; folded: 4.0 MB from source, 1.0 MB from peers",
        None,
    ]


def test_a_wave_of_no_pod_lists_none() -> None:
    empty = {"index": 1, "pods": [], "called": [], "phase": "Completed"}
    assert change_lines(None, rollout_view(_obj(waves=[empty])))[1] == "wave 2: Completed (0 pods)"


def test_a_stalled_worker_says_what_holds_it_up() -> None:
    stalled = {"version": "v2", "phase": "Pending", "reason": "AuthUnavailable", "message": "cannot check"}
    view = rollout_view(_obj(waves=[SECOND], workers={"b": stalled}))
    assert "worker b: Pending v2: AuthUnavailable: cannot check" in change_lines(None, view)
    row = next(line for line in render_table(view).splitlines() if line.startswith("b "))
    assert row.endswith("AuthUnavailable: cannot check")


def test_a_new_message_is_a_line() -> None:
    """Piped, `watch` says what holds the rollout up, a pod that cannot start included."""
    said = "no Running pod with an IP matches the selector; waiting on w-0: ImagePullBackOff: ..."
    before = rollout_view(_obj())
    obj = _obj()
    obj["status"]["message"] = said
    after = rollout_view(obj)
    assert change_lines(before, after) == [f"message: {said}"]
    assert change_lines(after, after) == []


def test_a_member_that_left_before_loading_is_shown_replaced() -> None:
    running = rollout_view(_obj(waves=[{**CANARY_DONE, "phase": "Running", "updated": 0}]))
    swapped = {
        **CANARY_DONE,
        "pods": ["d"],
        "called": ["d"],
        "phase": "Running",
        "updated": 0,
        "replaced": ["a"],
    }
    after = rollout_view(_obj(waves=[swapped]))
    assert after["waves"][0]["replaced"] == ["a"]
    assert "d=Loading (replaced: a)" in render_table(after)
    assert "wave 1: replaced a (left before loading)" in change_lines(running, after)
    assert not [line for line in change_lines(after, after) if "replaced" in line]
