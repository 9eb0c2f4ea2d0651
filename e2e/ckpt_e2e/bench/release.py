"""`python -m ckpt_e2e.bench release --hosts N --size-mb S --link-mbps B`: time to fleet, the one
number an RL team feels: from "the trainer wrote step N" to "every replica serves step N".

The trainer's directory is a Hugging Face model (llama-like, BF16, sharded safetensors with an
index, config and tokenizer files) of about S MiB. The fleet is `bench fleet`'s topology: N real
agents (paddle engine, staged apply: each tensor's bytes are relayed on as they land;
booted on the previous version from the shared filesystem), each in a network namespace behind a
veth capped with tc at B Mbit/s both ways, a source (`ckpt-rollout serve`)
behind the same cap, and an uncapped control namespace where a local control plane, the operator
and the trainer's `ckpt-rollout release` run (`release_ctl`). One CheckpointRollout selects the
N pods, checksums verified, waves `--waves` (default ["100%"]: one pipelined relay wave).

Printed: publish_s, first replica serving, all serving (each agent's `/v1/status`), when
release returned (the CR said Complete), and

    time_to_fleet / (publish_bound + S / bw)

with publish_bound = S / (this machine's cores x one core's xxh3 + blake3 rate) and bw the
links' measured TCP payload rate, both measured in the same run. Target: <= 1.5 at N = 8 (#33).
A canary wave first adds a whole S / bw on top (the canary must serve before the rest start):
`--waves 1,100%` shows that cost. Each agent peaks at three copies of the version in host RAM
(`fits_in_memory`): a size the machine cannot hold is refused before anything starts.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ckpt_e2e.bench.dataplane import measure_digests
from ckpt_e2e.bench.fleet import (
    SINK_PORT,
    agent_argv,
    agent_url,
    bench_network,
    log,
    refused,
    report_run,
    run_controller,
)
from ckpt_e2e.bench.netns import Member, sweep_stale
from ckpt_e2e.hf_checkpoint import llama_like
from ckpt_source.publish import publish

TARGET = 1.5  # x (publish_bound + S/bw), at N = 8 (issue #33)
HIDDEN = 1024  # 2 MiB BF16 projections: a tensor a hop is ~0.1 s of a 200 Mbit/s link
VERSIONS = ("step-100", "step-200")  # booted, released
MiB = 1 << 20


def layers_for(size_mb: int) -> int:
    """Decoder layers of a llama-like BF16 model of HIDDEN width near `size_mb` MiB (seven
    HIDDEN x HIDDEN projections a layer)."""
    per_layer = 7 * HIDDEN * HIDDEN * 2
    return max(1, round(size_mb * MiB / per_layer))


def fits_in_memory(hosts: int, size_mb: int, available: int) -> int:
    """The largest --size-mb (whole 128 MiB steps) that `hosts` agents can hold in `available`
    bytes of RAM, or `size_mb` when it fits. A staged paddle agent peaks at three copies of the
    version in host RAM (its live weights, the staged copy of the live version it keeps relaying
    while the next is pulled, and that next version's staging) plus ~256 MiB of its own; the
    control plane and this bench take ~2 GiB besides."""
    room = available - 2 * 1024 * MiB - hosts * 256 * MiB
    if hosts * 3 * size_mb * MiB <= room:
        return size_mb
    return max(0, room // (hosts * 3 * MiB) // 128 * 128)


def _available_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def parse_waves(text: str) -> list[int | str]:
    """`--waves 1,100%` -> [1, "100%"]."""
    return [w if w.endswith("%") else int(w) for w in (part.strip() for part in text.split(",")) if w]


def write_trainer_dir(path: Path, seed: int, size_mb: int) -> int:
    """A trainer's HF directory of about `size_mb` MiB; returns its weights' bytes."""
    ckpt = llama_like(
        path, seed=seed, shards=8, scale_dtype="F32", weight_dtype="BF16", hidden=HIDDEN,
        layers=layers_for(size_mb), vocab=HIDDEN,
    )  # fmt: skip
    return sum(len(t.data) for t in ckpt.tensors.values())


def run_release(
    hosts: int, link_mbps: float, size_mb: int, waves: list[int | str], workdir: str | None
) -> dict[str, Any]:
    stale = sweep_stale()
    if stale:
        log(f"removed namespaces left by earlier runs: {stale}")
    with tempfile.TemporaryDirectory(dir=workdir, prefix="ckpt-release-") as tmp:
        base = Path(tmp)
        root = base / "root"
        log(f"writing two {size_mb} MiB HF model directories (booted, released)")
        nbytes = 0
        for seed, version in enumerate(VERSIONS, start=100):
            nbytes = write_trainer_dir(base / version, seed, size_mb)
        publish(base / VERSIONS[0], VERSIONS[0], root, link=True)
        digest_gbps = measure_digests(min(nbytes, 256 * MiB), 3)
        cores = os.cpu_count() or 1
        with bench_network(hosts, link_mbps, root, base) as net:
            goodput = _goodput(net.ctl, net.members[0].ip, min(nbytes, 64 * MiB))
            # The version they serve when the trainer's next step comes, read from the shared
            # filesystem at boot (not over the links: that is not what is measured).
            boot = ["--paddle-weights", str(root / VERSIONS[0]), "--initial-version", VERSIONS[0],
                    "--source", root.as_uri()]  # fmt: skip
            agents = {}
            for m in net.members:
                net.procs.start(m.exec_argv(agent_argv(m, *boot)), base / f"{m.name}.log")
                agents[f"worker-{m.name}"] = agent_url(m)
            s_over_bw = nbytes / goodput
            log(f"release: {hosts} agents, {nbytes / MiB:.0f} MiB, links {link_mbps:g} Mbit/s "
                f"(measured {goodput * 8 / 1e6:.0f}), waves {waves}")  # fmt: skip
            cfg = {
                "workdir": str(base / "ctl"),
                "agents": agents,
                "source": net.source_url,
                "boot_version": VERSIONS[0],
                "version": VERSIONS[1],
                "trainer_dir": str(base / VERSIONS[1]),
                "publish_root": str(root),
                "waves": waves,
                "limit_s": 300 + 4 * hosts * s_over_bw,
            }
            (base / "ctl").mkdir()
            timings = run_controller(net.ctl, "ckpt_e2e.bench.release_ctl", cfg, base)
    publish_bound = nbytes / (digest_gbps * 1e9 * cores)
    bound = publish_bound + s_over_bw
    return {
        "hosts": hosts,
        "size_mb": round(nbytes / MiB, 1),
        "link_mbps": link_mbps,
        "link_goodput_mbps": round(goodput * 8 / 1e6, 1),
        "waves": waves,
        "publish_s": round(timings["publish_s"], 3),
        "publish_gbps": round(nbytes / timings["publish_s"] / 1e9, 2),
        "publish_bound_s": round(publish_bound, 3),
        "digests_gbps_one_core": round(digest_gbps, 2),
        "cores": cores,
        "s_over_bw_s": round(s_over_bw, 3),
        "first_serving_s": round(timings["first_serving_s"], 2),
        "all_serving_s": round(timings["all_serving_s"], 2),
        "released_s": round(timings["released_s"], 2),
        "time_to_fleet_s": round(timings["all_serving_s"], 2),
        "bound_s": round(bound, 3),
        "time_to_fleet_over_bound": round(timings["all_serving_s"] / bound, 3),
        "released_over_bound": round(timings["released_s"] / bound, 3),
        "target": TARGET,
        "setup_s": round(timings["setup_s"], 1),
    }


def _goodput(ctl: Member, sink_host: str, nbytes: int) -> float:
    """The capped links' TCP payload rate, measured from the control namespace."""
    code = (
        "from ckpt_e2e.bench.fleet_ctl import tcp_goodput; "
        f"print(tcp_goodput({sink_host!r}, {SINK_PORT}, {nbytes}))"
    )
    argv = ctl.exec_argv([sys.executable, "-c", code])
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"goodput stream: {done.stderr.strip()[-2000:]}")
    return float(done.stdout.strip())


