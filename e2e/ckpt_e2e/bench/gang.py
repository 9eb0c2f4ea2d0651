"""`python -m ckpt_e2e.bench gang --hosts M --link-mbps B`: what one multi-node replica's pods
move when a version saved per tensor-parallel rank (`sharded_state`) reaches them, and how long
its gang takes to stage it.

M hosts are one replica's pods (engine `member`, each behind its own link capped at B Mbit/s);
the source sits behind a link of M x B (a store as wide as the replica's links together, so the
pods' own links are what bounds the gang). The version has M x `--ranks-per-host` ranks of equal
size, S bytes in all. The gang is staged twice, each time every pod called at once, as the
operator calls a replica's followers: once by agents that take the whole version (no `--ranks`:
what every pod moved before shares), once by agents given their host's ranks (`--ranks`). With bw
the links' measured TCP payload rate, the bounds are S/bw and S/(M x bw); the report prints each
pod's bytes and `share_s / (S/M/bw)`, target <= 1.5 (as for the other relay benches).
The last line printed is JSON (see `run_gang`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from ckpt_e2e.bench.fleet import SINK_PORT, bench_network, log, main_netns_bench, run_controller
from ckpt_e2e.bench.netns import sweep_stale
from ckpt_source.publish import publish

WHOLE_PORT, SHARE_PORT = 8089, 8091
TENSOR = (512, 512)  # 1 MiB of float32
VERSIONS = ("gang-a", "gang-b")
TARGET = 1.5


def sharded_state(directory: Path, ranks: int, size_mb: int, seed: int) -> None:
    """`ranks` files model-rank-<r>-part-0.safetensors of size_mb/ranks MiB each, every rank's
    with the same tensor names (its own slices), as vLLM's save_sharded_state writes them."""
    directory.mkdir(parents=True)
    per_rank = max(1, size_mb // ranks)
    rng = np.random.default_rng(seed)
    for rank in range(ranks):
        tensors = {f"layers.{k}.weight": rng.random(TENSOR, dtype=np.float32) for k in range(per_rank)}
        save_file(tensors, str(directory / f"model-rank-{rank}-part-0.safetensors"))
    (directory / "config.json").write_text('{"architectures": ["Bench"]}')


def member_argv(ip: str, port: int, staging: Path, ranks: str | None) -> list[str]:
    argv = [sys.executable, "-m", "ckpt_agent", "agent", "--engine", "member", "--host", ip,
            "--port", str(port), "--metrics-port", "0", "--no-auth", "--plain-http", "--log-level", "warning",
            "--staging-dir", str(staging)]  # fmt: skip
    return [*argv, "--ranks", ranks] if ranks else argv


def run_gang(
    hosts: int, link_mbps: float, size_mb: int, ranks_per_host: int, workdir: str | None
) -> dict[str, Any]:
    ranks = hosts * ranks_per_host
    stale = sweep_stale()
    if stale:
        log(f"removed namespaces left by earlier runs: {stale}")
    with tempfile.TemporaryDirectory(dir=workdir, prefix="ckpt-gang-") as tmp:
        root = Path(tmp) / "root"
        for seed, version in enumerate(VERSIONS, start=21):
            sharded_state(Path(tmp) / version, ranks, size_mb, seed)
            publish(Path(tmp) / version, version, root)
        with bench_network(hosts, link_mbps, root, Path(tmp), source_mbps=hosts * link_mbps) as net:
            whole: list[str] = []
            share: list[str] = []
            for index, m in enumerate(net.members):
                mine = f"{index * ranks_per_host}-{(index + 1) * ranks_per_host - 1}"
                for port, sharing, urls in ((WHOLE_PORT, None, whole), (SHARE_PORT, mine, share)):
                    staging = Path(tmp) / f"{m.name}-{port}"
                    argv = member_argv(m.ip, port, staging, sharing)
                    net.procs.start(m.exec_argv(argv), Path(tmp) / f"{m.name}-{port}.log")
                    urls.append(f"http://{m.ip}:{port}")
            log(f"gang: {hosts} pods, {ranks} ranks, {size_mb} MiB, links {link_mbps:g} Mbit/s")
            cfg = {
                "whole": whole,
                "share": share,
                "source": net.source_url,
                "versions": list(VERSIONS),
                "limit_s": 120 + 4 * size_mb * 8 / link_mbps,
                "sink_host": net.members[0].ip,
                "sink_port": SINK_PORT,
                "goodput_bytes": size_mb << 20,
            }
            timings = run_controller(net.ctl, "ckpt_e2e.bench.gang_ctl", cfg, Path(tmp))
    mib = 2**20
    goodput = float(timings["goodput_bytes_per_s"])
    nbytes = int(timings["version_bytes"])
    return {
        "hosts": hosts,
        "ranks": ranks,
        "size_mb": round(nbytes / mib, 2),
        "link_mbps": link_mbps,
        "link_goodput_mbps": round(goodput * 8 / 1e6, 1),
        "whole_s": round(timings["whole_s"], 3),
        "share_s": round(timings["share_s"], 3),
        "whole_bound_s": round(nbytes / goodput, 3),
        "share_bound_s": round(nbytes / hosts / goodput, 3),
        "whole_host_mb": [round(b / mib, 2) for b in timings["whole_bytes"]],
        "share_host_mb": [round(b / mib, 2) for b in timings["share_bytes"]],
        "target": TARGET,
    }


def format_report(r: dict[str, Any]) -> str:
    ratio = r["share_s"] / r["share_bound_s"]
    return "\n".join(
        [
            f"gang bench: one replica of {r['hosts']} pods, {r['ranks']} ranks, {r['size_mb']} MiB "
            f"(sharded_state), links {r['link_mbps']:g} Mbit/s ({r['link_goodput_mbps']:g} measured)",
            f"  whole version per pod  {r['whole_s']:8.2f} s   each pod moved {r['whole_host_mb']} MiB "
            f"(S/bw = {r['whole_bound_s']:.2f} s)",
            f"  its ranks' share       {r['share_s']:8.2f} s   each pod moved {r['share_host_mb']} MiB "
            f"(S/M/bw = {r['share_bound_s']:.2f} s)",
            f"  [{'ok  ' if ratio <= r['target'] else 'MISS'}] gang with shares <= {r['target']:g} x S/M/bw "
            f"({ratio:.2f}x; {r['whole_s'] / r['share_s']:.2f}x faster than whole versions)",
        ]
    )


def main_gang(args: argparse.Namespace) -> int:
    return main_netns_bench(
        "gang",
        args,
        lambda: run_gang(args.hosts, args.link_mbps, args.size_mb, args.ranks_per_host, args.dir),
        format_report,
    )
