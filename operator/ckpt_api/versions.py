"""Checkpoint version and wave-target parsing shared by models, operator and agent."""

import re

from ckpt_api.constants import PERCENT_OR_ZERO_PATTERN, PERCENT_PATTERN, VERSION_PATTERN

_VERSION_RE = re.compile(VERSION_PATTERN)
_PERCENT_RE = re.compile(PERCENT_PATTERN)
_PERCENT_OR_ZERO_RE = re.compile(PERCENT_OR_ZERO_PATTERN)


def validate_version(version: object, *, named: str | None = None) -> str:
    """Return ``version`` if it is a safe checkpoint version name, else raise ValueError.
    ``named``: how the message calls it instead of quoting it (a value its reader may not see)."""
    if not isinstance(version, str):
        raise ValueError(f"version must be a string, got {type(version).__name__}")
    if not version:
        raise ValueError("version must not be empty")
    if len(version) > 128:
        raise ValueError(f"version is {len(version)} characters long; at most 128 are allowed")
    label = named or f"version {version!r}"
    if "/" in version:
        raise ValueError(f"{label} contains '/'")
    if ".." in version:
        raise ValueError(f"{label} contains '..'")
    # fullmatch: with match, the pattern's `$` also matches before a final newline ("v2\n").
    if not _VERSION_RE.fullmatch(version):
        raise ValueError(
            f"{label} must start with a letter or digit and contain only letters, digits, '.', '_' and '-'"
        )
    return version


def parse_percent(value: str, *, allow_zero: bool = False) -> int:
    """'25%' -> 25. Raises ValueError naming the accepted range."""
    pattern = _PERCENT_OR_ZERO_RE if allow_zero else _PERCENT_RE
    if not pattern.fullmatch(value):
        lo = 0 if allow_zero else 1
        raise ValueError(f"{value!r} is not a percentage between {lo}% and 100% (e.g. '25%')")
    return int(value[:-1])
