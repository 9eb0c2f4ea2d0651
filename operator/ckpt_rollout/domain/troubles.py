"""Why a worker makes no progress, as a reason and one line naming its cause: what its agent
answered to the operator (or that it could not be reached), or the state of a selected pod that
cannot start. Pure; table-tested.

A trouble the operator can outwait (``retried``: the agent could not check the token yet, nobody
listens yet, no answer came) keeps the worker waiting until the worker timeout; the others (a
refusal, a certificate that fails verification) fail it at once. Either way the cause is shown
while it lasts (ckpt_rollout.domain.stalls)."""

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from ckpt_api.vocabulary import ConditionStatus, ErrorCode, EventType, PodPhase, WorkerReason

# An agent's trouble is shown once it has lasted this long: an agent that is still starting
# answers nothing for a moment, which is no news.
STALL_GRACE_S = 3.0
# A container still being created after this long is reported even when no event says why.
CREATING_GRACE_S = 20.0
# A pod still creating its containers this long has its Warning events read: a volume that cannot
# mount (the most common cause) or a sandbox that cannot be made shows only there. The kubelet
# retries both, so a warning met in the first seconds (a Secret created just after its pod) is
# not yet news.
EVENTS_GRACE_S = 5.0
# Warning events that hold a pod's containers from being created, as the kubelet reasons them.
_CREATING_WARNINGS = frozenset(
    {
        "FailedMount",
        "FailedAttachVolume",
        "FailedMapVolume",
        "FailedCreatePodSandBox",
        "FailedCreatePodContainer",
    }
)
# An event's message is the kubelet's words, not a worker's: shown, but only this much of it.
_EVENT_MESSAGE_CHARS = 300


class NoAnswer(StrEnum):
    """Why a call got no HTTP answer."""

    UNREACHABLE = "unreachable"  # no connection could be made: the request surely went nowhere
    TLS = "tls"  # the agent's serving certificate failed verification
    # The operator had no token for the namespace's agents: nothing was sent.
    TOKEN = "token"  # noqa: S105 (a kind of failure, not a secret)
    BROKEN = "broken"  # connected, then no usable answer (a timeout, a reset, not an agent's body)


@dataclass(frozen=True)
class Trouble:
    reason: str
    message: str
    retried: bool = True  # the operator calls again (the worker timeout bounds the wait)
    # Whether the call arrived is unknown (no answer came): the agent's status (the pull) is asked
    # first, and the call is sent again only if the agent never saw it.
    ask_first: bool = False
    # Monotonic time it was first met (None: shown at once); not part of what it is.
    since: float | None = field(default=None, compare=False)

    def line(self) -> str:
        return f"{self.reason}: {self.message}"


def ongoing(previous: Trouble | None, trouble: Trouble, now: float) -> Trouble:
    """``trouble`` met at ``now``, dated from when ``previous`` began if it is the same."""
    same = previous is not None and previous.reason == trouble.reason and previous.since is not None
    return replace(trouble, since=previous.since if same and previous is not None else now)


TOKEN_UNAVAILABLE = "AgentTokenUnavailable"  # noqa: S105 (a reason, not a secret)
# The reasons of the operator's Pending entries for a stalled member (ckpt_rollout.domain.stalls).
STALL_REASONS = frozenset(
    {
        TOKEN_UNAVAILABLE,
        WorkerReason.AGENT_UNREACHABLE,
        ErrorCode.AUTH_UNAVAILABLE,
        ErrorCode.UNAUTHORIZED,
        ErrorCode.FORBIDDEN,
    }
)


def answer_trouble(status: int, error: str | None, detail: str, no_answer: NoAnswer | None) -> Trouble | None:
    """What an agent's answer says is in the way, or None (accepted, busy, or a load failure the
    agent itself reported: the caller words those). ``error``: the ErrorCode of the agent's
    body, if it is one; ``detail``: its message, or why there was no answer (``status`` 0)."""
    if status == 0:
        if no_answer is NoAnswer.TOKEN:
            return Trouble(TOKEN_UNAVAILABLE, f"the operator has no token for these agents yet: {detail}")
        if no_answer is NoAnswer.UNREACHABLE:
            return Trouble(
                WorkerReason.AGENT_UNREACHABLE, f"the agent is unreachable (calling again): {detail}"
            )
        if no_answer is NoAnswer.TLS:
            # The certificate stays wrong however often it is asked: the worker fails with it.
            return Trouble(WorkerReason.AGENT_UNREACHABLE, detail, retried=False)
        # The request may have reached the agent: a slow or briefly unreachable agent is no failed
        # worker, and calling blindly again could load twice. Its status says whether it saw the
        # call; only an answer, or the worker timeout, decides.
        return Trouble(
            WorkerReason.AGENT_UNREACHABLE,
            f"no answer from the agent (asking whether the call arrived): {detail}",
            ask_first=True,
        )
    if status == 503 and error == ErrorCode.AUTH_UNAVAILABLE:
        return Trouble(
            ErrorCode.AUTH_UNAVAILABLE,
            f"the agent cannot check the operator's token (calling again): {detail}",
        )
    if status == 401 and error == ErrorCode.UNAUTHORIZED:
        return Trouble(
            ErrorCode.UNAUTHORIZED,
            f"the agent refused the operator's token: {detail} (it accepts only tokens for its "
            "namespace's audience, ckpt-rollout-agent/<namespace>)",
            retried=False,
        )
    if status == 403 and error == ErrorCode.FORBIDDEN:
        return Trouble(
            ErrorCode.FORBIDDEN,
            f"the agent does not let the operator in: {detail} (the operator needs update on "
            "agents.rollout.ckpt.dev in the pod's namespace)",
            retried=False,
        )
    return None


