"""One CheckpointRollout's reconcile step: read spec + status + pods, take the next step,
write status. All progress lives in the CR status so a restarted operator resumes where the
last one stopped: wave membership and the pods already called are written *before* the calls.
"""

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ckpt_api.spec import CheckpointRolloutSpec, FailureAction
from ckpt_api.status import TERMINAL_PHASES, Phase, WavePhase
from ckpt_rollout.agent_client import AgentClient, CallResult
from ckpt_rollout.conditions import Verdict, evaluate_conditions
from ckpt_rollout.kube import RolloutApi
from ckpt_rollout.mergepatch import apply_merge_patch
from ckpt_rollout.outcomes import Outcome, pulled_outcome, reported_outcome
from ckpt_rollout.planning import failure_budget, plan_wave
from ckpt_rollout.selectors import selector_matches

log = logging.getLogger(__name__)

Emit = Callable[[str, str, str], None]  # (type, reason, message)


def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Pod:
    name: str
    ip: str
    labels: Mapping[str, str]


@dataclass
class Tuning:
    poll_s: float = 0.5
    idle_poll_s: float = 2.0
    pull_after_s: float = 5.0
    pull_every_s: float = 3.0
    busy_retry_s: float = 1.0
    call_batch: int = 512


@dataclass
class Memory:
    """Per-CR in-memory hints. Losing them (a restart) only makes the operator pull sooner."""

    call_times: dict[str, float] = field(default_factory=dict)
    last_pull: dict[str, float] = field(default_factory=dict)
    busy_until: dict[str, float] = field(default_factory=dict)
    announced_failures: set[str] = field(default_factory=set)


class Reconciler:
    def __init__(self, api: RolloutApi, agents: AgentClient, tuning: Tuning | None = None) -> None:
        self.api = api
        self.agents = agents
        self.tuning = tuning or Tuning()

    async def step(
        self, obj: dict[str, Any], pods: list[Pod], memory: Memory, emit: Emit
    ) -> tuple[dict[str, Any], float]:
        """Advance the rollout by one step. Returns the (possibly updated) object and how long
        to wait before the next step."""
        return await _Step(self, obj, pods, memory, emit).run()


