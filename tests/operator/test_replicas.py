"""form_replicas: which selected pods make one replica, which replicas are whole. One row per
situation."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from ckpt_api.spec import LWS_GROUP_KEY_LABEL, LWS_WORKER_INDEX_LABEL, ReplicaGroups
from ckpt_rollout.domain.replicas import form_replicas
from ckpt_rollout.domain.world import Pod


def lws_pod(name: str, group: str | None, index: str | None, size: int | None = 2) -> Pod:
    labels = {"app": "w"}
    if group is not None:
        labels[LWS_GROUP_KEY_LABEL] = group
    if index is not None:
        labels[LWS_WORKER_INDEX_LABEL] = index
    return Pod(name, "10.0.0.1", labels, group_size=size)


@dataclass(frozen=True)
class Row:
    id: str
    pods: list[Pod]
    groups: ReplicaGroups | None
    leaders: list[str]
    followers: dict[str, tuple[str, ...]]
    incomplete: dict[str, str]


LWS = ReplicaGroups()
ROWS = [
    Row(
        "no-groups-every-pod-is-a-unit",
        [lws_pod("a", None, None), lws_pod("b", "g", "0")],
        None,
        ["a", "b"],
        {},
        {},
    ),
    Row(
        "lws-two-whole-replicas",
        [
            lws_pod("g0-0", "k0", "0"),
            lws_pod("g0-1", "k0", "1"),
            lws_pod("g1-0", "k1", "0"),
            lws_pod("g1-1", "k1", "1"),
        ],
        LWS,
        ["g0-0", "g1-0"],
        {"g0-0": ("g0-1",), "g1-0": ("g1-1",)},
        {},
    ),
    Row(
        "a-member-not-running-leaves-its-replica-out",
        [lws_pod("g0-0", "k0", "0"), lws_pod("g0-1", "k0", "1"), lws_pod("g1-0", "k1", "0")],
        LWS,
        ["g0-0"],
        {"g0-0": ("g0-1",)},
        {"k1": "1 of 2 pods are running"},
    ),
    Row(
        "no-leader",
        [lws_pod("g0-1", "k0", "1"), lws_pod("g0-2", "k0", "2")],
        ReplicaGroups(size=2),
        [],
        {},
        {"k0": "needs one leader (leaderworkerset.sigs.k8s.io/worker-index=0), has none"},
    ),
    Row(
        "two-leaders",
        [lws_pod("a", "k0", "0"), lws_pod("b", "k0", "0")],
        LWS,
        [],
        {},
        {"k0": "needs one leader (leaderworkerset.sigs.k8s.io/worker-index=0), has a, b"},
    ),
    Row(
        "more-pods-than-its-size",
        [lws_pod("a", "k0", "0"), lws_pod("b", "k0", "1"), lws_pod("c", "k0", "2")],
        LWS,
        [],
        {},
        {"k0": "3 pods carry its label, more than its size 2"},
    ),
    Row(
        "spec-size-wins-over-the-annotation",
        [lws_pod("a", "k0", "0", size=None), lws_pod("b", "k0", "1", size=None)],
        ReplicaGroups(size=3),
        [],
        {},
        {"k0": "2 of 3 pods are running"},
    ),
    Row(
        "annotations-that-disagree-take-the-larger",
        [lws_pod("a", "k0", "0", size=2), lws_pod("b", "k0", "1", size=3)],
        LWS,
        [],
        {},
        {"k0": "2 of 3 pods are running"},
    ),
    Row(
        "no-size-known-takes-the-running-pods",
        [
            lws_pod("a", "k0", "0", size=None),
            lws_pod("c", "k0", "2", size=None),
            lws_pod("b", "k0", "1", size=None),
        ],
        LWS,
        ["a"],
        {"a": ("b", "c")},
        {},
    ),
    Row(
        "a-pod-without-the-group-label-is-no-unit",
        [lws_pod("a", "k0", "0", size=1), lws_pod("loose", None, "0")],
        LWS,
        ["a"],
        {"a": ()},
        {},
    ),
    Row(
        "own-labels",
        [
            Pod("x", "10.0.0.1", {"replica": "r1", "role": "head"}),
            Pod("y", "10.0.0.2", {"replica": "r1", "role": "worker"}),
        ],
        ReplicaGroups(group_label="replica", leader_label="role", leader_value="head", size=2),
        ["x"],
        {"x": ("y",)},
        {},
    ),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_form_replicas(row: Row) -> None:
    replicas = form_replicas({p.name: p for p in row.pods}, row.groups)
    assert sorted(replicas.leaders) == row.leaders
    assert dict(replicas.followers) == row.followers
    assert dict(replicas.incomplete) == row.incomplete
    for leader in row.leaders:
        assert replicas.members(leader) == (leader, *row.followers.get(leader, ()))
