"""`ckpt-rollout tls-secrets --namespace NS`: prints the agents' TLS Secrets for `kubectl apply
-f -` (ckpt_rollout.tools.tls_secrets makes them; imported only when the command runs).

Exit codes: 0 printed; 2 usage, or a --ca-from that holds no usable CA.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from ckpt_api.tls import AGENT_CA_SECRET, AGENT_TLS_SECRET

OPERATOR_NAMESPACE = "ckpt-rollout-system"
# The chart's agentTLS.caValidityDays and certValidityDays defaults.
CA_DAYS = 3650
CERT_DAYS = 365
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def tls_secrets_command(args: argparse.Namespace) -> int:
    from ckpt_rollout.tools.tls_secrets import CAError, ca_from_secret, render

    ca = None
    if args.ca_from is not None:
        try:
            text = sys.stdin.read() if args.ca_from == "-" else Path(args.ca_from).read_text()
            ca = ca_from_secret(text)
        except (OSError, CAError) as exc:
            print(f"ckpt-rollout tls-secrets: --ca-from {args.ca_from}: {exc}", file=sys.stderr)
            return 2
    sys.stdout.write(
        render(
            args.namespaces,
            operator_namespace=args.operator_namespace,
            ca=ca,
            cert_days=args.cert_days,
            ca_days=args.ca_days,
        )
    )
    return 0


def _namespace(text: str) -> str:
    if not _DNS_LABEL.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a namespace name (a DNS label)")
    return text


def _days(text: str) -> int:
    days = int(text)
    if days < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return days


def add_command(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "tls-secrets",
        help="print the agents' TLS Secrets (a CA and a serving certificate per worker namespace)",
        description="Print, for `kubectl apply -f -`, the Secrets agent TLS needs without cert-manager: "
        f"{AGENT_CA_SECRET} (the CA; the operator mounts its ca.crt) in the operator's namespace and "
        f"{AGENT_TLS_SECRET} (for ckpt-rollout-agent.NS.svc) in each worker namespace. Without "
        "--ca-from a new CA is made: apply its Secret with the serving ones.",
    )
    p.add_argument(
        "-n",
        "--namespace",
        dest="namespaces",
        type=_namespace,
        action="append",
        required=True,
        metavar="NS",
        help="a worker namespace (repeat for several)",
    )
    p.add_argument(
        "--operator-namespace",
        type=_namespace,
        default=OPERATOR_NAMESPACE,
        metavar="NS",
        help=f"where the operator runs (default {OPERATOR_NAMESPACE})",
    )
    p.add_argument(
        "--ca-from",
        metavar="FILE",
        help=f"sign with the CA of this Secret ('-': stdin), e.g. `kubectl -n {OPERATOR_NAMESPACE} get "
        f"secret {AGENT_CA_SECRET} -o yaml`",
    )
    p.add_argument(
        "--cert-days",
        type=_days,
        default=CERT_DAYS,
        metavar="N",
        help=f"serving certificates' lifetime (default {CERT_DAYS})",
    )
    p.add_argument(
        "--ca-days", type=_days, default=CA_DAYS, metavar="N", help=f"a new CA's lifetime (default {CA_DAYS})"
    )
    p.set_defaults(func=tls_secrets_command)
