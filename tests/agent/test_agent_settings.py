"""The agent's settings model: flag > --config file > default, bad files refused by key, and the
committed JSON schema equal to the model's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckpt_agent.cli import build_parser, config_from_args
from ckpt_agent.settings import AgentSettings, settings_reference_markdown, settings_schema

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_FILE = ROOT / "worker_image" / "agent-settings.schema.json"
FILE = {"chunk_mb": 8, "engine": "null", "relay": False}
SOURCES = {"allowed_sources": ["http://a:1", "http://b:2"]}


def _config(
    tmp_path: Path, file: dict[str, Any] | None, flags: list[str], env: dict[str, str] | None = None
) -> Any:
    argv = ["agent", *flags]
    if file is not None:
        path = tmp_path / "agent.yaml"
        path.write_text(_yaml(file))
        argv += ["--config", str(path)]
    return config_from_args(build_parser().parse_args(argv), env or {})


def _yaml(data: dict[str, Any]) -> str:
    import yaml

    return yaml.safe_dump(data)


@pytest.mark.parametrize(
    ("file", "flags", "expect"),
    [
        # default (nothing given), file over default, flag over file, flag over default
        (None, [], {"chunk_bytes": 4 << 20, "engine": "paddle", "relay": True, "parallelism": 1}),
        (FILE, [], {"chunk_bytes": 8 << 20, "engine": "null", "relay": False}),
        (FILE, ["--chunk-mb", "2", "--relay"], {"chunk_bytes": 2 << 20, "engine": "null", "relay": True}),
        ({"parallelism": 3}, ["--engine", "sglang"], {"parallelism": 3, "engine": "sglang"}),
        # a store_true flag given wins over the file's false; not given, the file's true stands
        ({"no_auth": True}, [], {"auth_disabled": True}),
        ({"no_auth": False}, ["--no-auth"], {"auth_disabled": True}),
        # lists: the file's YAML list, the flag's comma-separated one
        (SOURCES, [], {"allowed_sources": ("http://a:1", "http://b:2")}),
        (SOURCES, ["--allowed-sources", "http://c:3, http://d:4"], {"allowed_sources": ("http://c:3", "http://d:4")}),
        ({"tls_cert_file": "/etc/tls/tls.crt"}, [], {"tls_cert": Path("/etc/tls/tls.crt")}),
        ({"idle_timeout": 5}, ["--max-connections", "32"], {"idle": 5.0, "max_connections": 32}),
    ],
)  # fmt: skip
def test_a_flag_beats_the_file_which_beats_the_default(
    tmp_path: Path, file: dict[str, Any] | None, flags: list[str], expect: dict[str, Any]
) -> None:
    config = _config(tmp_path, file, flags)
    seen = {
        "chunk_bytes": config.chunk_bytes,
        "engine": config.engine,
        "relay": config.relay,
        "parallelism": config.parallelism,
        "auth_disabled": config.auth.disabled,
        "allowed_sources": config.allowed_sources,
        "tls_cert": config.tls.cert_file,
        "idle": config.connections.idle_timeout_s,
        "max_connections": config.connections.max_connections,
    }
    assert {key: seen[key] for key in expect} == expect


def test_a_json_file_reads_like_yaml(tmp_path: Path) -> None:
    path = tmp_path / "agent.json"
    path.write_text(json.dumps({"engine": "null", "metrics_port": 0}))
    config = config_from_args(build_parser().parse_args(["agent", "--config", str(path)]), {})
    assert (config.engine, config.metrics_port) == ("null", None)


def test_log_format_env_sits_between_the_flag_and_the_file(tmp_path: Path) -> None:
    from ckpt_agent.cli import agent_settings

    path = tmp_path / "agent.yaml"
    path.write_text("log_format: text\n")
    env = {"CKPT_LOG_FORMAT": "json"}
    from_file = build_parser().parse_args(["agent", "--config", str(path)])
    flagged = build_parser().parse_args(["agent", "--config", str(path), "--log-format", "text"])
    assert agent_settings(from_file, env).log_format == "json"
    assert agent_settings(flagged, env).log_format == "text"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("chunk_mbs: 8\n", "key 'chunk_mbs' in"),
        ("chunk_mb: 8\nrelay_moon: tcp\n", "'relay_moon'"),
        ("port: not-a-port\n", "key 'port' in"),
        ("engine: tensorrt\n", "key 'engine' in"),
        ("allowed_sources: http://a:1\n", "key 'allowed_sources' in"),
        ("- port\n- 1\n", "must hold a mapping"),
        ("port: [1\n", "is not YAML or JSON"),
    ],
)
def test_a_bad_file_stops_the_agent_with_the_key_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    args = build_parser().parse_args(["agent", "--no-auth", "--plain-http", "--config", str(path)])
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("ckpt-rollout agent: ")
    assert message in err
    assert "Traceback" not in err


def test_a_missing_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["agent", "--config", str(tmp_path / "absent.yaml")])
    assert args.func(args) == 2
    assert "absent.yaml" in capsys.readouterr().err


def test_every_setting_has_a_description_and_a_flag() -> None:
    parser = build_parser()
    for key, info in AgentSettings.model_fields.items():
        assert info.description, key
    flags = {
        option
        for action in parser._subparsers._group_actions[0].choices["agent"]._actions  # type: ignore[union-attr]
        for option in action.option_strings
    }
    assert {"--" + key.replace("_", "-") for key in AgentSettings.model_fields} <= flags


def test_committed_schema_matches_the_model() -> None:
    assert json.loads(SCHEMA_FILE.read_text()) == settings_schema(), "run `make crds` and commit the result"


def test_reference_table_has_a_row_per_setting() -> None:
    table = settings_reference_markdown().splitlines()
    assert table[0] == "| Key | Flag | Default | Meaning |"
    assert len(table) == 2 + len(AgentSettings.model_fields)
    assert "| `chunk_mb` | `--chunk-mb` | `4` | read size per transport call (MiB) |" in table


def test_agent_config_built_in_code_starts_from_the_same_defaults() -> None:
    from ckpt_agent.config import AgentConfig

    assert config_from_args(build_parser().parse_args(["agent"]), {}) == AgentConfig()
