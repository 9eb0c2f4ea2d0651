"""What a worker's reports say about its load of the target version. Pure; table-tested."""

from enum import StrEnum
from typing import Any


class Outcome(StrEnum):
    UNCALLED = "Uncalled"
    WAITING = "Waiting"
    UPDATED = "Updated"
    FAILED = "Failed"
    GONE = "Gone"
    LOST = "Lost"  # the agent never got (or forgot) our call: call again


DECIDED = frozenset({Outcome.UPDATED, Outcome.FAILED, Outcome.GONE})


def reported_outcome(entry: dict[str, Any] | None, *, target: str, present: bool, called: bool) -> Outcome:
    """Outcome from the CR's ``status.workers`` entry (the agent's push)."""
    if entry and entry.get("version") == target and entry.get("phase") in ("Updated", "Failed"):
        return Outcome.UPDATED if entry["phase"] == "Updated" else Outcome.FAILED
    if not present:
        return Outcome.GONE
    return Outcome.WAITING if called else Outcome.UNCALLED


def pulled_outcome(agent_status: dict[str, Any], *, target: str) -> tuple[Outcome, str, str]:
    """Outcome from the agent's ``GET /v1/status`` (the pull fallback): (outcome, reason, message)."""
    state = agent_status.get("state")
    error = agent_status.get("last_error") or {}
    if state == "loading":
        return Outcome.WAITING, "", ""
    if agent_status.get("version") == target:
        return Outcome.UPDATED, "Loaded", "confirmed by the agent's /v1/status"
    if error.get("version") == target:
        return Outcome.FAILED, str(error.get("reason") or "LoadFailed"), str(error.get("message") or "")
    return Outcome.LOST, "", ""
