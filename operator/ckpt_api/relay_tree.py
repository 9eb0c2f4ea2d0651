"""Who feeds whom in a wave: the rule the operator (and `bench fleet`, playing it) applies.

Each member of a wave gets one parent: a pod that already holds the version (a root), the
source, or a member before it in the same wave, which serves each tensor onward as soon as it
has verified it (pipelined relay). Every parent feeds at most `fanout` members and the source
one chain per wave: with fan-out 1 the wave is a few chains, each link carrying each byte once,
and the time is about one checkpoint over one link plus a tensor per hop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

SOURCE_CHAINS = 1  # chains the source feeds per wave besides the pods that hold the version
# Chains longer than this become trees of fan-out 2: every hop adds a tensor's time and one more
# agent whose failure its successors must ride out.
MAX_CHAIN_HOPS = 16


def fanout_for(members: int, roots: int, wanted: int) -> int:
    """The fan-out to arrange a wave with: `wanted`, unless chains (1) would run past
    MAX_CHAIN_HOPS, then 2 (a tree's depth grows with the log of the wave)."""
    if wanted == 1 and members > MAX_CHAIN_HOPS * (roots + SOURCE_CHAINS):
        return 2
    return wanted


def relay_parents(
    members: Sequence[str], roots: Sequence[str], fanout: int, *, source_chains: int = SOURCE_CHAINS
) -> dict[str, str | None]:
    """Each member's parent, in breadth-first order: roots first (in the order given), then the
    source (None), then members as they are placed. Deterministic for equal inputs."""
    if fanout < 1:
        raise ValueError(f"fanout must be >= 1, not {fanout}")
    open_parents: deque[tuple[str | None, int]] = deque((root, fanout) for root in roots)
    if source_chains > 0 or not roots:
        open_parents.append((None, max(source_chains, 1)))
    parents: dict[str, str | None] = {}
    for member in members:
        parent, room = open_parents.popleft()
        parents[member] = parent
        if room > 1:
            open_parents.appendleft((parent, room - 1))
        open_parents.append((member, fanout))
    return parents


def feeds(parents: dict[str, str | None]) -> set[str]:
    """The members some other member of the wave reads from while it loads."""
    return {p for p in parents.values() if p is not None and p in parents}
