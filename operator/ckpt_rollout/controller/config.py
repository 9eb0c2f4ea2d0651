"""Operator settings: command-line flags (the chart passes them as the container's args)."""

import argparse
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from ckpt_api.constants import DEFAULT_AGENT_AUDIENCE
from ckpt_api.source_policy import SourcePolicy, SourceRule, parse_rule
from ckpt_api.spec import PROMETHEUS_ADDRESS_PATTERN
from ckpt_api.tls import ReloadingContext, TLSFileError, ca_context
from ckpt_rollout.domain.world import Tuning
from ckpt_rollout.io.agent_tokens import DEFAULT_TOKEN_SECONDS, parse_service_account


@dataclass
class OperatorConfig:
    namespaces: list[str] = field(default_factory=list)  # empty: all namespaces
    liveness_host: str = "0.0.0.0"
    liveness_port: int = 8080
    metrics_port: int = 9090
    # Legacy: one projected token presented to every namespace's agents.
    agent_token_file: str | None = None
    # Default mode: tokens of this ServiceAccount (namespace, name), minted per worker namespace
    # for the audience ckpt_api.constants.agent_audience(namespace, agent_audience).
    agent_token_service_account: tuple[str, str] | None = None
    agent_token_seconds: int = DEFAULT_TOKEN_SECONDS
    agent_audience: str = DEFAULT_AGENT_AUDIENCE
    agent_timeout_s: float = 10.0
    # Agents serve https with certificates from this CA, verified for their namespace's name
    # (ckpt_api.tls.agent_server_name); plain http only when asked for by name.
    agent_ca_file: str | None = None
    agent_plain_http: bool = False
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


def service_account(value: str) -> tuple[str, str] | None:
    """--agent-token-serviceaccount: NAMESPACE/NAME ("": none)."""
    if not value:
        return None
    try:
        return parse_service_account(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def token_seconds(value: str) -> int:
    """--agent-token-seconds: what a TokenRequest may ask for (the apiserver's minimum is 600)."""
    seconds = int(value)
    if not 600 <= seconds <= 86400:
        raise argparse.ArgumentTypeError(f"{seconds} is not between 600 and 86400 seconds")
    return seconds


def prometheus_url(value: str) -> str | None:
    """--prometheus-url: what spec.strategy.analysis.prometheusAddress accepts ("": none)."""
    if not value:
        return None
    if not re.fullmatch(PROMETHEUS_ADDRESS_PATTERN, value):
        raise argparse.ArgumentTypeError(f"{value!r} is not an http(s)://host[:port][/path] URL")
    return value


def prometheus_rules(value: str) -> tuple[SourceRule, ...]:
    """--allowed-prometheus: source-policy rules, http(s) only."""
    rules = []
    for text in (r.strip() for r in value.split(",")):
        if not text:
            continue
        try:
            rule = parse_rule(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).replace("source rule", "rule")) from None
        if rule.scheme not in ("http", "https"):
            raise argparse.ArgumentTypeError(f"{text!r}: Prometheus is reached over http or https")
        rules.append(rule)
    return tuple(rules)


