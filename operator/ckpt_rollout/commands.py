"""`ckpt-rollout status|watch NAME`: read a CheckpointRollout with the user's kubeconfig."""

import argparse
import sys
import time
from typing import Any

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_rollout.views import progress_line, status_table, watch_exit_code


def _api(args: argparse.Namespace) -> tuple[Any, str]:
    from kubernetes import client, config

    config.load_kube_config(context=args.context)
    namespace = args.namespace
    if namespace is None:
        _, active = config.list_kube_config_contexts()
        namespace = (active or {}).get("context", {}).get("namespace") or "default"
    return client.CustomObjectsApi(), namespace


def _get(api: Any, namespace: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    return obj


def status_command(args: argparse.Namespace) -> int:
    api, namespace = _api(args)
    print(status_table(_get(api, namespace, args.name)))
    return 0


def watch_command(args: argparse.Namespace) -> int:
    api, namespace = _api(args)
    deadline = time.monotonic() + args.timeout if args.timeout else None
    tty = sys.stdout.isatty()
    last = ""
    while True:
        obj = _get(api, namespace, args.name)
        line = progress_line(obj)
        if line != last:
            sys.stdout.write(("\r\033[K" if tty else "") + line + ("" if tty else "\n"))
            sys.stdout.flush()
            last = line
        code = watch_exit_code(obj)
        if code is not None:
            if tty:
                sys.stdout.write("\n")
            message = (obj.get("status") or {}).get("message")
            if message:
                print(message)
            return code
        if deadline is not None and time.monotonic() > deadline:
            print(f"\nwatch: timed out after {args.timeout}s", file=sys.stderr)
            return 2
        time.sleep(args.interval)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="CheckpointRollout name")
    parser.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    parser.add_argument("--context", help="kubeconfig context")


def add_commands(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    status = sub.add_parser("status", help="show a rollout's waves, workers and conditions")
    _common(status)
    status.set_defaults(func=status_command)
    watch = sub.add_parser("watch", help="follow a rollout until it ends (exit 1 if it fails)")
    _common(watch)
    watch.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    watch.add_argument("--timeout", type=float, default=0, help="give up after N seconds (0: never)")
    watch.set_defaults(func=watch_command)
