"""The waves `bench fleet` rolls a version out in, and who feeds whom in each: the operator's
rule (`ckpt_api.relay_tree.relay_parents`, fan-out 1) played by the bench. Pure.

- `default`: waves [1, "100%"]: a canary from the source, then every other agent in one wave of
  two chains, one fed by the canary and one by the source;
- `doubling`: the holders double each wave (1, 1, 2, 4, ...), every holder a root of the next.

An agent that feeds a member of its own wave is asked to relay while it loads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from ckpt_api.relay_tree import feeds, relay_parents

WaveMode = Literal["default", "doubling"]
WAVE_MODES: tuple[WaveMode, ...] = ("default", "doubling")
RELAY_FANOUT = 1  # each link carries each byte once: the chains the link bound assumes


@dataclass(frozen=True)
class Job:
    agent: str
    parent: str | None  # None: the source
    relay_while_loading: bool

    def source(self, source_uri: str) -> dict[str, str | bool]:
        """The request's `source` (a `SourceRef` in wire form)."""
        ref: dict[str, str | bool] = {"uri": source_uri}
        if self.parent is not None:
            ref["peer"] = self.parent
        if self.relay_while_loading:
            ref["relayWhileLoading"] = True
        return ref


def wave_sizes(hosts: int, mode: WaveMode) -> list[int]:
    """How many new agents each wave takes."""
    if hosts < 1:
        raise ValueError(f"hosts must be >= 1, not {hosts}")
    if mode == "default":
        return [1] if hosts == 1 else [1, hosts - 1]
    if mode != "doubling":
        raise ValueError(f"unknown wave mode {mode!r}; one of {', '.join(WAVE_MODES)}")
    sizes: list[int] = []
    holders = 0
    while holders < hosts:
        sizes.append(min(max(holders, 1), hosts - holders))
        holders += sizes[-1]
    return sizes


def plan_waves(agents: Sequence[str], mode: WaveMode) -> list[list[Job]]:
    """Each wave's jobs, parents before the members they feed (the order to call them in: a
    member that reads a peer finds it already loading)."""
    waves: list[list[Job]] = []
    holders = 0
    for size in wave_sizes(len(agents), mode):
        members = agents[holders : holders + size]
        parents = relay_parents(members, roots=agents[:holders], fanout=RELAY_FANOUT)
        feeders = feeds(parents)
        waves.append([Job(m, parents[m], m in feeders) for m in members])
        holders += size
    return waves
