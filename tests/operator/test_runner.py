"""`ckpt-rollout operator` start-up, without a cluster."""

from __future__ import annotations

import os
import socket
from typing import Any

import pytest

from ckpt_cli.entry import build_parser
from ckpt_rollout.controller import runner
from ckpt_rollout.controller.config import config_from_args


def test_kopf_is_given_an_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without one kopf names itself user@host through getpass.getuser(), which raises KeyError
    for a uid with no passwd entry: the chart's 65532 in the operator image (found on the real
    node, e2e/tests/test_real_node.py), or any runAsUser a cluster assigns."""
    import kopf

    seen: dict[str, Any] = {}
    monkeypatch.setattr(kopf, "run", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(runner, "configure_logging", lambda log_format: None)  # the process's logging
    argv = ["operator", "--all-namespaces", "--metrics-port", "0", "--agent-plain-http"]
    args = build_parser().parse_args(argv)
    assert runner.run_operator(config_from_args(args)) == 0
    assert seen["identity"] == f"{socket.gethostname()}-{os.getpid()}"
