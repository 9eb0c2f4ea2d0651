"""The dashboard's pure parts: which Host headers it answers, and what one event carries."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_rollout.tools import actions
from ckpt_rollout.tools.dashboard import Board, allowed_hosts, board_view


@pytest.mark.parametrize(
    ("address", "port", "names", "hosts"),
    [
        ("127.0.0.1", 3100, (), {"127.0.0.1:3100", "localhost:3100"}),
        ("::1", 3100, (), {"[::1]:3100", "localhost:3100"}),
        ("10.1.2.3", 80, (), {"10.1.2.3:80"}),
        ("10.1.2.3", 80, ("Dash.Example",), {"10.1.2.3:80", "dash.example:80"}),
        # Every address: only the names given, and loopback's.
        (
            "0.0.0.0",
            3100,
            ("dash.internal", "10.0.0.5", "[fd00::5]"),
            {
                "dash.internal:3100",
                "10.0.0.5:3100",
                "[fd00::5]:3100",
                "localhost:3100",
                "127.0.0.1:3100",
                "[::1]:3100",
            },
        ),
    ],
)
def test_allowed_hosts(address: str, port: int, names: tuple[str, ...], hosts: set[str]) -> None:
    assert set(allowed_hosts(address, port, names)) == hosts


@pytest.mark.parametrize("address", ["0.0.0.0", "::"])
def test_every_address_without_names_is_refused(address: str) -> None:
    """Answering any Host there would let a page of another site, its name rebound to this
    machine, read the board and act as the user."""
    with pytest.raises(ValueError, match="--allowed-hosts"):
        allowed_hosts(address, 3100)


def _obj(name: str, phase: str | None, paused: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "rl", "name": name},
        "spec": {"version": "v2", "paused": paused},
        "status": {"phase": phase, "targetVersion": "v2", "currentWave": 1, "startedAt": "t0"},
    }


def test_board_view_sorts_rollouts_and_says_why_actions_are_refused() -> None:
    objects = {
        ("rl", "b"): _obj("b", "Paused"),
        ("rl", "a"): _obj("a", "RolledBack"),
        ("rl", "c"): _obj("c", "Paused", paused=True),
    }
    board = board_view(objects, "watch: connection refused")
    assert board["error"] == "watch: connection refused"
    assert [v["name"] for v in board["rollouts"]] == ["a", "b", "c"]
    refusals = {v["name"]: v["refusals"] for v in board["rollouts"]}
    assert set(refusals["a"]) == {"pause", "resume", "promote", "skip-analysis", "abort", "retry"}
    assert refusals["a"]["retry"] is None
    assert refusals["a"]["promote"] == "not paused after a wave (phase is RolledBack); nothing to promote"
    assert refusals["b"]["promote"] is None
    assert refusals["b"]["retry"] == "phase is Paused; only a Failed or RolledBack rollout is retried"
    assert (
        refusals["c"]["promote"]
        == "not paused after a wave (spec.paused is set: use resume); nothing to promote"
    )
    assert all(refusals[n][a] is None for n in "abc" for a in ("pause", "resume", "abort"))


@pytest.mark.parametrize(
    ("spec", "status", "why"),
    [
        ({"version": "v2"}, {"targetVersion": "v2", "startedAt": "t0"}, None),
        (
            {"version": "v2"},
            {"targetVersion": "v1", "startedAt": "t0"},
            "nothing to abort: the operator has not started rolling v2 out yet",
        ),
        (
            {"version": "v2"},
            {"targetVersion": "v2"},
            "nothing to abort: the operator has not started rolling v2 out yet",
        ),
        ({"versionFrom": {}}, {}, "nothing to abort: its versionFrom has not been resolved yet"),
    ],
)
def test_an_abort_waits_for_the_rollout_it_names(
    spec: dict[str, Any], status: dict[str, Any], why: str | None
) -> None:
    """An abort names its rollout by its start (status.startedAt of the version): before the
    operator started the version there is none to name."""
    assert actions.refusal("abort", {"metadata": {"name": "a"}, "spec": spec, "status": status}) == why


def _pod(name: str, app: str, node: str = "n1") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "rl", "name": name, "labels": {"app": app}},
        "spec": {"nodeName": node},
        "status": {"phase": "Running"},
    }


def test_every_pod_a_rollout_selects_is_one_of_its_workers() -> None:
    obj = _obj("a", "Progressing")
    obj["spec"]["selector"] = {"matchLabels": {"app": "w"}}
    board = Board()
    board.replace_pods({("rl", p["metadata"]["name"]): p for p in (_pod("w-0", "w"), _pod("x-0", "x"))}, None)
    workers = board_view({("rl", "a"): obj}, None, board.pods)["rollouts"][0]["workers"]
    assert [(w["pod"], w["state"], w["node"], w["message"]) for w in workers] == [
        ("w-0", "Pending", "n1", "in no wave yet")
    ]


def test_only_a_pod_change_the_board_shows_reaches_the_pages() -> None:
    board = Board()
    board.apply_pod("ADDED", _pod("w-0", "w"))
    seen = board.generation
    board.apply_pod("MODIFIED", _pod("w-0", "w"))  # e.g. a condition changed
    assert board.generation == seen
    board.apply_pod("MODIFIED", _pod("w-0", "w", node="n2"))
    board.apply_pod("DELETED", _pod("w-0", "w", node="n2"))
    assert (board.generation, board.pods["rl"]) == (seen + 2, {})
