"""`bench release` for real, small: a trainer's HF checkpoint through `ckpt-rollout release` to
two agents in capped network namespaces, with the control plane and the operator in the bench's
control namespace; everything it made is gone afterwards. Needs root (network namespaces)."""

from __future__ import annotations

import pytest

from ckpt_e2e.bench.smoke import NETNS_BENCH, namespaces_left, run_bench

pytestmark = NETNS_BENCH


def test_bench_release_smoke() -> None:
    r, pid = run_bench("release", "--hosts", "2", "--size-mb", "24", "--link-mbps", "400", timeout=400)
    assert (r["hosts"], r["waves"]) == (2, ["100%"])
    assert r["size_mb"] >= 24
    # The trainer's step in order: published, then one replica serves it, then both; the CR says
    # Complete once the operator saw them all (the bench reads agents twice a second, so its
    # reading of "all serving" may trail the CR's by up to a poll).
    assert 0 < r["publish_s"] < r["first_serving_s"] <= r["all_serving_s"] <= r["released_s"] + 1.0
    assert r["time_to_fleet_s"] == r["all_serving_s"]
    assert r["bound_s"] == pytest.approx(r["publish_bound_s"] + r["s_over_bw_s"], abs=0.002)
    assert r["time_to_fleet_over_bound"] == pytest.approx(r["all_serving_s"] / r["bound_s"], rel=0.01)
    # S / bw is S over the links' measured payload rate, under their 400 Mbit/s cap.
    assert 0 < r["link_goodput_mbps"] <= 400
    assert r["s_over_bw_s"] == pytest.approx(
        r["size_mb"] * 2**20 * 8 / (r["link_goodput_mbps"] * 1e6), rel=0.01
    )
    assert namespaces_left(pid) == [], "the bench left namespaces behind"
