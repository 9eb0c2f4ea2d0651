"""The operator image and the chart's Deployment agree: user, entrypoint, flags."""

from __future__ import annotations

import json

import pytest
from chart_render import ROOT, Helm, Obj

from ckpt_cli.entry import build_parser
from ckpt_e2e.dockerfile import instructions

DOCKERFILE = ROOT / "operator" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    return [(ins.word, ins.rest) for ins in instructions(DOCKERFILE)]


def test_image_is_slim_python_and_runs_as_the_charts_user(helm: Helm) -> None:
    instructions = _instructions()
    # The official slim image by default; e2e builds swap in a Debian-bootstrapped base (same ARG).
    args = dict(rest.split("=", 1) for word, rest in instructions if word == "ARG" and "=" in rest)
    assert args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"
    bases = [rest.split()[0] for word, rest in instructions if word == "FROM"]
    assert bases == ["${PYTHON_IMAGE}"] * 2, bases
    final_stage = instructions[max(i for i, (w, _) in enumerate(instructions) if w == "FROM") :]
    users = [rest for word, rest in final_stage if word == "USER"]
    pod = helm.template().one("Deployment")["spec"]["template"]["spec"]
    context = pod["securityContext"]
    assert users == [f"{context['runAsUser']}:{context['runAsGroup']}"]
    entrypoint = [json.loads(rest) for word, rest in final_stage if word == "ENTRYPOINT"]
    assert entrypoint == [["ckpt-rollout", "operator"]]


@pytest.mark.parametrize(
    "values",
    [
        {},
        {
            "watchNamespaces": ["a", "b"],
            "leaderElection": {"enabled": True},
            "extraArgs": ["--agent-timeout=20"],
        },
    ],
    ids=["all-namespaces", "namespaces-and-leader-election"],
)
def test_the_operator_cli_accepts_the_charts_args(helm: Helm, values: Obj) -> None:
    container = helm.template(values).one("Deployment")["spec"]["template"]["spec"]["containers"][0]
    assert "command" not in container  # the image's entrypoint `ckpt-rollout operator` runs
    args = build_parser().parse_args(["operator", *container["args"]])
    # The operator mints its agents' tokens for its own ServiceAccount (the chart's default).
    assert args.agent_token_serviceaccount == ("ops", "rel-ckpt-rollout")
    assert args.agent_token_file is None
    assert args.agent_audience == "ckpt-rollout-agent"
    assert args.liveness_port == 8080
    assert args.metrics_port == 9090
    if values:
        assert args.namespaces == ["a", "b"]
        assert args.leader_election is True
        assert args.lease_namespace == "ops"
    else:
        assert args.all_namespaces is True
