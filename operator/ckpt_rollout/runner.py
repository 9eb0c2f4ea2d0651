"""`ckpt-rollout operator`: runs kopf with our handlers and settings."""

import argparse
import logging

from ckpt_rollout.config import OperatorConfig, add_operator_arguments, config_from_args


def run_operator(config: OperatorConfig) -> int:
    import kopf

    from ckpt_rollout import handlers  # noqa: F401  (importing registers the kopf handlers)

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    kopf.run(
        clusterwide=not config.namespaces,
        namespaces=config.namespaces,
        liveness_endpoint=f"http://{config.liveness_host}:{config.liveness_port}/healthz",
        standalone=not config.leader_election,
        memo=kopf.Memo(config=config),
    )
    return 0


def main(args: argparse.Namespace) -> int:
    return run_operator(config_from_args(args))


def add_command(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    parser = sub.add_parser("operator", help="run the kopf operator")
    add_operator_arguments(parser)
    parser.set_defaults(func=main)
