"""`python -m ckpt_e2e.bench controlplane`: what the operator costs per wave and per worker.

A local control plane (the e2e harness: etcd, kube-apiserver, controller-manager, scheduler,
kwok), N kwok pods answered by null-engine agents (loads apply at once; many agents per
process), the operator as a child process, and one CheckpointRollout with W waves (evenly
spaced percents ending at 100%). Measured from the CR's creation until the operator writes
Succeeded:

- total_s: that wall time (the bench watches the operator's phase gauge, not the apiserver,
  so its own polling adds no API traffic).
- overhead_per_wave_s: (total_s - sum over waves of the wave's slowest agent load) / W. The
  loads are what a perfect orchestrator would still wait for; everything else — the
  operator's steps, its status writes, its calls to agents and its pulls of their outcomes
  (or, in waves of up to 8 pods, the agents' pushes into the CR) — is control-plane
  overhead. With the null engine the loads are ~0, so this is about total_s / W. The agents'
  own pod-condition patches (WeightsReady, twice per load) load the same machine; with
  --no-agent-reports they are left out, which isolates the operator.
- api_requests: requests the apiserver served for checkpointrollouts (any verb or
  subresource) and events during the rollout, read from its own apiserver_request_total,
  minus the agents' CR status patches (counted by the agent hosts) and the bench's one
  create: the operator's reads, status writes, kopf's own patches and the events it posts.
  The agents' requests (a CR status patch per report, a pod status patch per readiness flip)
  are reported apart as agent_api_requests, counted once their queues have drained (they
  trail the rollout, off its critical path): they grow with N by design.
- operator_rss_mb: the operator's peak RSS (VmHWM, from /proc).
- ideal_wave_s: in the same run, the bench itself takes one wave's worth of agents to another
  version (calls at maxConcurrency, polls /v1/status): the floor of a wave on this machine.
- cpu_s_during_rollout: CPU seconds of the operator, the agent hosts and each control-plane
  process during the rollout: where the time goes on a machine with few cores.

The e2e harness is imported lazily: it is needed only here and never by the operator.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ckpt_api.vocabulary import Phase

SubParsers = Any  # argparse._SubParsersAction is private
NAME = "bench"
TO_VERSION = "v1"  # the agents start on v0
# Targets from issue 7.
TARGET_OVERHEAD_PER_WAVE_S = 1.0
TARGET_RSS_MB = 300.0
COUNTED_RESOURCES = ("checkpointrollouts", "events")


def add_command(bench_sub: SubParsers) -> None:
    p = bench_sub.add_parser(
        "controlplane", help="operator overhead per wave, API requests and RSS for N workers"
    )
    p.add_argument("--workers", type=int, default=100, help="kwok pods, each with a null-engine agent")
    p.add_argument("--waves", type=int, default=4, help="waves: evenly spaced percents ending at 100%%")
    p.add_argument("--hosts", type=int, help="agent host processes (default: one per 1000 agents)")
    p.add_argument("--load-ms", type=float, default=0.0, help="simulated load time per agent")
    p.add_argument(
        "--agent-reports",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="agents write their pod's WeightsReady condition (and CR entries for small waves), "
        "as in a real fleet; --no-agent-reports isolates the operator from that API traffic",
    )
    p.add_argument("--max-concurrency", type=int, default=64, help="the CR's strategy.maxConcurrency")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds to wait for Succeeded")
    p.add_argument(
        "--idle-seconds",
        type=float,
        default=60.0,
        help="how long the finished CR is watched for the operator's idle API requests (0: skip)",
    )
    p.add_argument("--workdir", type=Path, help="keep logs here (default: a temp dir, removed)")
    p.add_argument("--json", action="store_true", help="print only the JSON line")
    p.set_defaults(func=main)


def wave_targets(waves: int) -> list[str]:
    """W evenly spaced cumulative percents ending at 100% (strictly increasing for W <= 100)."""
    return [f"{round(100 * (i + 1) / waves)}%" for i in range(waves)]


def request_counts(metrics_text: str, resources: tuple[str, ...]) -> Counter[str]:
    """apiserver_request_total summed by `VERB resource[/subresource]` for `resources`."""
    counts: Counter[str] = Counter()
    for line in metrics_text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        head, _, value = line.rpartition(" ")
        labels = dict(
            part.split("=", 1)
            for part in head[len("apiserver_request_total{") : -1].split(",")
            if "=" in part
        )
        found = {k: v.strip('"') for k, v in labels.items()}
        if found.get("resource") not in resources:
            continue
        sub = f"/{found['subresource']}" if found.get("subresource") else ""
        counts[f"{found.get('verb')} {found['resource']}{sub}"] += int(float(value))
    return counts


def delta(after: Counter[str], before: Counter[str]) -> Counter[str]:
    return Counter({k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)})


def overhead_per_wave(total_s: float, slowest_load_s: list[float], waves: int) -> float:
    return (total_s - sum(slowest_load_s)) / waves


def main(args: argparse.Namespace) -> int:
    if args.workers < 1 or not 1 <= args.waves <= min(100, args.workers):
        print("bench controlplane: need workers >= 1 and 1 <= waves <= min(100, workers)", file=sys.stderr)
        return 2
    # SIGTERM unwinds like Ctrl-C, so the cluster, agents and operator are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log = sys.stderr if args.json else sys.stdout
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        result = run(args, args.workdir, log)
    else:
        with tempfile.TemporaryDirectory(prefix="ckpt-bench-cp-") as tmp:
            result = run(args, Path(tmp), log)
    if not args.json:
        for line in summary_lines(result):
            print(line)
    print(json.dumps(result, sort_keys=True))
    return 0 if result["phase"] == Phase.SUCCEEDED else 1


def summary_lines(r: dict[str, Any]) -> list[str]:
    n = r["workers"]
    overhead, rss, ideal = r["overhead_per_wave_s"], r["operator_rss_mb"], max(r["ideal_wave_s"], 1e-9)
    return [
        f"workers={n} waves={r['waves']} agent_reports={'on' if r['agent_reports'] else 'off'} "
        f"phase={r['phase']} total={r['total_s']:.2f}s",
        f"overhead per wave: {overhead:.3f}s = "
        f"{overhead / TARGET_OVERHEAD_PER_WAVE_S:.2f}x the {TARGET_OVERHEAD_PER_WAVE_S:g}s target",
        f"operator API requests: {r['api_requests']} ({r['api_requests'] / n:.3f} per worker; "
        f"its own status GET/PATCH: {r['operator_status_requests']})",
        f"agents' API requests: {r['agent_api_requests']} ({r['agent_api_requests'] / n:.2f} per worker; "
        f"{r['agent_api_requests_at_succeeded']} sent by Succeeded)",
        f"operator CPU: {r['operator_cpu_ms_per_worker']:.3f} ms per worker; idle CR: "
        f"{r['idle_api_requests_per_min']} operator API requests per minute (target 0)",
        f"operator peak RSS: {rss:.1f} MB = {rss / TARGET_RSS_MB:.2f}x the {TARGET_RSS_MB:g} MB target",
        f"ideal wave (the bench calls one wave's agents and polls them, nothing else; this run): "
        f"{ideal:.2f}s; the operator's overhead per wave is {overhead / ideal:.1f}x that",
    ]


def run(args: argparse.Namespace, workdir: Path, log: Any) -> dict[str, Any]:
    from ckpt_e2e.bench.controlplane_env import BenchEnv

    def say(message: str) -> None:
        print(f"==> {message}", file=log, flush=True)

    with BenchEnv(
        workdir,
        args.workers,
        hosts=args.hosts,
        load_seconds=args.load_ms / 1000,
        agent_reports=args.agent_reports,
        say=say,
    ) as env:
        spec = {
            "version": TO_VERSION,
            "source": {"uri": "http://127.0.0.1:9/null-engine-pulls-nothing"},
            "selector": {"matchLabels": env.labels},
            "strategy": {"waves": wave_targets(args.waves), "maxConcurrency": args.max_concurrency},
            "timeouts": {"workerSeconds": 600, "progressDeadlineSeconds": int(args.timeout)},
        }
        say(f"rolling out {TO_VERSION} to {args.workers} agents in {args.waves} waves")
        before_api = request_counts(env.apiserver_metrics(), COUNTED_RESOURCES)
        before_agents = env.fleet.stats()
        before_own = env.operator_status_requests()
        before_cpu = env.cpu_seconds()
        t0 = time.monotonic()
        env.create_rollout(NAME, spec)
        phase = env.wait_terminal(NAME, args.timeout)
        total_s = time.monotonic() - t0
        after_own = env.operator_status_requests()
        cpu = {k: round(v - before_cpu.get(k, 0.0), 1) for k, v in env.cpu_seconds().items()}
        after_api = request_counts(env.apiserver_metrics(), COUNTED_RESOURCES)
        after_agents = env.fleet.stats()
        rss_mb = env.operator_peak_rss_mb()
        status = env.rollout_status(NAME)
        # The agents' pod-condition patches trail the rollout (they are off its critical path).
        settled_agents = env.fleet.settled_stats()
        # A finished CR should cost the apiserver nothing: count the operator's own requests
        # while it sits Succeeded (before the ideal-wave run below adds agent traffic).
        idle_before = env.operator_status_requests()
        time.sleep(args.idle_seconds)
        idle_requests = env.operator_status_requests() - idle_before
        ideal_s = env.ideal_wave(math.ceil(args.workers / args.waves), args.max_concurrency, "v-ideal")

    agent_requests = Counter(after_agents["api_requests"]) - Counter(before_agents["api_requests"])
    agent_requests_settled = Counter(settled_agents["api_requests"]) - Counter(before_agents["api_requests"])
    seen = delta(after_api, before_api)
    operator_requests = sum(seen.values()) - agent_requests["PATCH checkpointrollouts/status"] - 1
    slowest = [float(s) for s in after_agents["slowest_load_s_by_wave"].values()]
    return {
        "workers": args.workers,
        "waves": args.waves,
        "agent_reports": args.agent_reports,
        "phase": phase,
        "total_s": round(total_s, 3),
        "overhead_per_wave_s": round(overhead_per_wave(total_s, slowest, args.waves), 3),
        "api_requests": operator_requests,
        "operator_status_requests": int(after_own - before_own),
        "agent_api_requests": sum(agent_requests_settled.values()),
        "agent_api_requests_at_succeeded": sum(agent_requests.values()),
        "operator_rss_mb": round(rss_mb, 1),
        "ideal_wave_s": round(ideal_s, 3),
        "apiserver_requests_by_kind": dict(sorted(seen.items())),
        "agent_requests_by_kind": dict(sorted(agent_requests_settled.items())),
        "slowest_load_s_by_wave": slowest,
        "updated_replicas": status.get("updatedReplicas"),
        "agents_on_target": after_agents["versions"].get(TO_VERSION, 0),
        "cpu_s_during_rollout": cpu,
        "operator_cpu_ms_per_worker": round(1000 * cpu.get("operator", 0.0) / args.workers, 3),
        "idle_api_requests_per_min": round(idle_requests * 60 / args.idle_seconds, 1)
        if args.idle_seconds
        else None,
        "setup_s": {k: round(v, 1) for k, v in env.timings.items()},
    }
