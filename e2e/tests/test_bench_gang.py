"""`bench gang` for real, small: one replica of two pods staging a sharded_state version of
four ranks, whole and then by their ranks' share, behind capped links; everything it made is gone
afterwards. Needs root (network namespaces)."""

from __future__ import annotations

import pytest

from ckpt_e2e.bench.smoke import NETNS_BENCH, namespaces_left, run_bench

pytestmark = NETNS_BENCH


def test_bench_gang_smoke() -> None:
    args = ["gang", "--hosts", "2", "--ranks-per-host", "2", "--size-mb", "16", "--link-mbps", "400"]
    r, pid = run_bench(*args, timeout=300)
    assert (r["hosts"], r["ranks"], r["size_mb"]) == (2, 4, 16.0)
    # Whole, every pod moves the version; by share, each moves its two ranks' half of it.
    assert r["whole_host_mb"] == [16.0, 16.0]
    assert r["share_host_mb"] == [8.0, 8.0]
    assert 0 < r["link_goodput_mbps"] <= 400
    assert r["share_bound_s"] == pytest.approx(r["whole_bound_s"] / 2, abs=0.002)
    assert namespaces_left(pid) == [], "the bench left namespaces behind"
