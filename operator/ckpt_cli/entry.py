"""`ckpt-rollout` (and `kubectl ckpt`): the parser over the installed command groups, `crd`,
`--version`, and how a command ends (an absent group's hint, a closed pipe). Groups import their
implementations lazily so `--help` and `crd` stay fast."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence

from ckpt_cli.groups import GROUPS, CommandGroup, absent_command, groups_for

Handler = Callable[[argparse.Namespace], int]
EXIT_CLOSED_PIPE = 141


def _crd(args: argparse.Namespace) -> int:
    from ckpt_api.crd import render_crd

    sys.stdout.write(render_crd())
    return 0


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("ckpt-rollout")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


def _prog() -> str:
    """`kubectl ckpt` when kubectl runs us as its plugin (the `kubectl-ckpt` script)."""
    return "kubectl ckpt" if sys.argv and sys.argv[0].endswith("kubectl-ckpt") else "ckpt-rollout"


def build_parser(groups: Sequence[CommandGroup] = GROUPS) -> argparse.ArgumentParser:
    absent = [g for g in groups if not g.installed()]
    epilog = "\n".join(f"not installed: {', '.join(g.commands)} (needs {g.install_hint})" for g in absent)
    parser = argparse.ArgumentParser(
        prog=_prog(),
        description="Roll model checkpoints out to a running inference fleet in place, in waves.",
        epilog=epilog or None,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    crd = sub.add_parser("crd", help="print the CheckpointRollout CRD (generated from the models)")
    crd.set_defaults(func=_crd)
    for group in groups:
        if group.installed():
            getattr(importlib.import_module(group.module), group.function)(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if (group := absent_command(args_list)) is not None:
        command = next(a for a in args_list if not a.startswith("-"))
        print(
            f"ckpt-rollout {command}: not installed here ({group.package} is absent); "
            f"needs {group.install_hint}",
            file=sys.stderr,
        )
        return 2
    parser = build_parser(groups_for(args_list))
    args = parser.parse_args(args_list)
    func: Handler | None = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    try:
        code = func(args)
        sys.stdout.flush()  # here, where a closed pipe can still be caught
    except BrokenPipeError:
        # The reader left (`ckpt-rollout status x | head -5`): what is left to print is nobody's.
        # Like a tool killed by SIGPIPE: exit 141 (128 + SIGPIPE), no traceback, and stdout
        # pointed at /dev/null so the interpreter's own flush at exit fails no more.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_CLOSED_PIPE
    return code
