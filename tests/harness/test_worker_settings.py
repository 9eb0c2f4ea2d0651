"""The e2e workers' settings: the file the chart renders for a test namespace and the flags the
local provider's agent processes get say the same, and the agent's model takes both."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from ckpt_agent.cli import agent_settings as settings_of
from ckpt_agent.cli import build_parser
from ckpt_agent.settings import AgentSettings
from ckpt_e2e.pki import CertPair
from ckpt_e2e.rollout_env import EXAMPLE_RELAY, agent_settings, pod_flags, settings_as_flags

TLS = (CertPair(Path("/tls/tls.crt"), Path("/tls/tls.key")), Path("/tls/ca.crt"))


@pytest.mark.parametrize(
    ("allowed", "relay", "tls"),
    [(None, EXAMPLE_RELAY, None), ("system:serviceaccount:ops:op", EXAMPLE_RELAY, TLS), (None, None, TLS)],
)
def test_the_file_and_the_flags_are_the_same_settings(
    tmp_path: Path,
    allowed: str | None,
    relay: tuple[str, str | None] | None,
    tls: tuple[CertPair, Path] | None,
) -> None:
    settings = agent_settings("http://src:8080", allowed, relay, tls, audience="ckpt-rollout-agent/ns")
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(settings))
    from_file = settings_of(build_parser().parse_args(["agent", "--config", str(path)]), {})
    from_flags = settings_of(build_parser().parse_args(["agent", *settings_as_flags(settings)]), {})
    assert from_file == from_flags == AgentSettings.model_validate(settings)
    assert from_file.plain_http is (tls is None)


def test_pod_flags_override_the_file(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(
        yaml.safe_dump(agent_settings("http://src:8080", None, audience="a") | {"parallelism": 2})
    )
    argv = ["agent", "--config", str(path), *pod_flags("$(POD_IP)", "v1", ["--parallelism", "4"])]
    args = build_parser().parse_args(argv)
    assert (args.host, settings_of(args, {}).initial_version, settings_of(args, {}).parallelism) == (
        "$(POD_IP)",
        "v1",
        4,
    )
