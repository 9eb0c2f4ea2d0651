"""The agent's and `serve`'s log lines: text for people, or JSON for log pipelines with the fields
the operator's kopf JSON format writes (``timestamp`` ISO 8601 with offset, ``severity`` one of
debug/info/warn/error/fatal, ``message``), so one parser reads both images' logs. Stdlib only:
the worker image carries no kopf."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Attributes every LogRecord has; anything else came from `extra=` and is written as a field.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


def severity(levelno: int) -> str:
    """kopf's words for the levels (``warn``, not ``warning``)."""
    if levelno <= logging.DEBUG:
        return "debug"
    if levelno <= logging.INFO:
        return "info"
    if levelno <= logging.WARNING:
        return "warn"
    if levelno <= logging.ERROR:
        return "error"
    return "fatal"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: a traceback goes into ``exc_info``."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {
            "message": record.getMessage(),
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "severity": severity(record.levelno),
        }
        fields.update((k, v) for k, v in vars(record).items() if k not in _STANDARD)
        if record.exc_info:
            fields["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(fields, default=str)


def setup_logging(level: str, log_format: str = "text") -> None:
    """Before anything logs: the root logger writes ``log_format`` lines to stderr at ``level``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
