"""What holds a worker up, read from its agent's answer or its pod's state
(ckpt_rollout.domain.troubles), and what the agent client hands it."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_rollout.domain.troubles import CREATING_GRACE_S, NoAnswer, Trouble, answer_trouble, pod_trouble
from ckpt_rollout.io.agent_client import CallResult

NOW = 1_800_000_000.0


def _error(code: str, message: str) -> dict[str, str]:
    return {"error": code, "message": message}


# (id, the call's result, (reason, retried, words its message holds) or None)
ANSWERS: list[tuple[str, CallResult, tuple[str, bool, str] | None]] = [
    ("accepted", CallResult(202, {"accepted": True}), None),
    ("already-live", CallResult(200, {}), None),
    ("busy", CallResult(409, _error("LoadInProgress", "v1 loads")), None),
    ("a-load-the-agent-refused-is-no-trouble", CallResult(400, _error("InvalidVersion", "bad")), None),
    (
        "auth-unavailable-is-outwaited",
        CallResult(503, _error("AuthUnavailable", "token review unavailable")),
        (
            "AuthUnavailable",
            True,
            "cannot check the operator's token (calling again): token review unavailable",
        ),
    ),
    ("a-503-of-a-proxy-is-no-agent-answer", CallResult(503, {"message": "no upstream"}), None),
    (
        "a-refused-token-fails-the-worker",
        CallResult(401, _error("Unauthorized", "token review: audience mismatch")),
        ("Unauthorized", False, "refused the operator's token: token review: audience mismatch"),
    ),
    (
        "a-refused-caller-fails-the-worker",
        CallResult(403, _error("Forbidden", "may not update agents")),
        ("Forbidden", False, "update on agents.rollout.ckpt.dev"),
    ),
    (
        "nobody-listens-yet",
        CallResult(0, {}, "cannot connect: refused", connected=False),
        ("AgentUnreachable", True, "unreachable (calling again): cannot connect: refused"),
    ),
    (
        "no-token-for-the-namespace",
        CallResult(0, {}, "TokenRequest: 403", connected=False, why_none=NoAnswer.TOKEN),
        ("AgentTokenUnavailable", True, "no token for these agents yet: TokenRequest: 403"),
    ),
    (
        "a-certificate-that-fails-verification-fails-the-worker",
        CallResult(0, {}, "TLS verification of the agent failed: self-signed", why_none=NoAnswer.TLS),
        ("AgentUnreachable", False, "TLS verification of the agent failed: self-signed"),
    ),
    (
        "a-request-that-may-have-reached-the-agent-is-not-sent-again",
        CallResult(0, {}, "TimeoutError: "),
        ("AgentUnreachable", False, "TimeoutError"),
    ),
]


@pytest.mark.parametrize(("result", "expected"), [a[1:] for a in ANSWERS], ids=[a[0] for a in ANSWERS])
def test_an_answer_names_what_holds_the_worker_up(
    result: CallResult, expected: tuple[str, bool, str] | None
) -> None:
    trouble = result.trouble()
    if expected is None:
        assert trouble is None
        return
    assert trouble is not None
    reason, retried, words = expected
    assert (trouble.reason, trouble.retried) == (reason, retried)
    assert words in trouble.message


def test_without_an_answer_the_detail_is_the_cause() -> None:
    assert answer_trouble(0, None, "reset by peer", NoAnswer.BROKEN) == Trouble(
        "AgentUnreachable", "reset by peer", retried=False
    )


def _pod(phase: str = "Pending", *, age: float = 1.0, **status: Any) -> tuple[dict[str, Any], float]:
    """A pod of ``phase`` and ``status``, and when it was created."""
    return {"metadata": {"name": "w-0"}, "status": {"phase": phase, **status}}, NOW - age


def _waiting(reason: str, message: str | None = None, key: str = "containerStatuses") -> dict[str, Any]:
    waiting = {"reason": reason, **({"message": message} if message else {})}
    return {key: [{"name": "agent", "state": {"waiting": waiting}}]}


UNSCHEDULABLE = {
    "type": "PodScheduled",
    "status": "False",
    "reason": "Unschedulable",
    "message": "0/1 nodes are available: 1 Insufficient cpu.",
}

# (id, (pod, created), (reason, words its message holds) or None)
PODS: list[tuple[str, tuple[dict[str, Any], float], tuple[str, str] | None]] = [
    ("just-created", _pod(), None),
    ("unschedulable", _pod(conditions=[UNSCHEDULABLE]), ("Unschedulable", "1 Insufficient cpu")),
    (
        "image-pull-back-off",
        _pod(**_waiting("ImagePullBackOff", 'Back-off pulling image "ckpt:nope"')),
        (
            "ImagePullBackOff",
            'container agent: the image cannot be pulled: Back-off pulling image "ckpt:nope"',
        ),
    ),
    ("err-image-pull", _pod(**_waiting("ErrImagePull")), ("ErrImagePull", "the image cannot be pulled")),
    (
        "an-init-container-counts",
        _pod(**_waiting("CreateContainerConfigError", 'secret "x" not found', "initContainerStatuses")),
        ("CreateContainerConfigError", 'secret "x" not found'),
    ),
    ("creating-for-a-moment", _pod(**_waiting("ContainerCreating")), None),
    (
        "creating-for-too-long",
        _pod(age=CREATING_GRACE_S + 5, **_waiting("ContainerCreating")),
        ("ContainerCreating", "not created within 20s: usually a volume that cannot mount (a FailedMount"),
    ),
    (
        "ended",
        _pod("Failed", reason="Evicted", message="low on memory"),
        ("PodFailed", "Evicted: low on memory"),
    ),
    (
        "being-deleted",
        ({"metadata": {"deletionTimestamp": "t"}, "status": {"phase": "Failed"}}, NOW),
        None,
    ),
]


@pytest.mark.parametrize(("pod", "expected"), [p[1:] for p in PODS], ids=[p[0] for p in PODS])
def test_a_pod_that_cannot_start_says_why(
    pod: tuple[dict[str, Any], float], expected: tuple[str, str] | None
) -> None:
    obj, created = pod
    trouble = pod_trouble(obj, NOW, created)
    if expected is None:
        assert trouble is None
        return
    assert trouble is not None
    assert trouble.reason == expected[0]
    assert expected[1] in trouble.message
