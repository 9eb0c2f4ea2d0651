"""`python -m ckpt_e2e.bench release|dataplane|fleet|gang|controlplane`: the benchmark commands of a
development checkout, apart from the product's `ckpt-rollout`. Handlers import their bench
lazily, so `--help` imports none."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import Any

from ckpt_e2e.bench.fleet_plan import WAVE_MODES  # small and pure: no bench is imported with it

SubParsers = Any  # argparse._SubParsersAction is private; this is what add_parser is called on

PROG = "python -m ckpt_e2e.bench"


def _bench_dataplane(args: argparse.Namespace) -> int:
    from ckpt_e2e.bench.dataplane import main_dataplane

    return main_dataplane(args)


def _bench_fleet(args: argparse.Namespace) -> int:
    from ckpt_e2e.bench.fleet import main_fleet

    return main_fleet(args)


def _bench_gang(args: argparse.Namespace) -> int:
    from ckpt_e2e.bench.gang import main_gang

    return main_gang(args)


def _bench_release(args: argparse.Namespace) -> int:
    from ckpt_e2e.bench.release import main_release

    return main_release(args)


def _add_netns_bench(
    bench_sub: SubParsers, name: str, help_text: str, hosts: int, size_mb: int, size_help: str
) -> argparse.ArgumentParser:
    """A bench of agents in tc-capped network namespaces: the options `fleet` and `release` share."""
    p: argparse.ArgumentParser = bench_sub.add_parser(name, help=help_text)
    p.add_argument("--hosts", type=int, default=hosts, help="agents, each in its own network namespace")
    p.add_argument("--link-mbps", type=float, default=200, help="tc rate cap of every link, both ways")
    p.add_argument("--size-mb", type=int, default=size_mb, help=size_help)
    p.add_argument("--dir", help="scratch directory (default: system temp)")
    p.add_argument("--json", action="store_true", help="human lines to stderr; the last line is JSON anyway")
    return p


def _add_release(bench_sub: SubParsers) -> None:
    p = _add_netns_bench(
        bench_sub,
        "release",
        "time to fleet: `ckpt-rollout release` of an HF checkpoint to agents behind capped links (root)",
        hosts=8,
        size_mb=1024,
        size_help="checkpoint size (HF llama-like, BF16)",
    )
    p.add_argument(
        "--waves",
        default="100%",
        help='the CR\'s waves, comma-separated (default "100%%"; "1,100%%": canary first)',
    )
    p.set_defaults(func=_bench_release)


def _add_dataplane_and_fleet(bench_sub: SubParsers) -> None:
    p = bench_sub.add_parser("dataplane", help="transport and verify throughput against memcpy/TCP")
    p.add_argument("--size-mb", type=int, default=512)
    p.add_argument("--tensor-mb", type=int, default=64, help="size of each synthetic tensor")
    p.add_argument("--chunk-mb", type=int, default=4)
    p.add_argument("--repeat", type=int, default=5, help="runs per figure; the best is kept")
    p.add_argument("--dir", help="scratch directory (default: system temp)")
    p.add_argument(
        "--json", action="store_true", help="print only one JSON object (human lines go to stderr)"
    )
    p.set_defaults(func=_bench_dataplane)

    p = _add_netns_bench(
        bench_sub,
        "fleet",
        "fleet load time: source-only vs wave relay, agents in tc-capped network namespaces (root)",
        hosts=4,
        size_mb=32,
        size_help="version size (reference model)",
    )
    p.add_argument(
        "--waves",
        choices=WAVE_MODES,
        default="default",
        help='relay waves: default = [1, "100%%"] (canary, then one pipelined wave); doubling = 1, 2, 4, ...',
    )
    p.set_defaults(func=_bench_fleet)

    p = _add_netns_bench(
        bench_sub,
        "gang",
        "one multi-node replica staging a per-rank (sharded_state) version: whole vs its ranks' share (root)",
        hosts=4,
        size_mb=64,
        size_help="version size (sharded_state, 1 MiB tensors)",
    )
    p.add_argument("--ranks-per-host", type=int, default=2, help="tensor-parallel ranks each pod runs")
    p.set_defaults(func=_bench_gang)


def build_parser() -> argparse.ArgumentParser:
    from ckpt_e2e.bench.controlplane import add_command as add_controlplane

    parser = argparse.ArgumentParser(prog=PROG, description="benchmarks that print ratios against limits")
    bench_sub = parser.add_subparsers(dest="bench", metavar="BENCH")
    _add_release(bench_sub)
    _add_dataplane_and_fleet(bench_sub)
    add_controlplane(bench_sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Callable[[argparse.Namespace], int] | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)
