"""Operator settings: command-line flags, each with an environment variable for the chart."""

import argparse
import os
import re
from dataclasses import dataclass, field

from ckpt_api.constants import DEFAULT_AGENT_AUDIENCE
from ckpt_api.source_policy import SourcePolicy, parse_rule
from ckpt_api.spec import PROMETHEUS_ADDRESS_PATTERN
from ckpt_rollout.world import Tuning


@dataclass
class OperatorConfig:
    namespaces: list[str] = field(default_factory=list)  # empty: all namespaces
    liveness_host: str = "0.0.0.0"
    liveness_port: int = 8080
    metrics_port: int = 9090
    agent_token_file: str | None = None
    agent_audience: str = DEFAULT_AGENT_AUDIENCE
    agent_timeout_s: float = 10.0
    watch_server_timeout_s: int = 300
    leader_election: bool = False
    lease_namespace: str | None = None
    log_format: str = "text"
    tuning: Tuning = field(default_factory=Tuning)
    # Sources a rollout may name (ckpt_api.source_policy); others are Stalled as InvalidSource.
    source_policy: SourcePolicy = field(default_factory=SourcePolicy)


def source_rules(value: str) -> list[str]:
    """--allowed-sources: comma-separated rules, each checked here so a typo stops the start."""
    rules = [r.strip() for r in value.split(",") if r.strip()]
    for rule in rules:
        try:
            parse_rule(rule)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return rules


def prometheus_url(value: str) -> str | None:
    """--prometheus-url: what spec.strategy.analysis.prometheusAddress accepts ("": none)."""
    if not value:
        return None
    if not re.fullmatch(PROMETHEUS_ADDRESS_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s)://host[:port][/path] URL")
    return value


def add_operator_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        default=None,
        help="watch only this namespace (repeatable); env CKPT_NAMESPACES (comma list)",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    parser.add_argument("--liveness-host", default=env("CKPT_LIVENESS_HOST", "0.0.0.0"))
    parser.add_argument("--liveness-port", type=int, default=int(env("CKPT_LIVENESS_PORT", "8080")))
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=int(env("CKPT_METRICS_PORT", "9090")),
        help="Prometheus metrics port; 0 disables",
    )
    parser.add_argument(
        "--agent-token-file",
        default=env("CKPT_AGENT_TOKEN_FILE"),
        help="projected service-account token presented to agents",
    )
    parser.add_argument("--agent-audience", default=env("CKPT_AGENT_AUDIENCE", DEFAULT_AGENT_AUDIENCE))
    parser.add_argument(
        "--agent-timeout",
        type=float,
        default=float(env("CKPT_AGENT_TIMEOUT", "10")),
        help="seconds for one HTTP call to an agent",
    )
    parser.add_argument(
        "--prometheus-url",
        type=prometheus_url,
        default=env("CKPT_PROMETHEUS_URL", ""),
        help="Prometheus for spec.strategy.analysis when a CR names none; env CKPT_PROMETHEUS_URL",
    )
    parser.add_argument(
        "--allowed-sources",
        type=source_rules,
        default=env("CKPT_ALLOWED_SOURCES", ""),
        help="comma-separated scheme://host[:port][/path] rules a rollout's source.uri must match "
        "(host: a name, *.domain, * or a CIDR); default any; env CKPT_ALLOWED_SOURCES",
    )
    parser.add_argument(
        "--allow-link-local-sources",
        action="store_true",
        default=env("CKPT_ALLOW_LINK_LOCAL_SOURCES", "") == "true",
        help="let rollouts name link-local sources (169.254.0.0/16, fe80::/10: cloud metadata)",
    )
    parser.add_argument(
        "--leader-election", action="store_true", default=env("CKPT_LEADER_ELECTION", "") == "true"
    )
    parser.add_argument("--lease-namespace", default=env("CKPT_LEASE_NAMESPACE") or env("POD_NAMESPACE"))
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=env("CKPT_LOG_FORMAT", "text"),
        help="json: one object per line (kopf's JSON format); env CKPT_LOG_FORMAT",
    )


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    namespaces = args.namespaces
    if namespaces is None and not args.all_namespaces:
        namespaces = [n for n in os.environ.get("CKPT_NAMESPACES", "").split(",") if n]
    return OperatorConfig(
        namespaces=namespaces or [],
        liveness_host=args.liveness_host,
        liveness_port=args.liveness_port,
        metrics_port=args.metrics_port,
        agent_token_file=args.agent_token_file,
        agent_audience=args.agent_audience,
        agent_timeout_s=args.agent_timeout,
        leader_election=args.leader_election,
        lease_namespace=args.lease_namespace,
        log_format=args.log_format,
        tuning=Tuning(prometheus_url=args.prometheus_url),
        source_policy=SourcePolicy.parse(
            args.allowed_sources, allow_link_local=args.allow_link_local_sources
        ),
    )
