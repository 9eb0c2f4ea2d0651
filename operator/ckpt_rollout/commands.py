"""`ckpt-rollout status|watch NAME`: read a CheckpointRollout with the user's kubeconfig."""

import argparse
import sys
import time
from typing import Any

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.vocabulary import ABORT_ANNOTATION, PROMOTE_ANNOTATION
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


def _patch(api: Any, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    obj: dict[str, Any] = api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body)
    return obj


def pause_command(args: argparse.Namespace) -> int:
    api, namespace = _api(args)
    _patch(api, namespace, args.name, {"spec": {"paused": True}})
    print(f"{args.name}: paused (in-flight loads finish; no new calls)")
    return 0


def resume_command(args: argparse.Namespace) -> int:
    api, namespace = _api(args)
    _patch(api, namespace, args.name, {"spec": {"paused": False}})
    print(f"{args.name}: resumed")
    return 0


def promote_command(args: argparse.Namespace) -> int:
    """Continue past the pauseAfterWave the rollout waits at (the last completed wave)."""
    api, namespace = _api(args)
    status = _get(api, namespace, args.name).get("status") or {}
    completed = int(status.get("currentWave") or 0)
    if completed == 0:
        print(f"{args.name}: no wave has completed yet; nothing to promote", file=sys.stderr)
        return 1
    _patch(api, namespace, args.name, {"metadata": {"annotations": {PROMOTE_ANNOTATION: str(completed - 1)}}})
    print(f"{args.name}: promoted past wave {completed}")
    return 0


def abort_command(args: argparse.Namespace) -> int:
    api, namespace = _api(args)
    version = (_get(api, namespace, args.name).get("spec") or {}).get("version")
    _patch(api, namespace, args.name, {"metadata": {"annotations": {ABORT_ANNOTATION: version}}})
    print(f"{args.name}: aborting {version}; updated workers go back to the previous version")
    return 0


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
    for name, func, text in (
        ("pause", pause_command, "pause a rollout: in-flight loads finish, no new calls"),
        ("resume", resume_command, "resume a paused rollout"),
        ("promote", promote_command, "continue past a pauseAfterWave"),
        ("abort", abort_command, "stop a rollout and roll updated workers back"),
    ):
        parser = sub.add_parser(name, help=text)
        _common(parser)
        parser.set_defaults(func=func)
