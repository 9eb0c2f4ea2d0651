"""`ckpt-rollout status|watch|pause|resume|promote|abort NAME`: a CheckpointRollout through the
user's kubeconfig, the kubectl way (`--kubeconfig`, `--context`, `-n`, `-o`).

Everyday mistakes end in one line on stderr and an exit code, never a traceback:

    0  done (watch: the rollout succeeded)
    1  watch: the rollout ended Failed or RolledBack
    2  usage error; watch timed out
    3  no usable kubeconfig, or the apiserver cannot be reached
    4  the CheckpointRollout does not exist
    5  refused: the rollout is not in a state the command applies to (promote: not paused after
       a wave; retry: not Failed or RolledBack)
    6  the apiserver refused the request (e.g. RBAC)
  130  interrupted (Ctrl-C)
"""

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

from ckpt_api.constants import GROUP, PLURAL, VERSION
from ckpt_api.vocabulary import ABORT_ANNOTATION, FAILED_PHASES, PROMOTE_ANNOTATION, RETRY_ANNOTATION, Phase
from ckpt_rollout.views import progress_line, status_table, watch_exit_code

EXIT_UNREACHABLE, EXIT_NOT_FOUND, EXIT_REFUSED, EXIT_API_ERROR, EXIT_INTERRUPTED = 3, 4, 5, 6, 130


class CommandError(Exception):
    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def _api(args: argparse.Namespace) -> tuple[Any, str]:
    from kubernetes import client, config

    try:
        config.load_kube_config(config_file=args.kubeconfig, context=args.context)
        namespace = args.namespace
        if namespace is None:
            _, active = config.list_kube_config_contexts(config_file=args.kubeconfig)
            namespace = (active or {}).get("context", {}).get("namespace") or "default"
    except (config.ConfigException, OSError) as exc:
        raise CommandError(f"no usable kubeconfig: {exc}", EXIT_UNREACHABLE) from None
    return client.CustomObjectsApi(), namespace


def _request(what: str, namespace: str, name: str, call: Callable[[], Any]) -> dict[str, Any]:
    """One API call, its failures as CommandErrors."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        obj: dict[str, Any] = call()
        return obj
    except ApiException as exc:
        if exc.status == 404:
            raise CommandError(f"checkpointrollout {namespace}/{name} not found", EXIT_NOT_FOUND) from None
        reason = _api_message(exc)
        raise CommandError(
            f"{what} {namespace}/{name}: HTTP {exc.status}: {reason}", EXIT_API_ERROR
        ) from None
    except (HTTPError, OSError) as exc:
        raise CommandError(f"cannot reach the apiserver: {_first_line(exc)}", EXIT_UNREACHABLE) from None


def _api_message(exc: Any) -> str:
    try:
        return str(json.loads(exc.body).get("message") or exc.reason)
    except (TypeError, ValueError, AttributeError):
        return str(exc.reason)


def _first_line(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]


def _get(api: Any, namespace: str, name: str) -> dict[str, Any]:
    return _request(
        "get",
        namespace,
        name,
        lambda: api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name),
    )


def _patch(api: Any, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
    return _request(
        "patch",
        namespace,
        name,
        lambda: api.patch_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name, body),
    )


def status_command(args: argparse.Namespace) -> int:
    api, namespace = _api(args)
    obj = _get(api, namespace, args.name)
    if args.output == "json":
        print(json.dumps(obj, indent=2, sort_keys=True))
    elif args.output == "yaml":
        import yaml

        print(yaml.safe_dump(obj, sort_keys=True), end="")
    else:
        print(status_table(obj, wide=args.output == "wide"))
    return 0


def watch_command(args: argparse.Namespace) -> int:
    """Follow the rollout through the watch API (each change is pushed, no polling) until it
    ends or --timeout passes."""
    api, namespace = _api(args)
    obj = _get(api, namespace, args.name)
    deadline = time.monotonic() + args.timeout if args.timeout else None
    tty = sys.stdout.isatty()
    last = ""
    while True:
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
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            print(f"\nwatch: timed out after {args.timeout}s", file=sys.stderr)
            return 2
        obj = _next_change(api, namespace, args.name, obj, left) or obj


def _next_change(
    api: Any, namespace: str, name: str, obj: dict[str, Any], left: float | None
) -> dict[str, Any] | None:
    """The object after its next change, or None if none came within ``left`` (at most a minute:
    then the caller looks again)."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    wait_s = max(1, int(min(left if left is not None else 60.0, 60.0)))
    version = (obj.get("metadata") or {}).get("resourceVersion")

    def first_event() -> Any:
        stream = watch.Watch().stream(
            api.list_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            field_selector=f"metadata.name={name}",
            resource_version=version,
            timeout_seconds=wait_s,
        )
        try:
            for event in stream:
                return event
        except ApiException as exc:
            if exc.status == 410:  # our version is too old to watch from
                return {"type": "GONE"}
            raise
        return None

    event = _request("watch", namespace, name, first_event)
    if event is None:
        return None
    if event.get("type") in ("GONE", "ERROR"):  # start over from the object as it is now
        return _get(api, namespace, name)
    if event.get("type") == "DELETED":
        raise CommandError(f"checkpointrollout {namespace}/{name} was deleted", EXIT_NOT_FOUND)
    changed: dict[str, Any] = event.get("object") or {}
    return changed


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
    obj = _get(api, namespace, args.name)
    status = obj.get("status") or {}
    phase = status.get("phase")
    if phase != Phase.PAUSED or (obj.get("spec") or {}).get("paused"):
        why = "spec.paused is set: use resume" if phase == Phase.PAUSED else f"phase is {phase or 'unknown'}"
        raise CommandError(f"{args.name}: not paused after a wave ({why}); nothing to promote", EXIT_REFUSED)
    completed = int(status.get("currentWave") or 0)
    _patch(api, namespace, args.name, {"metadata": {"annotations": {PROMOTE_ANNOTATION: str(completed - 1)}}})
    print(f"{args.name}: promoted past wave {completed}")
    return 0


