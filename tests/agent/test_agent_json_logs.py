"""`--log-format json` (env CKPT_LOG_FORMAT): the agent process writes one JSON object per line
with the operator's fields (kopf's JSON format: timestamp, severity, message), the "listening on"
line included; text stays the default."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest

from ckpt_agent.common.logformat import JsonFormatter, severity
from ckpt_e2e.procs import spawn, stop, wait_for

SEVERITIES = {"debug", "info", "warn", "error", "fatal"}


def _agent(tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> list[str]:
    """Start an agent (null engine, no auth), stop it once it listens; its output's lines."""
    log = tmp_path / "agent.log"
    proc = spawn(
        [sys.executable, "-m", "ckpt_agent", "agent", "--engine", "null", "--no-auth", "--plain-http",
         "--no-report", "--host", "127.0.0.1", "--port", "0", "--metrics-port", "0", *flags],
        log,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    try:
        wait_for(
            lambda: "listening on http://" in log.read_text() or proc.poll() is not None, 60, "the agent"
        )
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        stop(proc)
    return [line for line in log.read_text().splitlines() if line.strip()]


def test_json_lines_carry_the_operators_fields(tmp_path: Path) -> None:
    lines = _agent(tmp_path, env={"CKPT_LOG_FORMAT": "json"})
    records = [json.loads(line) for line in lines]  # every line, or this raises
    assert len(records) >= 2, lines
    for record in records:
        assert {"timestamp", "severity", "message"} <= set(record), record
        assert record["severity"] in SEVERITIES, record
        assert datetime.fromisoformat(record["timestamp"]).utcoffset() is not None, record
    messages = [r["message"] for r in records]
    assert any(m.startswith("ckpt-agent (null) listening on http://127.0.0.1:") for m in messages), messages
    # --no-auth's warning: kopf's word for the level.
    assert any(r["severity"] == "warn" and "authentication is OFF" in r["message"] for r in records), records


def test_the_flag_wins_over_the_environment_and_text_is_the_default(tmp_path: Path) -> None:
    lines = _agent(tmp_path, "--log-format", "text", env={"CKPT_LOG_FORMAT": "json"})
    assert not any(line.startswith("{") for line in lines), lines
    assert any(" WARNING ckpt_agent" in line and "authentication is OFF" in line for line in lines), lines


def test_a_bad_format_is_a_usage_error() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ckpt_agent", "agent", "--no-auth", "--plain-http", "--log-format", "yaml"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "invalid choice: 'yaml'" in result.stderr


@pytest.mark.parametrize(
    ("level", "word"),
    [(logging.DEBUG, "debug"), (logging.INFO, "info"), (logging.WARNING, "warn"), (logging.ERROR, "error"),
     (logging.CRITICAL, "fatal")],
)  # fmt: skip
def test_severity_words(level: int, word: str) -> None:
    assert severity(level) == word


def test_extra_fields_and_tracebacks_stay_on_one_line() -> None:
    try:
        raise ValueError("boom\nsecond line")
    except ValueError:
        record = logging.LogRecord(
            "ckpt_agent.x", logging.ERROR, __file__, 1, "load %s failed", ("v2",), sys.exc_info()
        )
    record.version = "v2"
    line = JsonFormatter().format(record)
    assert "\n" not in line
    parsed = json.loads(line)
    assert (parsed["message"], parsed["severity"], parsed["version"]) == ("load v2 failed", "error", "v2")
    assert "ValueError: boom" in parsed["exc_info"]
