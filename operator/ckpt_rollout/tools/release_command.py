"""`ckpt-rollout release VERSION --from DIR --rollout NAME -n NS`: ckpt_rollout.tools.client.release
from a shell. Prints the one-line summary; mistakes end in one line on stderr and an exit code:

    0  the fleet serves VERSION (--no-wait: VERSION is the target)
    1  the rollout failed, rolled back or stalled: the CR's reason and message
    2  usage error, or a checkpoint, version or CR release cannot work with (nothing changed)
    3  no usable kubeconfig, or the apiserver cannot be reached
    4  the CheckpointRollout does not exist
    6  the apiserver refused the request (e.g. RBAC)
    7  timed out: the rollout goes on (nothing is undone)
  130  interrupted

3, 4 and 6 mean what they mean for every user command; a timeout gets a code of its own (watch
reuses 2) so a training loop can tell "still rolling out" from "called it wrong".
"""

from __future__ import annotations

import argparse
import sys

from ckpt_rollout.tools.actions import EXIT_INTERRUPTED


def release_command(args: argparse.Namespace) -> int:
    from ckpt_rollout.tools.client import ReleaseError, VersionSet, release
    from ckpt_rollout.tools.release import ConfigMapKey

    try:
        result = release(
            args.version,
            source_dir=args.source_dir,
            rollout=args.rollout,
            namespace=args.namespace,
            wait=args.wait,
            timeout=args.timeout,
            publish_root=args.publish_root,
            link=args.link,
            kubeconfig=args.kubeconfig,
            context=args.context,
            progress=True,
        )
    except ReleaseError as exc:
        print(f"ckpt-rollout release: {exc}", file=sys.stderr)
        return exc.code
    except KeyboardInterrupt:
        print("ckpt-rollout release: interrupted (a version already set keeps rolling out)", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(result, VersionSet):
        where = "its ConfigMap" if isinstance(result.target, ConfigMapKey) else "spec.version"
        print(
            f"release {result.version} -> {result.namespace}/{result.rollout}: set in {where} (not waiting)"
        )
    else:
        print(result.summary)
    return 0


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "release",
        help="publish a checkpoint, make it a rollout's target and wait until the fleet serves it",
        description="Publish DIR as VERSION into the rollout's source, set VERSION as its target "
        "(in the ConfigMap its spec.versionFrom names, else spec.version) and wait for Complete. "
        "Exit 0 done, 1 the rollout failed (its reason printed), 2 usage, 3 no cluster, 4 no such "
        "rollout, 6 refused by the apiserver, 7 timed out.",
    )
    p.add_argument("version", metavar="VERSION")
    p.add_argument(
        "--from",
        dest="source_dir",
        metavar="DIR",
        help="checkpoint to publish (HF model directory, .safetensors file, paddle state dict); "
        "without it VERSION must be published already",
    )
    p.add_argument("--rollout", required=True, metavar="NAME", help="CheckpointRollout name")
    p.add_argument(
        "--publish-root",
        metavar="DIR",
        help="directory the source serves (needed for http(s) and mooncake sources; default for "
        "file:// sources: the URI's path)",
    )
    p.add_argument("--link", action="store_true", help="hard-link files into the version (same filesystem)")
    p.add_argument(
        "--wait", action=argparse.BooleanOptionalAction, default=True, help="wait until it ends (default)"
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="give up waiting after S seconds (default: the CR's progressDeadlineSeconds + 60)",
    )
    p.add_argument("-n", "--namespace", help="namespace (default: the kubeconfig context's)")
    p.add_argument("--context", help="kubeconfig context")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    p.set_defaults(func=release_command)
