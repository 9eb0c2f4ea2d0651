"""Rollback: return the workers this rollout touched to previousVersion (failure over budget,
deadline, or abort). A rollback that fails is reported as such, never hidden."""

from typing import Any

from ckpt_api.status import RollbackStatus
from ckpt_api.vocabulary import (
    EventReason,
    EventType,
    Phase,
    RolloutReason,
    WavePhase,
    WorkerPhase,
    WorkerReason,
    WorkerResult,
)
from ckpt_rollout import metrics
from ckpt_rollout.conditions import Verdict
from ckpt_rollout.driving import StepBase
from ckpt_rollout.outcomes import Outcome

# Failures after which the worker may still end up on the new version: roll those back too.
_UNCERTAIN_FAILURES = frozenset({WorkerReason.WORKER_TIMEOUT, WorkerReason.AGENT_UNREACHABLE})


class RollbackMixin(StepBase):
    def rollback_members(self) -> list[str]:
        workers: dict[str, Any] = self.status.get("workers") or {}
        called = {p for w in self.status.get("waves") or [] for p in w.get("called", [])}

        def kept_old_weights(pod: str) -> bool:
            entry = workers.get(pod) or {}
            return (
                entry.get("version") == self.spec.version
                and entry.get("phase") == WorkerPhase.FAILED
                and entry.get("reason") not in _UNCERTAIN_FAILURES
            )

        return sorted(p for p in called if not kept_old_weights(p))

    async def start_rollback(self, reason: str, message: str) -> None:
        previous = self.status.get("previousVersion")
        if not previous:
            message += "; no previous version is known, so nothing can be rolled back"
            await self.write(
                {"phase": Phase.FAILED, "completedAt": self.now, "message": message},
                Verdict(Phase.FAILED, reason, message),
            )
            self.emit(EventType.WARNING, EventReason.ROLLOUT_FAILED, message)
            return
        members = self.rollback_members()
        message = f"{message}; rolling {len(members)} workers back to {previous}"
        await self.write(
            {
                "phase": Phase.ROLLING_BACK,
                "rollback": RollbackStatus(
                    version=previous, reason=reason, pods=members, started_at=self.now
                ).to_wire(),
                "message": message,
            },
            Verdict(Phase.ROLLING_BACK, reason, message),
        )
        self.emit(EventType.WARNING, EventReason.ROLLBACK_STARTED, message)

    async def run_rollback(self) -> float:
        rollback: dict[str, Any] = dict(self.status.get("rollback") or {})
        version = str(rollback.get("version"))

        async def persist_called(called: list[str]) -> None:
            await self.write({"rollback": _rollback(rollback, called=called)})

        outcomes = await self.drive(
            version=version,
            members=list(rollback.get("pods", [])),
            called=list(rollback.get("called", [])),
            persist_called=persist_called,
            wave=len(self.status.get("waves") or []),
        )
        if outcomes is None:
            return self.tuning.poll_s
        failed = sorted(p for p, o in outcomes.items() if o is Outcome.FAILED)
        back = sum(1 for o in outcomes.values() if o is Outcome.UPDATED)
        metrics.WORKERS.labels(WorkerResult.ROLLED_BACK).inc(back)
        reason = str(rollback.get("reason") or RolloutReason.ROLLED_BACK)
        done = _rollback(
            rollback, phase=WavePhase.FAILED if failed else WavePhase.COMPLETED, completed_at=self.now
        )
        if failed:
            message = f"rollback to {version} failed on {len(failed)} workers: {', '.join(failed[:10])}"
            await self.write(
                {"phase": Phase.FAILED, "rollback": done, "completedAt": self.now, "message": message},
                Verdict(Phase.FAILED, RolloutReason.ROLLBACK_FAILED, message),
            )
            self.observe_end(Phase.FAILED)
            self.emit(EventType.WARNING, EventReason.ROLLBACK_FAILED, message)
        else:
            message = f"rolled {back} workers back to {version} ({reason})"
            await self.write(
                {"phase": Phase.ROLLED_BACK, "rollback": done, "completedAt": self.now, "message": message},
                Verdict(Phase.ROLLED_BACK, reason, message),
            )
            self.observe_end(Phase.ROLLED_BACK)
            self.emit(EventType.WARNING, EventReason.ROLLED_BACK, message)
        return self.tuning.idle_poll_s


def _rollback(rollback: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``rollback`` as status stores it, with ``changes`` (RollbackStatus field names), checked
    by the model."""
    current = RollbackStatus.model_validate(rollback).model_dump()
    return RollbackStatus.model_validate({**current, **changes}).to_wire()
