"""A network-namespace bench run the way its smoke test runs it: the bench as a process, its
last line's JSON, and whatever namespaces it left behind (none, once it cleaned up)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

from ckpt_e2e.bench.netns import NS_PREFIX

NETNS_BENCH = [
    pytest.mark.integration,
    pytest.mark.bench,
    pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
]


def run_bench(*args: str, timeout: float) -> tuple[dict[str, Any], int]:
    """`python -m ckpt_e2e.bench ARGS --json`: its JSON result and its pid; AssertionError with
    its stderr's tail when it fails. Past `timeout` it is sent SIGTERM, on which it cleans up."""
    bench = subprocess.Popen(
        [sys.executable, "-m", "ckpt_e2e.bench", *args, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = bench.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        bench.terminate()
        stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 0, stderr[-3000:]
    return json.loads(stdout.strip().splitlines()[-1]), bench.pid


def namespaces_left(pid: int) -> list[str]:
    """The network namespaces the bench with this pid made and did not remove."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(f"{NS_PREFIX}{pid}-")]
