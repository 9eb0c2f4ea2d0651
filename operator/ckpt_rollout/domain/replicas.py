"""Which selected pods form one replica, when a rollout says replicas span pods
(`spec.replicaGroups`, e.g. a LeaderWorkerSet). Pure; table-tested.

A rollout's unit is then the replica, named by its leader pod: waves, the failure budget and the
status counters count leaders of whole replicas. A replica is whole when its leader and as many
Running pods as its size say are selected; until then it is not switched (a missing member
could not load what its leader's engine would ask of it)."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from ckpt_api.spec import ReplicaGroups
from ckpt_rollout.domain.world import Pod


@dataclass(frozen=True)
class Replicas:
    """The units of a rollout: ``leaders`` (each a whole replica's leader pod, or every pod when
    the rollout has no replica groups), each leader's ``followers`` (its other pods, sorted), and
    why each replica that is not whole is left out (its group label value -> why)."""

    leaders: Mapping[str, Pod]
    followers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    incomplete: Mapping[str, str] = field(default_factory=dict)

    def members(self, leader: str) -> tuple[str, ...]:
        """Every pod of ``leader``'s replica, the leader first."""
        return (leader, *self.followers.get(leader, ()))

    @cached_property
    def follower_names(self) -> frozenset[str]:
        return frozenset(f for names in self.followers.values() for f in names)


def form_replicas(pods: Mapping[str, Pod], groups: ReplicaGroups | None) -> Replicas:
    if groups is None:
        return Replicas(leaders=pods)
    by_key: dict[str, list[Pod]] = {}
    for pod in pods.values():
        key = pod.labels.get(groups.group_label)
        if key is not None:
            by_key.setdefault(key, []).append(pod)
    leaders: dict[str, Pod] = {}
    followers: dict[str, tuple[str, ...]] = {}
    incomplete: dict[str, str] = {}
    for key, members in sorted(by_key.items()):
        heads = [p for p in members if p.labels.get(groups.leader_label) == groups.leader_value]
        size = groups.size or _annotated_size(members)
        if len(heads) != 1:
            found = ", ".join(sorted(p.name for p in heads)) or "none"
            incomplete[key] = f"needs one leader ({groups.leader_label}={groups.leader_value}), has {found}"
            continue
        if size is not None and len(members) < size:
            incomplete[key] = f"{len(members)} of {size} pods are running"
            continue
        if size is not None and len(members) > size:
            incomplete[key] = f"{len(members)} pods carry its label, more than its size {size}"
            continue
        leader = heads[0]
        leaders[leader.name] = leader
        followers[leader.name] = tuple(sorted(p.name for p in members if p is not leader))
    return Replicas(leaders=leaders, followers=followers, incomplete=incomplete)


def _annotated_size(members: list[Pod]) -> int | None:
    """The size LeaderWorkerSet annotates the group's pods with (the largest, should they
    disagree mid-update: a replica is never taken for whole with fewer pods than any says)."""
    sizes = [p.group_size for p in members if p.group_size is not None]
    return max(sizes) if sizes else None