def abort_command(args: argparse.Namespace) -> int:
    api, namespace = _api(args)
    version = (_get(api, namespace, args.name).get("spec") or {}).get("version")
    _patch(api, namespace, args.name, {"metadata": {"annotations": {ABORT_ANNOTATION: version}}})
    print(f"{args.name}: aborting {version}; updated workers go back to the previous version")
    return 0


def retry_command(args: argparse.Namespace) -> int:
    """Roll the same version out again after it ended Failed or RolledBack."""
    api, namespace = _api(args)
    obj = _get(api, namespace, args.name)
    phase = (obj.get("status") or {}).get("phase")
    if phase not in FAILED_PHASES:
        raise CommandError(
            f"{args.name}: phase is {phase or 'unknown'}; only a Failed or RolledBack rollout is retried",
            EXIT_REFUSED,
        )
    token = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) + f".{time.time_ns() % 1_000_000:06d}"
    _patch(api, namespace, args.name, {"metadata": {"annotations": {RETRY_ANNOTATION: token}}})
    version = (obj.get("spec") or {}).get("version")
    print(f"{args.name}: retrying {version} (was {phase})")
    return 0


def _guarded(func: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except CommandError as exc:
            print(f"ckpt-rollout {args.command}: {exc}", file=sys.stderr)
            return exc.code
        except KeyboardInterrupt:
            print("", file=sys.stderr)
            return EXIT_INTERRUPTED

    return run


def _common(parser: argparse.ArgumentParser) -> None:
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
    for name, func, text in (
        ("pause", pause_command, "pause a rollout: in-flight loads finish, no new calls"),
        ("resume", resume_command, "resume a paused rollout"),
        ("promote", promote_command, "continue past a pauseAfterWave (refused unless paused there)"),
        ("abort", abort_command, "stop a rollout and roll updated workers back"),
        ("retry", retry_command, "roll the same version out again after Failed or RolledBack"),
    ):
        parser = sub.add_parser(name, help=text)
        _common(parser)
        parser.set_defaults(func=_guarded(func))
