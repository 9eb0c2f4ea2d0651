"""What the operator asks agents to check after a load: the spec's strategy.healthCheck on every
wave's call (on by default), never on a rollback's (it returns to weights that served already,
so no gate may refuse it)."""

from __future__ import annotations

from typing import Any

import pytest
from machine_kit import CANARY, NOW, PODS, REST, TUNING, done, progressing, rollout, wave

from ckpt_api.agent_api import HealthCheckRequest
from ckpt_api.spec import DEFAULT_HEALTH_CHECK_PROMPT
from ckpt_api.vocabulary import ABORT_ANNOTATION
from ckpt_rollout.domain.machine import decide
from ckpt_rollout.domain.plan import Rollout
from ckpt_rollout.domain.world import Memory

DEFAULT = HealthCheckRequest(prompt=DEFAULT_HEALTH_CHECK_PROMPT, max_tokens=8, timeout_seconds=30)
CANARY_DUE = progressing(wave(0, [CANARY], called=[]))


def _rollback(spec: dict[str, Any] | None = None) -> Rollout:
    return rollout(
        progressing(done(0, [CANARY]), wave(1, REST)), spec=spec, annotations={ABORT_ANNOTATION: "v2"}
    )


@pytest.mark.parametrize(
    ("situation", "version", "pods", "sent"),
    [
        (rollout(CANARY_DUE), "v2", [CANARY], DEFAULT),
        (
            rollout(
                CANARY_DUE,
                spec={"strategy": {"healthCheck": {"prompt": "2+2=", "maxTokens": 2, "timeoutSeconds": 5}}},
            ),
            "v2",
            [CANARY],
            HealthCheckRequest(prompt="2+2=", max_tokens=2, timeout_seconds=5),
        ),
        (rollout(CANARY_DUE, spec={"strategy": {"healthCheck": {"enabled": False}}}), "v2", [CANARY], None),
        (_rollback(), "v1", PODS, None),
    ],
    ids=["wave-default", "wave-configured", "disabled", "rollback-never"],
)
def test_calls_carry_the_spec_health_check(
    situation: Rollout, version: str, pods: list[str], sent: HealthCheckRequest | None
) -> None:
    plan = decide(situation, Memory(), TUNING, NOW)
    assert sorted(c.pod for c in plan.calls) == sorted(pods)
    assert {c.request.version for c in plan.calls} == {version}
    assert [c.request.health_check for c in plan.calls] == [sent] * len(pods)


def test_the_wire_request_names_it_as_the_agent_reads_it() -> None:
    (call,) = decide(rollout(CANARY_DUE), Memory(), TUNING, NOW).calls
    assert call.request.to_wire()["health_check"] == {
        "prompt": DEFAULT_HEALTH_CHECK_PROMPT,
        "max_tokens": 8,
        "timeout_seconds": 30,
    }
