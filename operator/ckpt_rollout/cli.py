"""`ckpt-rollout` command line: one entry point for operator, agent, tooling and benches.

Subcommands import their implementation lazily so `--help` and `crd` stay fast and work
without paddle or a cluster client installed."""

import argparse
import sys
from collections.abc import Callable, Sequence

Handler = Callable[[argparse.Namespace], int]

# Subcommands announced in --help before they exist; each names the issue that brings it.
PLANNED: dict[str, tuple[str, str]] = {}
PLANNED_BENCH: dict[str, tuple[str, str]] = {}


def _not_implemented(name: str, issue: str) -> Handler:
    def run(_args: argparse.Namespace) -> int:
        print(f"ckpt-rollout {name}: not implemented yet (planned in issue {issue})", file=sys.stderr)
        return 2

    return run


def _add_planned(
    sub: "argparse._SubParsersAction[argparse.ArgumentParser]",
    planned: dict[str, tuple[str, str]],
    prefix: str = "",
) -> None:
    for name, (help_text, issue) in planned.items():
        parser = sub.add_parser(name, help=f"{help_text} (planned: {issue})")
        parser.set_defaults(func=_not_implemented(prefix + name, issue))


def _print_help_of(parser: argparse.ArgumentParser) -> Handler:
    def run(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    return run


def _crd(args: argparse.Namespace) -> int:
    from ckpt_api.crd import render_crd

    sys.stdout.write(render_crd())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ckpt-rollout",
        description="Roll model checkpoints out to a running inference fleet in place, in waves.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    crd = sub.add_parser("crd", help="print the CheckpointRollout CRD (generated from the models)")
    crd.set_defaults(func=_crd)
    from ckpt_agent.cli import add_bench_commands as add_agent_bench_commands
    from ckpt_agent.cli import add_commands as add_agent_commands
    from ckpt_rollout.bench_controlplane import add_command as add_controlplane_bench
    from ckpt_rollout.commands import add_commands as add_inspect_commands
    from ckpt_rollout.runner import add_command as add_operator_command

    add_operator_command(sub)
    add_inspect_commands(sub)
    _add_planned(sub, PLANNED)
    add_agent_commands(sub)
    bench = sub.add_parser("bench", help="benchmarks that print ratios against limits")
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCH")
    add_agent_bench_commands(bench_sub)
    add_controlplane_bench(bench_sub)
    _add_planned(bench_sub, PLANNED_BENCH, prefix="bench ")
    bench.set_defaults(func=_print_help_of(bench))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return func(args)


if __name__ == "__main__":
    raise SystemExit(main())
