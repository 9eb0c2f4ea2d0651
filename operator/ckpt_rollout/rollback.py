"""Rollback: return the workers this rollout touched to previousVersion (failure over budget,
deadline, or abort). A rollback that fails is reported as such, never hidden."""

from typing import Any

from ckpt_api.status import Phase, WavePhase
from ckpt_rollout import metrics
from ckpt_rollout.conditions import Verdict
from ckpt_rollout.driving import StepBase
from ckpt_rollout.outcomes import Outcome

# Failures after which the worker may still end up on the new version: roll those back too.
_UNCERTAIN_FAILURES = {"WorkerTimeout", "AgentUnreachable"}


class RollbackMixin(StepBase):
    def rollback_members(self) -> list[str]:
        workers: dict[str, Any] = self.status.get("workers") or {}
        called = {p for w in self.status.get("waves") or [] for p in w.get("called", [])}

        def kept_old_weights(pod: str) -> bool:
            entry = workers.get(pod) or {}
            return (
                entry.get("version") == self.spec.version
                and entry.get("phase") == "Failed"
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
            self.emit("Warning", "RolloutFailed", message)
            return
        members = self.rollback_members()
        message = f"{message}; rolling {len(members)} workers back to {previous}"
        await self.write(
            {
                "phase": Phase.ROLLING_BACK,
                "rollback": {
                    "version": previous,
                    "reason": reason,
                    "pods": members,
                    "called": [],
                    "phase": WavePhase.RUNNING,
                    "startedAt": self.now,
                },
                "message": message,
            },
            Verdict(Phase.ROLLING_BACK, reason, message),
        )
        self.emit("Warning", "RollbackStarted", message)

    async def run_rollback(self) -> float:
        rollback: dict[str, Any] = dict(self.status.get("rollback") or {})
        version = str(rollback.get("version"))

        async def persist_called(called: list[str]) -> None:
            await self.write({"rollback": {**rollback, "called": called}})

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
        metrics.WORKERS.labels("rolled_back").inc(back)
        reason = str(rollback.get("reason") or "RolledBack")
        done = {
            **rollback,
            "phase": WavePhase.FAILED if failed else WavePhase.COMPLETED,
            "completedAt": self.now,
        }
        if failed:
            message = f"rollback to {version} failed on {len(failed)} workers: {', '.join(failed[:10])}"
            await self.write(
                {"phase": Phase.FAILED, "rollback": done, "completedAt": self.now, "message": message},
                Verdict(Phase.FAILED, "RollbackFailed", message),
            )
            self.observe_end(Phase.FAILED)
            self.emit("Warning", "RollbackFailed", message)
        else:
            message = f"rolled {back} workers back to {version} ({reason})"
            await self.write(
                {"phase": Phase.ROLLED_BACK, "rollback": done, "completedAt": self.now, "message": message},
                Verdict(Phase.ROLLED_BACK, reason, message),
            )
            self.observe_end(Phase.ROLLED_BACK)
            self.emit("Warning", "RolledBack", message)
        return self.tuning.idle_poll_s
