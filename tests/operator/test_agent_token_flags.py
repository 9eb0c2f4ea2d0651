"""The operator's agent-credential flags: minted per-namespace tokens, or the legacy file."""

from __future__ import annotations

import pytest

from ckpt_cli.entry import build_parser
from ckpt_rollout.controller.config import OperatorConfig, config_from_args


def _config(*argv: str) -> OperatorConfig:
    return config_from_args(build_parser().parse_args(["operator", *argv]))


@pytest.mark.parametrize(
    ("argv", "account", "file", "seconds"),
    [
        (["--agent-token-serviceaccount", "sys/op"], ("sys", "op"), None, 3600),
        (["--agent-token-serviceaccount=sys/op", "--agent-token-seconds=900"], ("sys", "op"), None, 900),
        (["--agent-token-file", "/t"], None, "/t", 3600),
        ([], None, None, 3600),
    ],
)
def test_agent_credential_flags(
    argv: list[str], account: tuple[str, str] | None, file: str | None, seconds: int
) -> None:
    config = _config(*argv)
    assert (config.agent_token_service_account, config.agent_token_file) == (account, file)
    assert config.agent_token_seconds == seconds


def test_the_account_comes_from_the_flag_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # The chart passes every setting as a flag; the environment variables once read beside
    # them are gone, so one left in a pod's env changes nothing.
    monkeypatch.setenv("CKPT_AGENT_TOKEN_SERVICEACCOUNT", "ckpt-rollout-system/ckpt-rollout")
    assert _config().agent_token_service_account is None
    flagged = _config("--agent-token-serviceaccount", "ckpt-rollout-system/ckpt-rollout")
    assert flagged.agent_token_service_account == ("ckpt-rollout-system", "ckpt-rollout")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--agent-token-serviceaccount", "op"], "NAMESPACE/NAME"),
        (["--agent-token-seconds", "60"], "between 600 and 86400"),
        (["--agent-token-serviceaccount", "a/b", "--agent-token-file", "/t"], "not allowed with"),
    ],
)
def test_bad_credential_flags_stop_the_start(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        _config(*argv)
    assert message in capsys.readouterr().err