def add_operator_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        default=None,
        help="watch only this namespace (repeatable)",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace (default)")
    parser.add_argument("--liveness-host", default="0.0.0.0")
    parser.add_argument("--liveness-port", type=int, default=8080)
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=9090,
        help="Prometheus metrics port; 0 disables",
    )
    tokens = parser.add_mutually_exclusive_group()
    tokens.add_argument(
        "--agent-token-serviceaccount",
        type=service_account,
        default=None,
        metavar="NAMESPACE/NAME",
        help="mint the token presented to agents per worker namespace with TokenRequest for this "
        "ServiceAccount (the operator's own), audience AUDIENCE/NAMESPACE: a token captured in one "
        "namespace opens no agent in another",
    )
    tokens.add_argument(
        "--agent-token-file",
        default=None,
        help="legacy: one projected token presented to the agents of every namespace",
    )
    parser.add_argument(
        "--agent-token-seconds",
        type=token_seconds,
        default=DEFAULT_TOKEN_SECONDS,
        help="lifetime asked for each minted agent token (renewed at 80%%)",
    )
    parser.add_argument(
        "--agent-audience",
        default=DEFAULT_AGENT_AUDIENCE,
        help="base of the agents' audiences (minted tokens: AUDIENCE/NAMESPACE)",
    )
    parser.add_argument(
        "--agent-timeout",
        type=float,
        default=10.0,
        help="seconds for one HTTP call to an agent",
    )
    tls = parser.add_mutually_exclusive_group()
    tls.add_argument(
        "--agent-ca-file",
        default=None,
        help="CA bundle agents' serving certificates chain to (https, verified for "
        "ckpt-rollout-agent.NAMESPACE.svc; re-read when it changes)",
    )
    tls.add_argument(
        "--agent-plain-http",
        action="store_true",
        help="call agents over plain http (agents run --plain-http; local development only)",
    )
    parser.add_argument(
        "--prometheus-url",
        type=prometheus_url,
        default=None,
        help="Prometheus for spec.strategy.analysis when a CR names none",
    )
    parser.add_argument(
        "--allowed-prometheus",
        type=prometheus_rules,
        default=(),
        help="comma-separated http(s)://host[:port][/path] rules a rollout's "
        "spec.strategy.analysis.prometheusAddress must match (host: a name, *.domain or a CIDR "
        "of addresses written as such); default: the --prometheus-url only",
    )
    parser.add_argument(
        "--allowed-sources",
        type=source_rules,
        default=[],
        help="comma-separated scheme://host[:port][/path] rules a rollout's source.uri must match "
        "(host: a name, *.domain, * or a CIDR); default any",
    )
    parser.add_argument(
        "--allow-link-local-sources",
        action="store_true",
        help="let rollouts name link-local sources (169.254.0.0/16, fe80::/10: cloud metadata)",
    )
    parser.add_argument("--leader-election", action="store_true")
    # The chart's pod gets POD_NAMESPACE from the downward API: --leader-election alone (in
    # extraArgs) takes the Lease in the operator's own namespace.
    parser.add_argument("--lease-namespace", default=os.environ.get("POD_NAMESPACE"))
    parser.add_argument(
        "--log-format",
        choices=("text", "json"),
        default="text",
        help="json: one object per line (kopf's JSON format)",
    )


def config_from_args(args: argparse.Namespace) -> OperatorConfig:
    return OperatorConfig(
        namespaces=args.namespaces or [],
        liveness_host=args.liveness_host,
        liveness_port=args.liveness_port,
        metrics_port=args.metrics_port,
        agent_token_file=args.agent_token_file,
        agent_token_service_account=args.agent_token_serviceaccount,
        agent_token_seconds=args.agent_token_seconds,
        agent_audience=args.agent_audience,
        agent_timeout_s=args.agent_timeout,
        agent_ca_file=args.agent_ca_file,
        agent_plain_http=args.agent_plain_http,
        leader_election=args.leader_election,
        lease_namespace=args.lease_namespace,
        log_format=args.log_format,
        tuning=Tuning(
            prometheus_url=args.prometheus_url,
            prometheus_allowed=args.allowed_prometheus,
            agent_tls=args.agent_ca_file is not None,
        ),
        source_policy=SourcePolicy.parse(
            args.allowed_sources, allow_link_local=args.allow_link_local_sources
        ),
    )


def agent_ca(config: OperatorConfig) -> ReloadingContext | None:
    """What agents' certificates must chain to (None: plain http, asked for by name). Raises
    SystemExit saying what to pass, or why the CA file cannot be used."""
    if config.agent_ca_file is None:
        if not config.agent_plain_http:
            raise SystemExit(
                "choose --agent-ca-file (agents serve https) or --agent-plain-http (the operator "
                "calls agents unencrypted only when told so)"
            )
        return None
    if config.agent_plain_http:
        raise SystemExit("--agent-ca-file and --agent-plain-http exclude each other")
    try:
        return ca_context(Path(config.agent_ca_file))
    except TLSFileError as exc:
        raise SystemExit(f"--agent-ca-file: {exc}") from None