class _Step:
    def __init__(
        self, owner: Reconciler, obj: dict[str, Any], pods: list[Pod], memory: Memory, emit: Emit
    ) -> None:
        self.owner = owner
        self.obj = obj
        self.meta = obj["metadata"]
        self.spec = CheckpointRolloutSpec.model_validate(obj["spec"])
        self.status: dict[str, Any] = obj.get("status") or {}
        self.pods = {p.name: p for p in pods if selector_matches(self.spec.selector, p.labels)}
        self.memory = memory
        self.emit = emit
        self.tuning = owner.tuning
        self.now = utcnow()

    # -- status writes -----------------------------------------------------------------------

    async def write(self, changes: dict[str, Any], verdict: Verdict | None = None) -> None:
        """Merge-patch ``changes`` into status with re-derived counters and conditions; fields
        that would not change are left out, and nothing is sent when nothing changes."""
        merged = apply_merge_patch(self.status, changes)
        derived = self._derived(merged, verdict)
        patch = {k: v for k, v in changes.items() if self.status.get(k) != v or v is None}
        patch.update({k: v for k, v in derived.items() if self.status.get(k) != v})
        patch = {k: v for k, v in patch.items() if not (v is None and k not in self.status)}
        if not patch:
            return
        self.obj = await self.owner.api.patch_status(self.meta["namespace"], self.meta["name"], patch)
        self.status = self.obj.get("status") or {}

    def _derived(self, status: dict[str, Any], verdict: Verdict | None) -> dict[str, Any]:
        waves = status.get("waves") or []
        target = status.get("targetVersion")
        workers = status.get("workers") or {}
        done = [w for w in waves if w.get("phase") == WavePhase.COMPLETED]
        running = {p for w in waves if w.get("phase") != WavePhase.COMPLETED for p in w.get("pods", [])}
        updated = sum(w.get("updated", 0) for w in done) + sum(
            1
            for name, e in workers.items()
            if name in running and e.get("version") == target and e.get("phase") == "Updated"
        )
        failed = sum(1 for e in workers.values() if e.get("version") == target and e.get("phase") == "Failed")
        total = status.get("totalWaves") or len(self.spec.strategy.waves)
        derived: dict[str, Any] = {
            "observedGeneration": self.meta.get("generation"),
            "replicas": len(self.pods),
            "updatedReplicas": updated,
            "failedReplicas": failed,
            "currentWave": len(done),
            "waveProgress": f"{len(done)}/{total}",
        }
        if verdict is not None:
            derived["conditions"] = evaluate_conditions(
                verdict,
                status.get("conditions") or [],
                now=self.now,
                generation=self.meta.get("generation"),
            )
        return derived

    # -- the step ----------------------------------------------------------------------------

    async def run(self) -> tuple[dict[str, Any], float]:
        if self.status.get("targetVersion") != self.spec.version:
            await self.start_rollout()
            return self.obj, 0.0
        phase = self.status.get("phase")
        if phase in TERMINAL_PHASES:
            await self.write({})
            return self.obj, self.tuning.idle_poll_s
        if not self.pods and not self.status.get("waves"):
            await self.write(
                {"phase": Phase.PENDING, "message": "no Running pod with an IP matches the selector"},
                Verdict(Phase.PENDING, "NoWorkers", "no Running pod with an IP matches the selector"),
            )
            return self.obj, self.tuning.idle_poll_s
        return self.obj, await self.advance()

    async def start_rollout(self) -> None:
        old_target = self.status.get("targetVersion")
        previous = self.status.get("stableVersion") or self.status.get("previousVersion")
        message = (
            f"rolling out {self.spec.version} to {len(self.pods)} pods in "
            f"{len(self.spec.strategy.waves)} waves"
        )
        self.memory.call_times.clear()
        self.memory.last_pull.clear()
        self.memory.busy_until.clear()
        self.memory.announced_failures.clear()
        await self.write(
            {
                "phase": Phase.PROGRESSING,
                "targetVersion": self.spec.version,
                "previousVersion": previous,
                "totalWaves": len(self.spec.strategy.waves),
                "waves": [],
                "workers": None,
                "startedAt": self.now,
                "completedAt": None,
                "message": message,
            },
            Verdict(Phase.PROGRESSING, "RolloutStarted", message),
        )
        if old_target and old_target != self.spec.version:
            log.info("retargeted %s -> %s", old_target, self.spec.version)
        self.emit("Normal", "RolloutStarted", message)

    async def advance(self) -> float:
        waves: list[dict[str, Any]] = list(self.status.get("waves") or [])
        index = sum(1 for w in waves if w.get("phase") == WavePhase.COMPLETED)
        total = len(self.spec.strategy.waves)
        if index >= total:
            return await self.finish()
        if index >= len(waves):
            await self.start_wave(index, waves)
            return 0.0
        return await self.run_wave(index, waves)

    async def start_wave(self, index: int, waves: list[dict[str, Any]]) -> None:
        assigned = [p for w in waves for p in w.get("pods", [])]
        members = plan_wave(
            index=index,
            waves=self.spec.strategy.waves,
            eligible=self.pods,
            assigned=assigned,
            key=f"{self.meta.get('uid', '')}/{self.spec.version}",
        )
        wave = {
            "index": index,
            "target": len(set(assigned) & set(self.pods)) + len(members),
            "pods": members,
            "called": [],
            "phase": WavePhase.RUNNING,
            "startedAt": self.now,
        }
        message = f"wave {index + 1}/{len(self.spec.strategy.waves)}: {len(members)} pods"
        await self.write(
            {"waves": [*waves, wave], "message": message}, Verdict(Phase.PROGRESSING, "WaveStarted", message)
        )
        self.emit(
            "Normal",
            "WaveStarted",
            message
            + (f" ({', '.join(members[:5])}" + (", ...)" if len(members) > 5 else ")") if members else ""),
        )

    def _request(self, wave: int) -> dict[str, Any]:
        source: dict[str, Any] = {"uri": self.spec.source.uri}
        if self.spec.source.manifest_digest:
            source["manifestDigest"] = self.spec.source.manifest_digest
        return {
            "version": self.spec.version,
            "verify_checksum": self.spec.verify_checksum,
            "source": source,
            "rollout": {
                "namespace": self.meta["namespace"],
                "name": self.meta["name"],
                "uid": self.meta.get("uid", ""),
                "wave": wave,
            },
        }

    async def run_wave(self, index: int, waves: list[dict[str, Any]]) -> float:
        wave = dict(waves[index])
        target = self.spec.version
        workers: dict[str, Any] = self.status.get("workers") or {}
        called = set(wave.get("called", []))
        outcomes = {
            p: reported_outcome(workers.get(p), target=target, present=p in self.pods, called=p in called)
            for p in wave.get("pods", [])
        }
        await self.announce_failures(outcomes, workers)

        uncalled = [p for p, o in outcomes.items() if o is Outcome.UNCALLED]
        if uncalled:
            batch = uncalled[: self.tuning.call_batch]
            wave["called"] = [*wave.get("called", []), *batch]
            waves[index] = wave
            # Intent first: a crash after this write and before the calls is repaired by the
            # pull fallback (the agent reports it never saw the call), never by a blind re-call.
            await self.write({"waves": waves})
            await self.call(batch, index)
            return 0.0

        waiting = [p for p, o in outcomes.items() if o is Outcome.WAITING]
        if waiting:
            await self.check_waiting(waiting, index)
            return self.tuning.poll_s
        return await self.complete_wave(index, waves, outcomes)

    async def call(self, pods: list[str], wave: int) -> None:
        body = self._request(wave)
        sem = asyncio.Semaphore(self.spec.strategy.max_concurrency)
        failures: dict[str, Any] = {}

        async def one(name: str) -> None:
            pod = self.pods[name]
            async with sem:
                result = await self.owner.agents.update_weights(pod.ip, self.spec.agent.port, body)
            self.memory.call_times[name] = time.monotonic()
            if result.busy:
                # Another load runs (e.g. a superseded version): it finishes first, then we call.
                self.memory.busy_until[name] = time.monotonic() + self.tuning.busy_retry_s
            elif not result.accepted:
                failures[name] = self._failure_entry(result, wave)

        await asyncio.gather(*(one(p) for p in pods))
        if failures:
            await self.write({"workers": failures})

    def _failure_entry(self, result: CallResult, wave: int) -> dict[str, Any]:
        if result.status == 0:
            reason, message = "AgentUnreachable", result.error
        else:
            reason = str(result.body.get("error") or f"HTTP{result.status}")
            message = str(result.body.get("message") or result.body)
        return {
            "version": self.spec.version,
            "phase": "Failed",
            "reason": reason,
            "message": message[:1000],
            "lastTransitionTime": self.now,
            "wave": wave,
        }

    async def check_waiting(self, waiting: list[str], wave: int) -> None:
        now = time.monotonic()
        updates: dict[str, Any] = {}
        to_pull: list[str] = []
        recall: list[str] = []
        for name in waiting:
            called_at = self.memory.call_times.setdefault(name, now)
            if now - called_at > self.spec.timeouts.worker_seconds:
                updates[name] = {
                    "version": self.spec.version,
                    "phase": "Failed",
                    "reason": "WorkerTimeout",
                    "message": f"no outcome within {self.spec.timeouts.worker_seconds}s",
                    "lastTransitionTime": self.now,
                    "wave": wave,
                }
                continue
            busy = self.memory.busy_until.get(name)
            if busy is not None:
                if now >= busy:
                    recall.append(name)
                continue
            last = self.memory.last_pull.get(name)
            due = now - called_at >= self.tuning.pull_after_s or name not in self.memory.last_pull
            if due and (last is None or now - last >= self.tuning.pull_every_s):
                to_pull.append(name)
        if recall:
            for name in recall:
                self.memory.busy_until.pop(name, None)
            await self.call(recall, wave)
        pulled = await asyncio.gather(
            *(self.owner.agents.status(self.pods[n].ip, self.spec.agent.port) for n in to_pull)
        )
        for name, result in zip(to_pull, pulled, strict=True):
            self.memory.last_pull[name] = now
            if not result.accepted:
                continue  # unreachable for now: the worker timeout decides
            outcome, reason, message = pulled_outcome(result.body, target=self.spec.version)
            if outcome is Outcome.UPDATED or outcome is Outcome.FAILED:
                updates[name] = {
                    "version": self.spec.version,
                    "phase": outcome.value,
                    "reason": reason,
                    "message": message,
                    "checksumVerified": bool(result.body.get("checksum_verified")),
                    "lastTransitionTime": self.now,
                    "wave": wave,
                }
            elif outcome is Outcome.LOST:
                recall.append(name)
                await self.call([name], wave)
        if updates:
            await self.write({"workers": updates})

    async def announce_failures(self, outcomes: dict[str, Outcome], workers: dict[str, Any]) -> None:
        for name, outcome in outcomes.items():
            if outcome is Outcome.FAILED and name not in self.memory.announced_failures:
                self.memory.announced_failures.add(name)
                entry = workers.get(name, {})
                self.emit(
                    "Warning",
                    "WorkerFailed",
                    f"{name}: {entry.get('reason')}: {entry.get('message', '')}"[:1000],
                )

    async def complete_wave(
        self, index: int, waves: list[dict[str, Any]], outcomes: dict[str, Outcome]
    ) -> float:
        workers: dict[str, Any] = dict(self.status.get("workers") or {})
        failed_here = [p for p, o in outcomes.items() if o is Outcome.FAILED]
        failed_total = sum(
            1
            for e in workers.values()
            if e.get("version") == self.spec.version and e.get("phase") == "Failed"
        )
        budget = failure_budget(self.spec.failure_policy.max_failures, len(self.pods))
        if failed_total > budget:
            return await self.fail(index, waves, failed_here, budget)

        total = len(self.spec.strategy.waves)
        if index == total - 1:
            assigned = {p for w in waves for p in w.get("pods", [])}
            late = sorted(set(self.pods) - assigned)
            if late:
                # Pods that appeared during the last wave join it rather than being left behind.
                wave = dict(waves[index])
                wave["pods"] = [*wave.get("pods", []), *late]
                waves[index] = wave
                await self.write({"waves": waves})
                return 0.0

        updated = [p for p, o in outcomes.items() if o is Outcome.UPDATED]
        gone = [p for p, o in outcomes.items() if o is Outcome.GONE]
        wave = dict(waves[index])
        wave.update(
            phase=WavePhase.COMPLETED,
            completedAt=self.now,
            updated=len(updated),
            failed=len(failed_here),
            gone=len(gone),
        )
        waves[index] = wave
        # Fold successes into the wave's counter so status stays small for big fleets;
        # failures stay listed for whoever investigates.
        folded = {p: None for p in updated if p in workers}
        message = f"wave {index + 1}/{total} completed: {len(updated)} updated"
        if failed_here:
            message += f", {len(failed_here)} failed (within budget {budget})"
        await self.write(
            {"waves": waves, "workers": folded or None, "message": message}
            if folded
            else {"waves": waves, "message": message}
        )
        self.emit("Normal", "WaveCompleted", message)
        return 0.0

    async def fail(self, index: int, waves: list[dict[str, Any]], failed: list[str], budget: int) -> float:
        workers = self.status.get("workers") or {}
        first = (
            failed[0] if failed else next((n for n, e in workers.items() if e.get("phase") == "Failed"), "?")
        )
        entry = workers.get(first, {})
        reason = str(entry.get("reason") or "WorkerFailed")
        message = (
            f"wave {index + 1}: worker {first} failed ({reason}: {entry.get('message', '')}); "
            f"{len(failed)} failed > budget {budget}"
        )
        if self.spec.failure_policy.on_failure is FailureAction.ROLLBACK:
            message += "; rollback is not implemented yet, halting"
        wave = dict(waves[index])
        wave.update(phase=WavePhase.FAILED, completedAt=self.now, failed=len(failed))
        waves[index] = wave
        await self.write(
            {"phase": Phase.FAILED, "waves": waves, "completedAt": self.now, "message": message},
            Verdict(Phase.FAILED, reason, message),
        )
        self.emit("Warning", "RolloutFailed", message)
        return self.tuning.idle_poll_s

    async def finish(self) -> float:
        message = f"{self.spec.version} is live on {self.status.get('updatedReplicas', 0)} pods"
        await self.write(
            {
                "phase": Phase.SUCCEEDED,
                "stableVersion": self.spec.version,
                "completedAt": self.now,
                "message": message,
            },
            Verdict(Phase.SUCCEEDED, "RolloutCompleted", message),
        )
        self.emit("Normal", "RolloutCompleted", message)
        return self.tuning.idle_poll_s
