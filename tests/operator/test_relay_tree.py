"""The rule that arranges a wave into relay chains (ckpt_api.relay_tree), table-tested."""

from __future__ import annotations

import pytest

from ckpt_api.relay_tree import MAX_CHAIN_HOPS, fanout_for, feeds, relay_parents


@pytest.mark.parametrize(
    ("members", "roots", "fanout", "parents"),
    [
        # The canary wave: nobody holds the version, the source feeds the one member.
        (["c"], [], 1, {"c": None}),
        # No holder yet, three members: one chain from the source.
        (["a", "b", "c"], [], 1, {"a": None, "b": "a", "c": "b"}),
        # waves [1, "100%"] after the canary: two chains, one from the canary, one from the source.
        (
            ["a", "b", "c", "d", "e"],
            ["k"],
            1,
            {"a": "k", "b": None, "c": "a", "d": "b", "e": "c"},
        ),
        # Two holders: they and the source each start a chain.
        (["a", "b", "c", "d"], ["h1", "h2"], 1, {"a": "h1", "b": "h2", "c": None, "d": "a"}),
        # Fan-out 2: each parent feeds two before the next one in line.
        (
            ["a", "b", "c", "d", "e", "f"],
            ["k"],
            2,
            {"a": "k", "b": "k", "c": None, "d": "a", "e": "a", "f": "b"},
        ),
        ([], ["k"], 1, {}),
    ],
)
def test_relay_parents(
    members: list[str], roots: list[str], fanout: int, parents: dict[str, str | None]
) -> None:
    assert relay_parents(members, roots, fanout) == parents


def test_every_parent_feeds_at_most_fanout_and_the_source_one_chain() -> None:
    members = [f"m{i:02d}" for i in range(40)]
    for fanout in (1, 2, 3):
        parents = relay_parents(members, ["h1", "h2"], fanout)
        fed = [p for p in parents.values()]
        assert fed.count(None) == 1
        assert max(fed.count(p) for p in set(fed) - {None}) == fanout
        # A member's parent comes before it (a holder, the source or an earlier member): no cycles.
        order = {m: i for i, m in enumerate(members)}
        assert all(p is None or p not in order or order[p] < order[m] for m, p in parents.items())


def test_feeds_names_the_members_that_serve_while_they_load() -> None:
    parents = relay_parents(["a", "b", "c", "d"], ["k"], 1)
    assert feeds(parents) == {"a", "b"}
    assert feeds({"a": "k", "b": None}) == set()


def test_a_fanout_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="fanout must be >= 1"):
        relay_parents(["a"], [], 0)


@pytest.mark.parametrize(
    ("members", "roots", "wanted", "fanout"),
    [
        (2 * MAX_CHAIN_HOPS, 1, 1, 1),  # two chains of MAX_CHAIN_HOPS: still chains
        (2 * MAX_CHAIN_HOPS + 1, 1, 1, 2),  # one hop more: a tree
        (64 * MAX_CHAIN_HOPS, 63, 1, 1),  # many holders (a later wave): chains stay short
        (10_000, 1, 3, 3),  # an explicit fan-out is kept
    ],
)
def test_long_chains_become_trees(members: int, roots: int, wanted: int, fanout: int) -> None:
    assert fanout_for(members, roots, wanted) == fanout
