"""One CheckpointRollout's reconcile step: read spec + status + pods, take the next step,
write status. All progress lives in the CR status so a restarted operator resumes where the
last one stopped: wave membership and the pods already called are written *before* the calls.
"""

from typing import Any

from ckpt_api.spec import FailureAction, LabelSelector
from ckpt_api.status import WaveStatus
from ckpt_api.vocabulary import (
    ABORT_ANNOTATION,
    PROMOTE_ANNOTATION,
    TERMINAL_PHASES,
    EventReason,
    EventType,
    Phase,
    RolloutReason,
    WaveKind,
    WavePhase,
    WorkerPhase,
    WorkerResult,
)
from ckpt_rollout import metrics
from ckpt_rollout.agent_client import AgentClient
from ckpt_rollout.conditions import Verdict
from ckpt_rollout.driving import Emit, Memory, Peer, Pod, StepBase, Tuning, parse_time
from ckpt_rollout.kube import RolloutApi
from ckpt_rollout.outcomes import Outcome
from ckpt_rollout.planning import failure_budget, plan_wave
from ckpt_rollout.rollback import RollbackMixin
from ckpt_rollout.selectors import selectors_overlap

__all__ = ["Memory", "Peer", "Pod", "Reconciler", "Tuning"]


class Reconciler:
    def __init__(self, api: RolloutApi, agents: AgentClient, tuning: Tuning | None = None) -> None:
        self.api = api
        self.agents = agents
        self.tuning = tuning or Tuning()

    async def step(
        self,
        obj: dict[str, Any],
        pods: list[Pod],
        memory: Memory,
        emit: Emit,
        peers: list[Peer] | None = None,
    ) -> tuple[dict[str, Any], float]:
        """Advance the rollout by one step. Returns the (possibly updated) object and how long
        to wait before the next step."""
        step = _Step(self.api, self.agents, self.tuning, obj, pods, memory, emit)
        delay = await step.run(peers or [])
        return step.obj, delay


