"""`ckpt-rollout operator`: runs kopf with our handlers and settings."""

import argparse
import os
import socket
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    # kopf.run's parameter type, a NewType of str it does not export.
    from kopf._core.engines.peering import Identity

from ckpt_api import process_runtime
from ckpt_rollout.controller.config import OperatorConfig, add_operator_arguments, agent_ca, config_from_args


def configure_logging(log_format: str) -> None:
    """Before anything logs (leader election's first lines included); kopf.run keeps it."""
    import kopf

    kopf.configure(log_format=kopf.LogFormat.JSON if log_format == "json" else kopf.LogFormat.FULL)


def operator_identity() -> str:
    """<hostname>-<pid>: the pod name on Kubernetes, unique among replicas (the Lease holder's)."""
    return f"{socket.gethostname()}-{os.getpid()}"


def run_operator(config: OperatorConfig) -> int:
    import kopf

    from ckpt_rollout.controller import handlers  # noqa: F401  (importing registers the kopf handlers)

    configure_logging(config.log_format)
    agent_ca(config)  # a missing TLS choice or an unusable CA stops the start, not the first call

    if config.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(config.metrics_port, addr=config.liveness_host)
    if config.leader_election:
        from ckpt_rollout.controller.leader import LeaseElector, liveness_while_standby

        if not config.lease_namespace:
            raise SystemExit("--leader-election needs --lease-namespace (or POD_NAMESPACE)")
        elector = LeaseElector(config.lease_namespace)
        with liveness_while_standby(config.liveness_host, config.liveness_port):
            elector.acquire()
        elector.keep_renewing()
    process_runtime.tune_gc()
    kopf.run(
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        liveness_endpoint=f"http://{config.liveness_host}:{config.liveness_port}/healthz",
        # Leadership comes from our Lease, so kopf's own peering (its own CRDs) stays off.
        standalone=True,
        # Named here: kopf's default (user@host) asks getpass.getuser(), which raises for a uid
        # without a passwd entry, as the chart's 65532 is in the image and any runAsUser may be.
        identity=cast("Identity", operator_identity()),
        memo=kopf.Memo(config=config),
        loop=process_runtime.new_event_loop(),
    )
    return 0


def main(args: argparse.Namespace) -> int:
    return run_operator(config_from_args(args))


def add_command(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = sub.add_parser("operator", help="run the kopf operator")
    add_operator_arguments(parser)
    parser.set_defaults(func=main)
