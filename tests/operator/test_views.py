"""`status` and `watch` views of a rollout."""

from typing import Any

import pytest

from ckpt_rollout.tools.views import progress_line, status_table, watch_exit_code
from ckpt_rollout.tools.watchtable import rollout_view


def _obj(phase: str | None, target: str = "v2", updated: int = 3, replicas: int = 5) -> dict[str, Any]:
    return {
        "metadata": {"name": "fleet", "namespace": "ns"},
        "spec": {"version": "v2"},
        "status": {
            "phase": phase,
            "targetVersion": target,
            "replicas": replicas,
            "updatedReplicas": updated,
            "waveProgress": "2/3",
            "waves": [
                {"index": 0, "pods": ["a"], "called": ["a"], "updated": 1, "phase": "Completed"},
                {"index": 1, "pods": ["b", "c"], "called": ["b"], "phase": "Running"},
            ],
            "workers": {
                "b": {
                    "version": "v2",
                    "phase": "Failed",
                    "reason": "ChecksumMismatch",
                    "message": "tensor x",
                    "seconds": 1.5,
                }
            },
        },
    }


@pytest.mark.parametrize(
    ("phase", "target", "expected"),
    [
        ("Succeeded", "v2", 0),
        ("Failed", "v2", 1),
        ("RolledBack", "v2", 1),
        ("Progressing", "v2", None),
        ("Succeeded", "v1", None),
    ],  # an old rollout's success says nothing about v2
)
def test_watch_exit_code(phase: str, target: str, expected: int | None) -> None:
    assert watch_exit_code(_obj(phase, target)) == expected


def test_progress_line_shows_bar_counts_and_wave() -> None:
    line = progress_line(_obj("Progressing"), width=10)
    assert "[######....] 3/5 updated" in line
    assert "wave 2/3" in line
    assert line.startswith("v2 ")


def test_status_table_lists_waves_and_failed_workers() -> None:
    text = status_table(_obj("Progressing"))
    assert "ns/fleet" in text
    wave_rows = [line.split() for line in text.splitlines() if line.startswith(("1 ", "2 "))]
    assert wave_rows[0][:7] == ["1", "1", "1", "1", "0", "0", "Completed"]
    assert wave_rows[1][:7] == ["2", "2", "1", "0", "0", "0", "Running"]
    assert any(line.startswith("b ") and "ChecksumMismatch" in line for line in text.splitlines())


def test_progress_line_ignores_counters_of_an_older_target() -> None:
    line = progress_line(_obj("Succeeded", target="v1", updated=5), width=10)
    assert "0/5 updated" in line
    assert "Pending" in line


@pytest.mark.parametrize(
    ("waves", "line"),
    [
        ([{"index": 0}], None),  # no wave recorded it (an older operator, or nothing updated yet)
        (
            [
                {"index": 0, "bytesFromSource": 1_500_000, "bytesFromPeers": 0},
                {"index": 1, "bytesFromSource": 0, "bytesFromPeers": 6_000_000},
                {"index": 2},
            ],
            "Pulled:     1.5 MB from source, 6.0 MB from peers (updated workers)",
        ),
    ],
)
def test_status_says_where_the_bytes_came_from(waves: list[dict[str, Any]], line: str | None) -> None:
    obj = _obj("Progressing")
    obj["status"]["waves"] = waves
    pulled = [row for row in status_table(obj).splitlines() if row.startswith("Pulled:")]
    assert pulled == ([] if line is None else [line])


def test_wide_adds_the_source_the_relay_each_waves_bytes_and_a_row_per_worker_with_its_node() -> None:
    obj = _obj("Progressing")
    obj["spec"].update(source={"uri": "http://src/ckpt"}, strategy={"peerRelay": True, "relayFanout": 2})
    obj["status"]["waves"][0].update(bytesFromSource=3_000_000, bytesFromPeers=0)
    pods = {"a": {"node": "n1"}, "b": {"node": "n1"}, "c": {"node": "n2"}, "d": {"node": "n2"}}
    plain = status_table(obj)
    wide = status_table(obj, wide=True, workers=rollout_view(obj, pods)["workers"])
    assert "Source:" not in plain
    assert "NODE" not in plain
    assert "Source:     http://src/ckpt  (manifest not pinned)" in wide
    assert "Relay:      peers on, fanout 2" in wide
    wave_head = next(line for line in wide.splitlines() if line.startswith("WAVE"))
    assert wave_head.endswith("ANALYSIS  FROM SOURCE  FROM PEERS")
    assert next(line for line in wide.splitlines() if line.startswith("1 ")).endswith("3.0 MB       0 B")
    rows = {
        line.split()[0]: line.split() for line in wide.splitlines() if line[:2] in ("a ", "b ", "c ", "d ")
    }
    # The canary's success was folded into its wave; c is called next; d is in no wave yet.
    assert rows["a"][:4] == ["a", "1", "Updated", "v2"]
    assert " ".join(rows["a"]).endswith("n1 figures folded into wave 1")
    assert rows["b"][:3] == ["b", "2", "Failed"]
    assert rows["c"][:3] == ["c", "2", "Pending"]
    assert rows["d"][:3] == ["d", "-", "Pending"]
    assert " ".join(rows["d"]).endswith("n2 in no wave yet")
