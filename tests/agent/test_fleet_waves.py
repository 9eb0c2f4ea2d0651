"""The waves `bench fleet` rolls out in (`ckpt_e2e.bench.fleet_plan`): sizes, parents, who relays
while loading, and the request each job sends validates as the agent's `SourceRef`."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckpt_api.agent_api import SourceRef
from ckpt_e2e.bench.fleet import pipelined_target
from ckpt_e2e.bench.fleet_plan import WAVE_MODES, Job, WaveMode, plan_waves, wave_sizes

SRC = "http://10.0.0.1:8090"


@pytest.mark.parametrize(
    ("hosts", "mode", "sizes"),
    [
        (1, "default", [1]),
        (2, "default", [1, 1]),
        (8, "default", [1, 7]),
        (1, "doubling", [1]),
        (2, "doubling", [1, 1]),
        (5, "doubling", [1, 1, 2, 1]),
        (8, "doubling", [1, 1, 2, 4]),
        (16, "doubling", [1, 1, 2, 4, 8]),
    ],
)
def test_wave_sizes(hosts: int, mode: WaveMode, sizes: list[int]) -> None:
    assert wave_sizes(hosts, mode) == sizes


@pytest.mark.parametrize(
    ("hosts", "mode", "says"), [(0, "default", "hosts must be >= 1"), (4, "halving", "unknown wave mode")]
)
def test_wave_sizes_rejects_bad_input(hosts: int, mode: WaveMode, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        wave_sizes(hosts, mode)


def test_default_is_a_canary_then_two_chains() -> None:
    canary, pipelined = plan_waves(["a", "b", "c", "d", "e"], "default")
    assert canary == [Job("a", None, False)]
    # One chain from the canary (b, d), one from the source (c, e); b and c feed while loading.
    assert pipelined == [
        Job("b", "a", True),
        Job("c", None, True),
        Job("d", "b", False),
        Job("e", "c", False),
    ]


def test_doubling_feeds_each_new_agent_from_one_holder() -> None:
    waves = plan_waves(["a", "b", "c", "d", "e"], "doubling")
    assert waves == [
        [Job("a", None, False)],
        [Job("b", "a", False)],
        [Job("c", "a", False), Job("d", "b", False)],
        [Job("e", "a", False)],
    ]


@pytest.mark.parametrize(("hosts", "target"), [(1, 1.3), (8, 1.3), (9, 1.5), (16, 1.5), (64, 1.5)])
def test_pipelined_target_follows_issue_15(hosts: int, target: float) -> None:
    assert pipelined_target(hosts) == target


@pytest.mark.parametrize(
    ("job", "wire"),
    [
        (Job("a", None, False), {"uri": SRC}),
        (Job("b", "http://10.0.0.2:8089", False), {"uri": SRC, "peer": "http://10.0.0.2:8089"}),
        (
            Job("c", "http://10.0.0.2:8089", True),
            {"uri": SRC, "peer": "http://10.0.0.2:8089", "relayWhileLoading": True},
        ),
        (Job("d", None, True), {"uri": SRC, "relayWhileLoading": True}),
    ],
)
def test_job_source_is_a_valid_source_ref(job: Job, wire: dict[str, object]) -> None:
    assert job.source(SRC) == wire
    # The agent's model accepts it and sends it on unchanged (unset fields stay unset).
    assert SourceRef.model_validate(job.source(SRC)).to_wire() == wire


@given(hosts=st.integers(1, 64), mode=st.sampled_from(WAVE_MODES))
def test_every_agent_once_parents_already_called(hosts: int, mode: WaveMode) -> None:
    agents = [f"h{i}" for i in range(hosts)]
    waves = plan_waves(agents, mode)
    order = [job.agent for wave in waves for job in wave]
    assert order == agents
    called: set[str] = set()
    for wave in waves:
        feeders = {job.parent for job in wave}
        for job in wave:
            assert job.parent is None or job.parent in called, "a parent is called before its child"
            assert job.relay_while_loading == (job.agent in feeders)
            called.add(job.agent)
        # Fan-out 1: no parent feeds two members of a wave (the source feeds one chain per wave).
        parents = [job.parent for job in wave if job.parent is not None]
        assert len(parents) == len(set(parents))
        assert sum(1 for job in wave if job.parent is None) <= 1
