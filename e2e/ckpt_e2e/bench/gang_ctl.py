"""The controller half of `bench gang`, run inside the bench's control namespace
(`python -m ckpt_e2e.bench.gang_ctl '<json>'`): the links' payload rate, then one replica's pods
staging a version all at once, twice (agents that take the whole version, then agents given
their ranks), each timed from the calls to the last answer; prints one JSON line."""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from ckpt_e2e.bench.fleet_ctl import _call, tcp_goodput, wait_healthy, wave


def _stage(agents: list[str], source: str, version: str, limit_s: float) -> tuple[float, list[int]]:
    started = time.monotonic()
    statuses = wave([(a, {"uri": source}) for a in agents], version, limit_s)
    seconds = time.monotonic() - started
    moved = [s.last_load.bytes if s.last_load is not None else 0 for s in statuses]
    return seconds, moved


def run(cfg: dict[str, Any]) -> dict[str, Any]:
    whole: list[str] = cfg["whole"]
    share: list[str] = cfg["share"]
    source: str = cfg["source"]
    limit = float(cfg["limit_s"])
    goodput = tcp_goodput(cfg["sink_host"], cfg["sink_port"], cfg["goodput_bytes"])
    wait_healthy([source, *whole, *share], limit)
    manifest = _call("GET", f"{source}/{cfg['versions'][0]}/manifest.json")
    whole_s, whole_bytes = _stage(whole, source, cfg["versions"][0], limit)
    share_s, share_bytes = _stage(share, source, cfg["versions"][1], limit)
    return {
        "goodput_bytes_per_s": goodput,
        "version_bytes": manifest["total_bytes"],
        "whole_s": whole_s,
        "whole_bytes": whole_bytes,
        "share_s": share_s,
        "share_bytes": share_bytes,
    }


if __name__ == "__main__":
    print(json.dumps(run(json.loads(sys.argv[1]))), flush=True)