# Container waiting reasons that do not pass by themselves.
_STUCK_WAITING = {
    "ImagePullBackOff": "the image cannot be pulled",
    "ErrImagePull": "the image cannot be pulled",
    "ErrImageNeverPull": "the image is not on the node and its pull policy is Never",
    "InvalidImageName": "the image name is invalid",
    "CreateContainerConfigError": "the container cannot be configured (a missing Secret or ConfigMap?)",
    "CreateContainerError": "the container cannot be created",
    "RunContainerError": "the container cannot be started",
    "CrashLoopBackOff": "the container keeps exiting",
}
_CREATING = frozenset({"ContainerCreating", "PodInitializing"})


def wants_events(pod: dict[str, Any], now: float, created: float | None) -> bool:
    """Whether the pod's Warning events may say what ``pod_trouble`` cannot see in the pod: its
    containers have been in creation longer than EVENTS_GRACE_S."""
    if (
        created is None
        or now - created <= EVENTS_GRACE_S
        or (pod.get("metadata") or {}).get("deletionTimestamp")
    ):
        return False
    return any((w.get("reason") or "") in _CREATING for _, w in _waiting(pod.get("status") or {}))


def pod_trouble(
    pod: dict[str, Any], now: float, created: float | None, warnings: Sequence[dict[str, Any]] = ()
) -> Trouble | None:
    """Why a pod that is not Running cannot start, or None while it may still start.
    ``created``: its creationTimestamp (epoch seconds), if known; ``warnings``: its Warning events
    (core/v1, as the apiserver returns them), read when ``wants_events`` says so."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return None  # on its way out: nothing to start
    phase = status.get("phase")
    if phase in (PodPhase.FAILED, PodPhase.SUCCEEDED):
        why = ": ".join(str(p) for p in (status.get("reason"), status.get("message")) if p)
        return Trouble(f"Pod{phase}", f"the pod has ended ({phase}){': ' + why if why else ''}")
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == ConditionStatus.FALSE:
            reason = condition.get("reason") or "Unschedulable"
            return Trouble(reason, f"the pod cannot be scheduled: {condition.get('message') or reason}")
    creating: list[str] = []
    for name, waiting in _waiting(status):
        reason = waiting.get("reason") or ""
        if reason in _STUCK_WAITING:
            said = waiting.get("message")
            return Trouble(reason, f"container {name}: {_STUCK_WAITING[reason]}{': ' + said if said else ''}")
        if reason in _CREATING:
            creating.append(name)
    if not creating or created is None:
        return None
    warning = _creating_warning(warnings) if now - created > EVENTS_GRACE_S else None
    if warning is not None:
        reason, said = warning
        return Trouble(reason, f"container {creating[0]} cannot be created: {said}")
    if now - created > CREATING_GRACE_S:
        return Trouble(
            "ContainerCreating",
            # No running count in the text: each look would rewrite status.message.
            f"container {creating[0]} not created within {CREATING_GRACE_S:.0f}s: usually a volume "
            "that cannot mount (a FailedMount event: a missing Secret, ConfigMap or claim)",
        )
    return None


def _creating_warning(warnings: Sequence[dict[str, Any]]) -> tuple[str, str] | None:
    """The newest Warning event that holds container creation, as (reason, message)."""
    newest: tuple[str, str, str] | None = None  # (when, reason, message)
    for event in warnings:
        reason = event.get("reason") or ""
        if event.get("type") != EventType.WARNING or reason not in _CREATING_WARNINGS:
            continue
        # lastTimestamp is RFC 3339 to the second and eventTime to the microsecond: both sort as text.
        when = str(event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp") or "")
        if newest is None or when >= newest[0]:
            said = " ".join(str(event.get("message") or reason).split())
            if len(said) > _EVENT_MESSAGE_CHARS:
                said = said[: _EVENT_MESSAGE_CHARS - 1] + "…"
            newest = (when, reason, said)
    return None if newest is None else newest[1:]


def _waiting(status: dict[str, Any]) -> Iterable[tuple[str, dict[str, Any]]]:
    for key in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(key) or []:
            waiting = (container.get("state") or {}).get("waiting")
            if waiting:
                yield str(container.get("name")), waiting