def format_report(r: dict[str, Any]) -> str:
    ok = r["time_to_fleet_over_bound"] <= r["target"]
    return "\n".join(
        [
            f"release bench: {r['hosts']} agents, {r['size_mb']:.0f} MiB HF checkpoint, links "
            f"{r['link_mbps']:g} Mbit/s (measured {r['link_goodput_mbps']:g}), waves {r['waves']}",
            f"  publish        {r['publish_s']:8.2f} s   ({r['publish_gbps']:.2f} GB/s; bound "
            f"{r['publish_bound_s']:.2f} s = S / ({r['cores']} cores x "
            f"{r['digests_gbps_one_core']:.2f} GB/s))",
            f"  first serving  {r['first_serving_s']:8.2f} s   (S / bw = {r['s_over_bw_s']:.2f} s)",
            f"  all serving    {r['all_serving_s']:8.2f} s",
            f"  release done   {r['released_s']:8.2f} s   (the CR said Complete; "
            f"{r['released_over_bound']:.2f}x the bound)",
            f"  [{'ok  ' if ok else 'MISS'}] time to fleet / (publish bound + S/bw = {r['bound_s']:.2f} s) = "
            f"{r['time_to_fleet_over_bound']:.2f}  (target <= {r['target']:g})",
        ]
    )


def main_release(args: argparse.Namespace) -> int:
    if refused("release", args):
        return 2
    try:
        waves = parse_waves(args.waves)
    except ValueError:
        print(f"bench release: --waves {args.waves!r}: counts or percents, comma-separated", file=sys.stderr)
        return 2
    fits = fits_in_memory(args.hosts, args.size_mb, _available_bytes())
    if fits < args.size_mb:
        print(
            f"bench release: {args.hosts} agents x 3 x {args.size_mb} MiB (each agent's peak: live weights, "
            "the relayed copy of the live version, the next version's staging) do not fit in this "
            f"machine's available memory; --size-mb {fits} does"
            if fits
            else f"bench release: {args.hosts} agents do not fit in this machine's available memory",
            file=sys.stderr,
        )
        return 2

    def run() -> dict[str, Any]:
        started = time.monotonic()
        results = run_release(args.hosts, args.link_mbps, args.size_mb, waves, args.dir)
        results["bench_s"] = round(time.monotonic() - started, 1)
        return results

    return report_run("release", run, format_report, args.json)
