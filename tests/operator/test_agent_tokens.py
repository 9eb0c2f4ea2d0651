"""When the operator renews the agents' token of a namespace, and what it accepts as the
ServiceAccount it mints them for (ckpt_rollout.io.agent_tokens)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from ckpt_api.constants import agent_audience
from ckpt_rollout.io.agent_tokens import Lifetime, granted_seconds, lifetime, parse_service_account

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("granted", "now", "expected"),
    [
        (3600, 100.0, Lifetime(renew_at=100.0 + 2880, expires_at=100.0 + 3600)),  # renew at 80 %
        (600, 0.0, Lifetime(renew_at=480.0, expires_at=600.0)),
        (0, 5.0, Lifetime(renew_at=5.0, expires_at=5.0)),  # expired on arrival: renew at once
        (-30, 5.0, Lifetime(renew_at=5.0, expires_at=5.0)),
    ],
)
def test_a_token_is_renewed_after_four_fifths_of_its_lifetime(
    granted: float, now: float, expected: Lifetime
) -> None:
    assert lifetime(granted, now) == expected


@pytest.mark.parametrize(
    ("expiration", "expected"),
    [
        (NOW + timedelta(hours=1), 3600.0),
        (NOW + timedelta(minutes=10), 600.0),  # --service-account-max-token-expiration shortened it
        (NOW + timedelta(days=365), 365 * 86400.0),  # --service-account-extend-token-expiration
        ("2026-12-01T12:30:00Z", 1800.0),  # a raw stamp
        (None, 3600.0),  # no stamp: what was asked for
    ],
)
def test_the_lifetime_is_what_the_apiserver_granted(
    expiration: datetime | str | None, expected: float
) -> None:
    assert granted_seconds(expiration, 3600, NOW) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [("ckpt-rollout-system/ckpt-rollout", ("ckpt-rollout-system", "ckpt-rollout")), ("a/b", ("a", "b"))],
)
def test_a_service_account_is_namespace_slash_name(value: str, expected: tuple[str, str]) -> None:
    assert parse_service_account(value) == expected


@pytest.mark.parametrize("value", ["", "ckpt-rollout", "/name", "ns/", "a/b/c"])
def test_other_service_account_spellings_are_refused(value: str) -> None:
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        parse_service_account(value)


@pytest.mark.parametrize(
    ("namespace", "base", "expected"),
    [
        ("team-a", "ckpt-rollout-agent", "ckpt-rollout-agent/team-a"),
        ("rl", "agents.example", "agents.example/rl"),
    ],
)
def test_each_worker_namespace_has_its_own_audience(namespace: str, base: str, expected: str) -> None:
    assert agent_audience(namespace, base) == expected
