"""What holds a rollout before the machine sees it: a spec the models refuse (stored before a
rule existed, or written past the schema), a versionFrom that names no version, a source the
operator's source policy refuses. Each stalls the rollout with its own reason, a message saying
what to fix and a Warning event, and nothing is started or advanced (a rollout in flight holds
where it is); once fixed, the phase gets its conditions back. Pure: the daemon hands in what its
ConfigMap watch last saw and the policy it was started with."""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ckpt_api.source_policy import SourcePolicy, SourceRefused
from ckpt_api.spec import DeclaredRolloutSpec
from ckpt_api.status import CheckpointRolloutStatus, Condition
from ckpt_api.vocabulary import ConditionStatus, ConditionType, Phase, RolloutReason
from ckpt_rollout.domain.conditions import Verdict, evaluate_conditions
from ckpt_rollout.domain.version_source import (
    ConfigMapState,
    SourceInvalid,
    describe,
    resolve_version,
    with_version,
)
from ckpt_rollout.domain.wording import counted

# The reason a rollout is stalled with, and the one its Stalled condition gets once it clears.
CLEARED: dict[str, str] = {
    RolloutReason.INVALID_SPEC: RolloutReason.SPEC_ACCEPTED,
    RolloutReason.VERSION_SOURCE_INVALID: RolloutReason.VERSION_SOURCE_RESOLVED,
    RolloutReason.INVALID_SOURCE: RolloutReason.SOURCE_ALLOWED,
}
_SHOWN_ERRORS = 3


@dataclass(frozen=True)
class Held:
    reason: str
    message: str


@dataclass(frozen=True)
class Passed:
    obj: dict[str, Any]  # the CR as a step reads it: spec.version resolved
    message: str  # what a rollout stalled earlier is told once it clears


Lookup = Callable[[tuple[str, str]], ConfigMapState | None]


def spec_errors(error: ValidationError) -> str:
    """A ValidationError as one line a user can act on: where, and what is wrong."""
    errors = error.errors()
    shown = [
        f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" if e["loc"] else f"spec: {e['msg']}"
        for e in errors[:_SHOWN_ERRORS]
    ]
    more = len(errors) - len(shown)
    return "; ".join(shown) + (f" (and {counted(more, 'more error')})" if more > 0 else "")


def gate(obj: Mapping[str, Any], configmaps: Lookup, policy: SourcePolicy) -> Held | Passed | None:
    """Whether ``obj`` may be stepped. None: its version's ConfigMap is not listed yet (its first
    list wakes the loop)."""
    try:
        spec = DeclaredRolloutSpec.model_validate(obj["spec"])
    except ValidationError as exc:
        return Held(RolloutReason.INVALID_SPEC, f"the spec is invalid: {spec_errors(exc)}")
    try:
        policy.check_uri(spec.source.uri)
    except SourceRefused as exc:
        return Held(RolloutReason.INVALID_SOURCE, f"spec.source.uri: {exc}")
    ref = spec.version_from.config_map_key_ref if spec.version_from is not None else None
    if ref is None:
        return Passed(dict(obj), f"spec accepted: rolling out {spec.version}")
    state = configmaps((obj["metadata"]["namespace"], ref.name))
    if state is None:
        return None
    version = resolve_version(ref, state)
    if isinstance(version, SourceInvalid):
        return Held(RolloutReason.VERSION_SOURCE_INVALID, version.message)
    return Passed(with_version(obj, version), f"target version {version} read from {describe(ref)}")


def stalled_status(
    status: CheckpointRolloutStatus, held: Held, *, now: str, generation: int | None
) -> CheckpointRolloutStatus:
    """Stalled: the phase stays (nothing is started or advanced until fixed), only Stalled
    holds, and the message says what to fix."""
    phase = status.phase or Phase.PENDING
    verdict = Verdict(phase, held.reason, held.message, stalled=True)
    return _with_verdict(status, verdict, now=now, generation=generation)


def stalled_on(status: CheckpointRolloutStatus) -> str | None:
    """The gate reason a rollout is stalled on, if any."""
    for c in status.conditions:
        if c.type == ConditionType.STALLED and c.status is ConditionStatus.TRUE and c.reason in CLEARED:
            return c.reason
    return None


def recovered_status(
    status: CheckpointRolloutStatus, message: str, *, now: str, generation: int | None
) -> CheckpointRolloutStatus | None:
    """The conditions of the phase the rollout was stalled in, once the gate clears (None when
    it was not stalled on one). The machine sets conditions only when it changes something, so a
    Succeeded rollout whose ConfigMap comes back with the same version would otherwise stay
    Stalled."""
    reason = stalled_on(status)
    if reason is None:
        return None
    verdict = Verdict(status.phase or Phase.PENDING, CLEARED[reason], message)
    return _with_verdict(status, verdict, now=now, generation=generation)


def _with_verdict(
    status: CheckpointRolloutStatus, verdict: Verdict, *, now: str, generation: int | None
) -> CheckpointRolloutStatus:
    existing = [c.to_wire() for c in status.conditions]
    conditions = evaluate_conditions(verdict, existing, now=now, generation=generation)
    return status.model_copy(
        update={
            "phase": verdict.phase,
            "message": verdict.message,
            "observed_generation": generation,
            "conditions": [Condition.model_validate(c) for c in conditions],
        }
    )