class _Step(RollbackMixin, StepBase):
    async def run(self, peers: list[Peer]) -> float:
        if conflict := self.conflicting_peer(peers):
            return await self.stall_on_conflict(conflict)
        phase = self.status.get("phase")
        if self.status.get("targetVersion") != self.spec.version:
            await self.start_rollout(superseding=phase in (Phase.PROGRESSING, Phase.PAUSED))
            return 0.0
        if phase == Phase.ROLLING_BACK:
            return await self.run_rollback()
        if phase in TERMINAL_PHASES:
            if phase == Phase.SUCCEEDED and await self.correct_drift():
                return 0.0
            await self.write({})
            return self.tuning.idle_poll_s
        if self.annotations.get(ABORT_ANNOTATION) == self.spec.version:
            await self.start_rollback(RolloutReason.ABORTED, "aborted by user")
            return 0.0
        if self.deadline_exceeded():
            return await self.fail(
                RolloutReason.PROGRESS_DEADLINE_EXCEEDED,
                f"no completion within {self.spec.timeouts.progress_deadline_seconds}s "
                "(paused time excluded)",
            )
        if not self.pods and not self.status.get("waves"):
            message = "no Running pod with an IP matches the selector"
            await self.write(
                {"phase": Phase.PENDING, "message": message},
                Verdict(Phase.PENDING, RolloutReason.NO_WORKERS, message),
            )
            return self.tuning.idle_poll_s
        return await self.advance()

    # -- selector conflicts ------------------------------------------------------------------

    def conflicting_peer(self, peers: list[Peer]) -> Peer | None:
        mine = (self.meta.get("creationTimestamp") or "", self.meta["name"])
        for peer in peers:
            if peer.name == self.meta["name"] or (peer.created, peer.name) > mine:
                continue
            try:
                other = LabelSelector.model_validate(peer.selector)
            except ValueError:
                continue
            if selectors_overlap(self.spec.selector, other):
                return peer
        return None

    async def stall_on_conflict(self, peer: Peer) -> float:
        message = f"selector overlaps CheckpointRollout {peer.name} (older); no pod is driven by two rollouts"
        if self.status.get("message") != message:
            self.emit(EventType.WARNING, EventReason.SELECTOR_CONFLICT, message)
        await self.write(
            {"phase": self.status.get("phase") or Phase.PENDING, "message": message},
            Verdict(Phase.PENDING, RolloutReason.SELECTOR_CONFLICT, message, stalled=True),
        )
        return self.tuning.idle_poll_s

    # -- rollout lifecycle -------------------------------------------------------------------

    async def start_rollout(self, *, superseding: bool) -> None:
        old_target = self.status.get("targetVersion")
        previous = self.status.get("stableVersion") or self.status.get("previousVersion")
        catch_up: list[str] = []
        if superseding:
            # Pods the superseded rollout already called get the newest version first.
            catch_up = sorted(
                {p for w in self.status.get("waves") or [] for p in w.get("called", [])} & set(self.pods)
            )
        message = (
            f"rolling out {self.spec.version} to {len(self.pods)} pods in "
            f"{len(self.spec.strategy.waves)} waves"
        )
        if superseding:
            message = f"{old_target} superseded by {self.spec.version}; " + message
        waves = []
        if catch_up:
            waves.append(
                WaveStatus(
                    index=0, kind=WaveKind.CATCH_UP, target=len(catch_up), pods=catch_up, started_at=self.now
                ).to_wire()
            )
        self.memory.reset()
        await self.write(
            {
                "phase": Phase.PROGRESSING,
                "targetVersion": self.spec.version,
                "previousVersion": previous,
                "supersededVersion": old_target if superseding else None,
                "waves": waves,
                "workers": None,
                "rollback": None,
                "startedAt": self.now,
                "completedAt": None,
                "pausedAt": None,
                "pausedSeconds": 0,
                "message": message,
            },
            Verdict(Phase.PROGRESSING, RolloutReason.ROLLOUT_STARTED, message),
        )
        if superseding:
            self.emit(EventType.NORMAL, EventReason.SUPERSEDED, message)
        self.emit(EventType.NORMAL, EventReason.ROLLOUT_STARTED, message)

    def deadline_exceeded(self) -> bool:
        started = parse_time(self.status.get("startedAt"))
        now = parse_time(self.now)
        if started is None or now is None:
            return False
        paused = float(self.status.get("pausedSeconds") or 0)
        paused_at = parse_time(self.status.get("pausedAt"))
        if paused_at is not None:
            paused += now - paused_at
        return now - started - paused > self.spec.timeouts.progress_deadline_seconds

    def pause_reason(self, spec_done: int) -> str | None:
        if self.spec.paused:
            return "spec.paused is true"
        last = spec_done - 1
        if last < 0 or last not in self.spec.strategy.pause_after_wave:
            return None
        promoted = self.annotations.get(PROMOTE_ANNOTATION, "")
        if promoted.lstrip("-").isdigit() and int(promoted) >= last:
            return None
        duration = self.spec.strategy.pause_duration_seconds
        paused_at = parse_time(self.status.get("pausedAt"))
        now = parse_time(self.now)
        if duration and paused_at is not None and now is not None and now - paused_at >= duration:
            return None
        waiting_for = f"for {duration}s" if duration else "for promote"
        return f"paused after wave {last + 1} {waiting_for}"

    async def set_paused(self, reason: str | None) -> None:
        paused = self.status.get("phase") == Phase.PAUSED
        if reason and not paused:
            await self.write(
                {"phase": Phase.PAUSED, "pausedAt": self.now, "message": reason},
                Verdict(Phase.PAUSED, RolloutReason.ROLLOUT_PAUSED, reason),
            )
            self.emit(EventType.NORMAL, EventReason.PAUSED, reason)
        elif not reason and paused:
            began = parse_time(self.status.get("pausedAt")) or parse_time(self.now) or 0.0
            total = float(self.status.get("pausedSeconds") or 0) + (parse_time(self.now) or began) - began
            message = f"resumed after {total:.0f}s paused"
            await self.write(
                {"phase": Phase.PROGRESSING, "pausedAt": None, "pausedSeconds": total, "message": message},
                Verdict(Phase.PROGRESSING, RolloutReason.ROLLOUT_RESUMED, message),
            )
            self.emit(EventType.NORMAL, EventReason.RESUMED, message)

    async def advance(self) -> float:
        waves: list[dict[str, Any]] = list(self.status.get("waves") or [])
        running = next((i for i, w in enumerate(waves) if w.get("phase") == WavePhase.RUNNING), None)
        spec_done = sum(
            1
            for w in waves
            if w.get("kind", WaveKind.SPEC) == WaveKind.SPEC and w.get("phase") == WavePhase.COMPLETED
        )
        reason = (
            self.pause_reason(spec_done)
            if running is None
            else ("spec.paused is true" if self.spec.paused else None)
        )
        await self.set_paused(reason)
        if running is not None:
            return await self.run_wave(running, waves)
        if reason:
            return self.tuning.poll_s
        if spec_done < len(self.spec.strategy.waves):
            await self.start_wave(spec_done, waves)
            # Call the new wave in this step: there is nothing new to read in between.
            waves = list(self.status.get("waves") or [])
            return await self.run_wave(len(waves) - 1, waves)
        late = sorted(set(self.pods) - {p for w in waves for p in w.get("pods", [])})
        if late:
            await self.add_wave(waves, WaveKind.DRIFT, late, f"{len(late)} pods joined during the rollout")
            return 0.0
        return await self.finish()

    async def start_wave(self, spec_index: int, waves: list[dict[str, Any]]) -> None:
        assigned = [p for w in waves for p in w.get("pods", [])]
        members = plan_wave(
            index=spec_index,
            waves=self.spec.strategy.waves,
            eligible=self.pods,
            assigned=assigned,
            key=f"{self.meta.get('uid', '')}/{self.spec.version}",
        )
        if not self.status.get("previousVersion") and members:
            await self.learn_previous_version(members[0])
        total = len(self.spec.strategy.waves)
        wave = WaveStatus(
            index=len(waves),
            kind=WaveKind.SPEC,
            spec_index=spec_index,
            target=len(set(assigned) & set(self.pods)) + len(members),
            pods=members,
            started_at=self.now,
        ).to_wire()
        message = f"wave {spec_index + 1}/{total}: {len(members)} pods"
        await self.write(
            {"waves": [*waves, wave], "message": message},
            Verdict(Phase.PROGRESSING, RolloutReason.WAVE_STARTED, message),
        )
        shown = ", ".join(members[:5]) + (", ..." if len(members) > 5 else "")
        self.emit(EventType.NORMAL, EventReason.WAVE_STARTED, f"{message}: {shown}")

    async def add_wave(self, waves: list[dict[str, Any]], kind: WaveKind, pods: list[str], why: str) -> None:
        wave = WaveStatus(
            index=len(waves), kind=kind, target=len(pods), pods=pods, started_at=self.now
        ).to_wire()
        message = f"{why}: bringing them to {self.spec.version}"
        await self.write(
            {"phase": Phase.PROGRESSING, "waves": [*waves, wave], "completedAt": None, "message": message},
            Verdict(Phase.PROGRESSING, RolloutReason.WAVE_STARTED, message),
        )
        self.emit(EventType.NORMAL, EventReason.WAVE_STARTED, message)

    async def learn_previous_version(self, pod: str) -> None:
        """First rollout of this CR: ask the canary what it serves, so a rollback has a target."""
        result = await self.agents.status(self.pods[pod].ip, self.spec.agent.port)
        version = result.agent_status.version if result.agent_status is not None else None
        if version and version != self.spec.version:
            await self.write({"previousVersion": version})

    async def run_wave(self, index: int, waves: list[dict[str, Any]]) -> float:
        wave = dict(waves[index])

        async def persist_called(called: list[str]) -> None:
            waves[index] = _wave(wave, called=called)
            await self.write({"waves": waves})

        outcomes = await self.drive(
            version=self.spec.version,
            members=list(wave.get("pods", [])),
            called=list(wave.get("called", [])),
            persist_called=persist_called,
            wave=index,
            may_call=not self.spec.paused,
        )
        if outcomes is None:
            return self.tuning.poll_s
        return await self.complete_wave(index, waves, outcomes)

    async def complete_wave(
        self, index: int, waves: list[dict[str, Any]], outcomes: dict[str, Outcome]
    ) -> float:
        workers: dict[str, Any] = dict(self.status.get("workers") or {})
        failed_here = [p for p, o in outcomes.items() if o is Outcome.FAILED]
        failed_total = sum(
            1
            for e in workers.values()
            if e.get("version") == self.spec.version and e.get("phase") == WorkerPhase.FAILED
        )
        budget = failure_budget(self.spec.failure_policy.max_failures, len(self.pods))
        if failed_total > budget:
            first = failed_here[0] if failed_here else "?"
            entry = workers.get(first, {})
            reason = str(entry.get("reason") or RolloutReason.WORKER_FAILED)
            message = (
                f"wave {index + 1}: worker {first} failed ({reason}: {entry.get('message', '')}); "
                f"{failed_total} failed > budget {budget}"
            )
            waves[index] = _wave(
                waves[index], phase=WavePhase.FAILED, completed_at=self.now, failed=len(failed_here)
            )
            await self.write({"waves": waves})
            return await self.fail(reason, message)

        updated = [p for p, o in outcomes.items() if o is Outcome.UPDATED]
        gone = [p for p, o in outcomes.items() if o is Outcome.GONE]
        wave = _wave(
            waves[index],
            phase=WavePhase.COMPLETED,
            completed_at=self.now,
            updated=len(updated),
            failed=len(failed_here),
            gone=len(gone),
        )
        waves[index] = wave
        # Fold successes into the wave's counter so status stays small for big fleets;
        # failures stay listed for whoever investigates.
        changes: dict[str, Any] = {"waves": waves}
        folded = {p: None for p in updated if p in workers}
        if folded:
            changes["workers"] = folded
        label = (
            f"wave {wave['specIndex'] + 1}/{len(self.spec.strategy.waves)}"
            if wave.get("specIndex") is not None
            else f"{wave.get('kind')} wave"
        )
        message = f"{label} completed: {len(updated)} updated"
        if failed_here:
            message += f", {len(failed_here)} failed (within budget {budget})"
        changes["message"] = message
        await self.write(changes)
        metrics.WORKERS.labels(WorkerResult.UPDATED).inc(len(updated))
        started = parse_time(wave.get("startedAt"))
        now = parse_time(self.now)
        if started is not None and now is not None:
            metrics.WAVE_SECONDS.observe(now - started)
        self.emit(EventType.NORMAL, EventReason.WAVE_COMPLETED, message)
        return 0.0

    async def fail(self, reason: str, message: str) -> float:
        if self.spec.failure_policy.on_failure is FailureAction.ROLLBACK:
            await self.start_rollback(reason, message)
            return 0.0
        await self.write(
            {"phase": Phase.FAILED, "completedAt": self.now, "message": message},
            Verdict(Phase.FAILED, reason, message),
        )
        self.observe_end(Phase.FAILED)
        self.emit(EventType.WARNING, EventReason.ROLLOUT_FAILED, message)
        return self.tuning.idle_poll_s

    async def finish(self) -> float:
        message = f"{self.spec.version} is live on {self.status.get('updatedReplicas', 0)} pods"
        await self.write(
            {
                "phase": Phase.SUCCEEDED,
                "stableVersion": self.spec.version,
                "completedAt": self.now,
                "pausedAt": None,
                "message": message,
            },
            Verdict(Phase.SUCCEEDED, RolloutReason.ROLLOUT_COMPLETED, message),
        )
        self.observe_end(Phase.SUCCEEDED)
        self.emit(EventType.NORMAL, EventReason.ROLLOUT_COMPLETED, message)
        return self.tuning.idle_poll_s

    async def correct_drift(self) -> bool:
        """After success, pods that appeared since (new or re-created) get the stable version."""
        waves: list[dict[str, Any]] = list(self.status.get("waves") or [])
        new = sorted(set(self.pods) - {p for w in waves for p in w.get("pods", [])})
        if not new:
            return False
        self.emit(
            EventType.NORMAL,
            EventReason.DRIFT_CORRECTION,
            f"{len(new)} new pods: bringing them to {self.spec.version}",
        )
        await self.add_wave(waves, WaveKind.DRIFT, new, f"{len(new)} pods appeared after the rollout")
        return True


def _wave(wave: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """``wave`` as status stores it, with ``changes`` (WaveStatus field names), checked by the model."""
    current = WaveStatus.model_validate(wave).model_dump()
    return WaveStatus.model_validate({**current, **changes}).to_wire()
