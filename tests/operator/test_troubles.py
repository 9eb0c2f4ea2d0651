"""What holds a worker up, read from its agent's answer or its pod's state
(ckpt_rollout.domain.troubles), and what the agent client hands it."""

from __future__ import annotations

from typing import Any

import pytest

from ckpt_rollout.domain.troubles import (
    CREATING_GRACE_S,
    EVENTS_GRACE_S,
    NoAnswer,
    Trouble,
    answer_trouble,
    pod_trouble,
    wants_events,
)
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
        "a-call-without-an-answer-is-outwaited-and-asked-about",
        CallResult(0, {}, "TimeoutError: "),
        (
            "AgentUnreachable",
            True,
            "no answer from the agent (asking whether the call arrived): TimeoutError",
        ),
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
    trouble = answer_trouble(0, None, "reset by peer", NoAnswer.BROKEN)
    assert trouble is not None
    assert trouble.message.endswith(": reset by peer")
    assert (trouble.retried, trouble.ask_first) == (True, True)
    assert answer_trouble(0, None, "refused", NoAnswer.UNREACHABLE).ask_first is False  # type: ignore[union-attr]


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
    _is_like(pod_trouble(obj, NOW, created), expected)


def _is_like(trouble: Trouble | None, expected: tuple[str, str] | None) -> None:
    """``trouble`` has the expected reason and words in its message, or is None as expected."""
    if expected is None:
        assert trouble is None
        return
    assert trouble is not None
    assert trouble.reason == expected[0]
    assert expected[1] in trouble.message
    assert len(trouble.message) < 400


def _event(reason: str, message: str, at: str, type_: str = "Warning") -> dict[str, Any]:
    return {"type": type_, "reason": reason, "message": message, "lastTimestamp": at}


MOUNT = _event(
    "FailedMount",
    'MountVolume.SetUp failed for volume "agent-tls" : secret "ckpt-rollout-agent-tls" not found',
    "2026-12-02T10:00:05Z",
)
SANDBOX = _event("FailedCreatePodSandBox", "failed to setup network for sandbox", "2026-12-02T10:00:09Z")
CREATING = _waiting("ContainerCreating")
PAST_EVENTS_GRACE = EVENTS_GRACE_S + 1

# (id, pod age, its Warning events, (reason, words its message holds) or None)
WARNED: list[tuple[str, float, list[dict[str, Any]], tuple[str, str] | None]] = [
    (
        "a-failed-mount-names-the-volume-and-what-is-missing",
        PAST_EVENTS_GRACE,
        [MOUNT],
        (
            "FailedMount",
            'container agent cannot be created: MountVolume.SetUp failed for volume "agent-tls" : '
            'secret "ckpt-rollout-agent-tls" not found',
        ),
    ),
    ("a-warning-in-the-first-seconds-is-no-news-yet", EVENTS_GRACE_S - 1, [MOUNT], None),
    (
        "the-newest-warning-is-the-cause",
        PAST_EVENTS_GRACE,
        [SANDBOX, MOUNT],
        ("FailedCreatePodSandBox", "sandbox"),
    ),
    (
        "warnings-about-something-else-leave-the-inference",
        CREATING_GRACE_S + 1,
        [_event("BackOff", "restarting", "2026-12-02T10:00:09Z"), {**MOUNT, "type": "Normal"}],
        ("ContainerCreating", "not created within 20s"),
    ),
    ("no-warning-no-inference-before-its-grace", PAST_EVENTS_GRACE, [], None),
    (
        "a-long-message-is-cut",
        PAST_EVENTS_GRACE,
        [_event("FailedMount", "x " * 400, "2026-12-02T10:00:05Z")],
        ("FailedMount", "x x…"),
    ),
]


@pytest.mark.parametrize(("age", "warnings", "expected"), [w[1:] for w in WARNED], ids=[w[0] for w in WARNED])
def test_a_pod_whose_containers_wait_names_the_warning_that_holds_them(
    age: float, warnings: list[dict[str, Any]], expected: tuple[str, str] | None
) -> None:
    obj, created = _pod(age=age, **CREATING)
    _is_like(pod_trouble(obj, NOW, created, warnings), expected)


@pytest.mark.parametrize(
    ("pod", "wanted"),
    [
        (_pod(age=PAST_EVENTS_GRACE, **CREATING), True),
        (_pod(age=EVENTS_GRACE_S - 1, **CREATING), False),
        (_pod(age=PAST_EVENTS_GRACE, **_waiting("PodInitializing", key="initContainerStatuses")), True),
        (_pod(age=PAST_EVENTS_GRACE, **_waiting("ImagePullBackOff")), False),  # the pod says why
        (_pod(age=PAST_EVENTS_GRACE), False),  # no container status yet: not scheduled, or just bound
        (({"metadata": {"deletionTimestamp": "t"}, "status": CREATING}, NOW - 60), False),
    ],
    ids=["creating", "creating-briefly", "initializing", "pull-back-off", "no-statuses", "being-deleted"],
)
def test_events_are_read_only_for_pods_whose_containers_take_long(
    pod: tuple[dict[str, Any], float], wanted: bool
) -> None:
    obj, created = pod
    assert wants_events(obj, NOW, created) is wanted
    assert wants_events(obj, NOW, None) is False
