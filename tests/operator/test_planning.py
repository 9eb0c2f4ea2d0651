"""Wave planner: rounding, monotone cumulative targets, deterministic membership."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt_rollout.domain.planning import (
    cumulative_targets,
    failure_budget,
    plan_wave,
    rollout_order,
    wave_target,
)


@pytest.mark.parametrize(
    ("waves", "replicas", "expected"),
    [
        ([1, "60%", "100%"], 5, [1, 3, 5]),
        ([1, "100%"], 4, [1, 4]),
        (["100%"], 7, [7]),
        ([1, "25%", "100%"], 100, [1, 25, 100]),
        ([1, "25%", "100%"], 3, [1, 1, 3]),  # 25% of 3 rounds up to 1: the wave adds nobody
        ([10, "50%"], 4, [4, 4]),  # counts clamp to the fleet
        ([5, "10%", "100%"], 20, [5, 5, 20]),  # a percent below the count never shrinks it
        ([1, 2], 10, [1, 10]),  # the last wave always covers every pod
        ([1, "100%"], 0, [0, 0]),
        (["1%", "100%"], 1000, [10, 1000]),
        (["33%", "66%", "100%"], 10, [4, 7, 10]),  # ceil
    ],
)
def test_cumulative_targets(waves: list[int | str], replicas: int, expected: list[int]) -> None:
    assert cumulative_targets(waves, replicas) == expected


@pytest.mark.parametrize(
    ("wave", "replicas", "expected"),
    [(3, 10, 3), (30, 10, 10), ("1%", 10, 1), ("50%", 3, 2), ("10%", 101, 11), ("100%", 0, 0)],
)
def test_wave_target(wave: int | str, replicas: int, expected: int) -> None:
    assert wave_target(wave, replicas) == expected


def test_rollout_order_is_deterministic_and_depends_on_the_key() -> None:
    pods = [f"w-{i}" for i in range(20)]
    assert rollout_order(pods, "a") == rollout_order(reversed(pods), "a")
    assert sorted(rollout_order(pods, "a")) == sorted(pods)
    assert rollout_order(pods, "a") != rollout_order(pods, "b")


def test_plan_waves_cover_every_pod_once() -> None:
    pods = [f"w-{i}" for i in range(5)]
    waves: list[int | str] = [1, "60%", "100%"]
    assigned: list[str] = []
    sizes = []
    for index in range(len(waves)):
        members = plan_wave(index=index, waves=waves, eligible=pods, assigned=assigned, key="k")
        assert not set(members) & set(assigned)
        sizes.append(len(members))
        assigned += members
    assert sizes == [1, 2, 2]
    assert sorted(assigned) == sorted(pods)


def test_vanished_pod_is_replaced_in_the_next_wave() -> None:
    pods = [f"w-{i}" for i in range(5)]
    waves: list[int | str] = [1, "60%", "100%"]
    canary = plan_wave(index=0, waves=waves, eligible=pods, assigned=[], key="k")
    remaining = [p for p in pods if p not in canary]
    # The canary's pod went away; wave 2 still brings 3 of the 4 survivors to the new version.
    second = plan_wave(index=1, waves=waves, eligible=remaining, assigned=canary, key="k")
    assert len(second) == 3


def test_pods_appearing_mid_rollout_join_later_waves() -> None:
    pods = [f"w-{i}" for i in range(4)]
    waves: list[int | str] = [1, "50%", "100%"]
    first = plan_wave(index=0, waves=waves, eligible=pods, assigned=[], key="k")
    grown = [*pods, "w-4", "w-5"]
    second = plan_wave(index=1, waves=waves, eligible=grown, assigned=first, key="k")
    last = plan_wave(index=2, waves=waves, eligible=grown, assigned=first + second, key="k")
    assert sorted(first + second + last) == sorted(grown)


@pytest.mark.parametrize(
    ("budget", "replicas", "expected"),
    [(0, 5, 0), (2, 5, 2), ("0%", 5, 0), ("10%", 5, 0), ("20%", 5, 1), ("100%", 3, 3)],
)
def test_failure_budget(budget: int | str, replicas: int, expected: int) -> None:
    assert failure_budget(budget, replicas) == expected


_waves = st.lists(st.integers(1, 50), min_size=0, max_size=4, unique=True).flatmap(
    lambda counts: st.lists(st.integers(1, 100), min_size=0, max_size=4, unique=True).map(
        lambda pcts: [*sorted(counts), *(f"{p}%" for p in sorted(pcts))] or ["100%"]
    )
)


@given(waves=_waves, replicas=st.integers(0, 300))
def test_targets_are_monotone_and_end_at_the_fleet(waves: list[int | str], replicas: int) -> None:
    targets = cumulative_targets(waves, replicas)
    assert len(targets) == len(waves)
    assert targets == sorted(targets)
    assert targets[-1] == replicas
    assert all(0 <= t <= replicas for t in targets)


@given(waves=_waves, replicas=st.integers(0, 60), key=st.text(max_size=8))
def test_waves_partition_the_fleet(waves: list[int | str], replicas: int, key: str) -> None:
    pods = [f"p{i}" for i in range(replicas)]
    assigned: list[str] = []
    for index in range(len(waves)):
        members = plan_wave(index=index, waves=waves, eligible=pods, assigned=assigned, key=key)
        assert len(assigned) + len(members) == cumulative_targets(waves, replicas)[index]
        assigned += members
    assert sorted(assigned) == sorted(pods)
