"""`ckpt-rollout status|watch|pause|resume|promote|abort|retry NAME` and `ckpt-rollout dashboard`:
CheckpointRollouts through the user's kubeconfig, the kubectl way (`--kubeconfig`, `--context`,
`-n`, `-o`).

Everyday mistakes end in one line on stderr and an exit code, never a traceback:

    0  done (watch: the rollout succeeded)
    1  watch: the rollout ended Failed or RolledBack
    2  usage error; watch timed out
    3  no usable kubeconfig, or the apiserver cannot be reached
    4  the CheckpointRollout does not exist
    5  refused: the rollout is not in a state the command applies to (promote: not paused after
       a wave; promote --skip-analysis: no analysis running; retry: not Failed or RolledBack)
    6  the apiserver refused the request (e.g. RBAC)
  130  interrupted (Ctrl-C)
"""

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from ckpt_rollout.tools import actions
from ckpt_rollout.tools.actions import EXIT_INTERRUPTED, ActionError, Target
from ckpt_rollout.tools.views import status_table, watch_exit_code
from ckpt_rollout.tools.watchtable import change_lines, render_table, rollout_view

# Redraws the table from the top of a cleared screen.
_HOME_AND_CLEAR = "\033[H\033[2J"


def _target(args: argparse.Namespace) -> Target:
    return Target(kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace)


def status_command(args: argparse.Namespace) -> int:
    api, namespace = actions.connect(_target(args))
    obj = actions.get(api, namespace, args.name)
    if args.output == "json":
        print(json.dumps(obj, indent=2, sort_keys=True))
    elif args.output == "yaml":
        import yaml

        print(yaml.safe_dump(obj, sort_keys=True), end="")
    elif args.output == "wide":
        workers = rollout_view(obj, actions.selected_pods(api, namespace, obj))["workers"]
        print(status_table(obj, wide=True, workers=workers))
    else:
        print(status_table(obj))
    return 0


def watch_command(args: argparse.Namespace) -> int:
    """Follow the rollout through the watch API (each change is pushed, no polling) until it
    ends or --timeout passes: on a terminal a table redrawn on every change, otherwise one line
    per change."""
    api, namespace = actions.connect(_target(args))
    obj = actions.get(api, namespace, args.name)
    deadline = time.monotonic() + args.timeout if args.timeout else None
    tty = sys.stdout.isatty()
    shown: dict[str, Any] | None = None
    while True:
        view = rollout_view(obj)
        code = watch_exit_code(obj)
        # The outcome ends the output, as its last line, once.
        final = (obj.get("status") or {}).get("message") if code is not None else None
        if view != shown:
            if tty:
                sys.stdout.write(_HOME_AND_CLEAR + render_table(view) + "\n")
            else:
                lines = [line for line in change_lines(shown, view) if line != f"message: {final}"]
                sys.stdout.writelines(line + "\n" for line in lines)
            sys.stdout.flush()
            shown = view
        if code is not None:
            if final:
                print(final)
            return code
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            print(f"watch: timed out after {args.timeout}s", file=sys.stderr)
            return 2
        obj = actions.next_change(api, namespace, args.name, obj, left) or obj


def _action_command(action: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        api, namespace = actions.connect(_target(args))
        chosen = "skip-analysis" if getattr(args, "skip_analysis", False) else action
        print(actions.ACTIONS[chosen](api, namespace, args.name))
        return 0

    return run


def dashboard_command(args: argparse.Namespace) -> int:
    import asyncio

    from ckpt_rollout.tools.dashboard import serve

    target = Target(kubeconfig=args.kubeconfig, context=args.context, namespace=args.namespace)
    names = [n for n in (args.allowed_hosts or "").split(",") if n.strip()]
    return asyncio.run(serve(target, args.all_namespaces, args.address, args.port, names))


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except ActionError as exc:
            print(f"ckpt-rollout {args.command}: {exc}", file=sys.stderr)
            return exc.code
        except KeyboardInterrupt:
            print("", file=sys.stderr)
            return EXIT_INTERRUPTED

    return run


def _common(parser: argparse.ArgumentParser, *, named: bool = True) -> None:
    if named:
        parser.add_argument("name", help="CheckpointRollout name")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    parser.add_argument("--context", help="kubeconfig context")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG or ~/.kube/config)")


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    status = sub.add_parser("status", help="show a rollout's waves, workers and conditions")
    _common(status)
    status.add_argument(
        "-o", "--output", choices=("table", "wide", "json", "yaml"), default="table", help="output format"
    )
    status.set_defaults(func=_guarded(status_command))
    watch = sub.add_parser("watch", help="follow a rollout until it ends (exit 1 if it fails)")
    _common(watch)
    watch.add_argument("--timeout", type=float, default=0, help="give up after N seconds (0: never)")
    watch.set_defaults(func=_guarded(watch_command))
    dashboard = sub.add_parser(
        "dashboard",
        help="a local web page of the rollouts, live, with pause/resume/promote/abort/retry buttons",
        description="Serve a live web page of the CheckpointRollouts in a namespace and print its URL. "
        "The page acts with YOUR kubeconfig's credentials: anyone who can reach the address can "
        "pause, promote or abort rollouts as you, so it listens on 127.0.0.1 by default; "
        "bind another address only on a network you trust. Open the URL it prints on its second "
        "line: the token in its fragment is what lets the page read and act.",
    )
    _common(dashboard, named=False)
    dashboard.add_argument(
        "-A", "--all-namespaces", action="store_true", help="show the rollouts of every namespace"
    )
    dashboard.add_argument("--address", default="127.0.0.1", help="address to listen on (default: 127.0.0.1)")
    dashboard.add_argument("--port", type=int, default=0, help="port to listen on (default 0: a free one)")
    dashboard.add_argument(
        "--allowed-hosts",
        help="names (or addresses) the page may be opened by, comma-separated, besides the bound "
        "address; required with --address 0.0.0.0 or :: (other Host headers are answered 421)",
    )
    dashboard.set_defaults(func=_guarded(dashboard_command))
    for name, text in (
        ("pause", "pause a rollout: in-flight loads finish, no new calls"),
        ("resume", "resume a paused rollout"),
        ("promote", "continue past a pauseAfterWave (refused unless paused there)"),
        ("abort", "stop a rollout and roll updated workers back"),
        ("retry", "roll the same version out again after Failed or RolledBack"),
    ):
        parser = sub.add_parser(name, help=text)
        _common(parser)
        if name == "promote":
            parser.add_argument(
                "--skip-analysis",
                action="store_true",
                help="end the running analysis of a wave as Skipped instead (refused unless one runs); "
                "a plain promote never skips one",
            )
        parser.set_defaults(func=_guarded(_action_command(name)))
