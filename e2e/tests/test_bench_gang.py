"""`bench gang` for real, small: one replica of two pods staging a sharded_state version of
four ranks, whole and then by their ranks' share, behind capped links; everything it made is gone
afterwards. Needs root (network namespaces)."""

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


def test_bench_gang_smoke() -> None:
    bench = subprocess.Popen(
        [sys.executable, "-m", "ckpt_e2e.bench", "gang", "--hosts", "2", "--ranks-per-host", "2",
         "--size-mb", "16", "--link-mbps", "400", "--json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        stdout, stderr = bench.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        bench.terminate()  # the bench removes its namespaces and processes on SIGTERM
        stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 0, stderr[-3000:]
    r = json.loads(stdout.strip().splitlines()[-1])
    assert (r["hosts"], r["ranks"], r["size_mb"]) == (2, 4, 16.0)
    # Whole, every pod moves the version; by share, each moves its two ranks' half of it.
    assert r["whole_host_mb"] == [16.0, 16.0]
    assert r["share_host_mb"] == [8.0, 8.0]
    assert 0 < r["link_goodput_mbps"] <= 400
    assert r["share_bound_s"] == pytest.approx(r["whole_bound_s"] / 2, abs=0.002)
    assert _ours(f"{NS_PREFIX}{bench.pid}-") == [], "the bench left namespaces behind"
