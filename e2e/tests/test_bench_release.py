"""`bench release` for real, small: a trainer's HF checkpoint through `ckpt-rollout release` to
two agents in capped network namespaces, with the control plane and the operator in the bench's
control namespace; everything it made is gone afterwards. Needs root (network namespaces)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ckpt_e2e.bench.netns import NS_PREFIX

pytestmark = [
    pytest.mark.integration,
    pytest.mark.bench,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]


def _ours(prefix: str) -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(prefix)]


def test_bench_release_smoke() -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "ckpt_e2e.bench", "release", "--hosts", "2", "--size-mb", "24",
         "--link-mbps", "400", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        stdout, stderr = bench.communicate(timeout=400)
    except subprocess.TimeoutExpired:
        bench.terminate()  # the bench removes its namespaces and processes on SIGTERM
        stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 0, stderr[-3000:]
    r = json.loads(stdout.strip().splitlines()[-1])
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
    assert _ours(f"{NS_PREFIX}{bench.pid}-") == [], "the bench left namespaces behind"
