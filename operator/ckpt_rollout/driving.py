"""The base of a reconcile step: status writes with derived fields, and the one primitive every
phase uses — drive a set of pods to a version (intent-first calls, push outcomes, pull
fallback, per-worker timeout)."""

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from ckpt_api.agent_api import RolloutRef, SourceRef, UpdateWeightsRequest
from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import (
    EventReason,
    EventType,
    Phase,
    WaveKind,
    WavePhase,
    WorkerPhase,
    WorkerReason,
    WorkerResult,
)
from ckpt_rollout import metrics
from ckpt_rollout.agent_client import AgentClient, CallResult, agent_url
from ckpt_rollout.conditions import Verdict, evaluate_conditions
from ckpt_rollout.kube import RolloutApi
from ckpt_rollout.mergepatch import apply_merge_patch
from ckpt_rollout.outcomes import Outcome, pulled_outcome, reported_outcome
from ckpt_rollout.selectors import selector_matches

Emit = Callable[[str, str, str], None]  # (type, reason, message)


def utcnow() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


@dataclass(frozen=True)
class Pod:
    name: str
    ip: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Peer:
    """Another CheckpointRollout in the same namespace (for selector conflicts)."""

    name: str
    created: str
    selector: dict[str, Any]


@dataclass
class Tuning:
    poll_s: float = 0.5
    idle_poll_s: float = 2.0
    pull_after_s: float = 5.0
    pull_every_s: float = 3.0
    busy_retry_s: float = 1.0
    call_batch: int = 512
    # Waves larger than this are pulled: their agents are asked not to write status.workers
    # (N agents merge-patching one CR serialize in the apiserver, with conflict retries: at a
    # few hundred concurrent reporters patches time out), and the operator pulls /v1/status
    # from pull_first_s after the call, then every half of the time waited (at most
    # pull_every_s, at least what keeps the wave under pull_rate pulls a second), writing each
    # step's outcomes in one patch.
    push_max_wave: int = 8
    pull_first_s: float = 0.25
    pull_rate: float = 500.0


@dataclass
class Memory:
    """Per-CR in-memory hints. Losing them (a restart) only makes the operator pull sooner."""

    call_times: dict[str, float] = field(default_factory=dict)
    last_pull: dict[str, float] = field(default_factory=dict)
    busy_until: dict[str, float] = field(default_factory=dict)
    announced: set[str] = field(default_factory=set)

    def reset(self) -> None:
        self.call_times.clear()
        self.last_pull.clear()
        self.busy_until.clear()
        self.announced.clear()


class StepBase:
    def __init__(
        self,
        api: RolloutApi,
        agents: AgentClient,
        tuning: Tuning,
        obj: dict[str, Any],
        pods: list[Pod],
        memory: Memory,
        emit: Emit,
    ) -> None:
        self.api = api
        self.agents = agents
        self.tuning = tuning
        self.obj = obj
        self.meta = obj["metadata"]
        self.annotations: dict[str, str] = self.meta.get("annotations") or {}
        self.spec = CheckpointRolloutSpec.model_validate(obj["spec"])
        self.status: dict[str, Any] = obj.get("status") or {}
        self.pods = {p.name: p for p in pods if selector_matches(self.spec.selector, p.labels)}
        self.memory = memory
        self.emit = emit
        self.now = utcnow()
        self.key = (self.meta["namespace"], self.meta["name"])
        self.pulling = False  # this step drives a wave too big for agent pushes

    # -- status writes -----------------------------------------------------------------------

    async def write(self, changes: dict[str, Any], verdict: Verdict | None = None) -> None:
        """Merge-patch ``changes`` into status with re-derived counters and conditions; fields
        that would not change are left out, and nothing is sent when nothing changes."""
        merged = apply_merge_patch(self.status, changes)
        derived = self.derived(merged, verdict)
        patch = {k: v for k, v in changes.items() if self.status.get(k) != v or v is None}
        patch.update({k: v for k, v in derived.items() if self.status.get(k) != v})
        patch = {k: v for k, v in patch.items() if not (v is None and k not in self.status)}
        if not patch:
            return
        self.obj = await self.api.patch_status(self.meta["namespace"], self.meta["name"], patch)
        self.status = self.obj.get("status") or {}
        metrics.observe_phase(self.key, self.status.get("phase"))

    def derived(self, status: dict[str, Any], verdict: Verdict | None) -> dict[str, Any]:
        waves = status.get("waves") or []
        target = status.get("targetVersion")
        workers = status.get("workers") or {}
        done = [w for w in waves if w.get("phase") == WavePhase.COMPLETED]
        running = {p for w in waves if w.get("phase") != WavePhase.COMPLETED for p in w.get("pods", [])}
        updated = sum(w.get("updated", 0) for w in done) + sum(
            1
            for name, e in workers.items()
            if name in running and e.get("version") == target and e.get("phase") == WorkerPhase.UPDATED
        )
        failed = sum(
            1 for e in workers.values() if e.get("version") == target and e.get("phase") == WorkerPhase.FAILED
        )
        spec_done = sum(1 for w in done if w.get("kind", WaveKind.SPEC) == WaveKind.SPEC)
        derived: dict[str, Any] = {
            "observedGeneration": self.meta.get("generation"),
            "replicas": len(self.pods),
            "updatedReplicas": updated,
            "failedReplicas": failed,
            "currentWave": spec_done,
            "totalWaves": len(self.spec.strategy.waves),
            "waveProgress": f"{spec_done}/{len(self.spec.strategy.waves)}",
        }
        if verdict is not None:
            derived["conditions"] = evaluate_conditions(
                verdict,
                status.get("conditions") or [],
                now=self.now,
                generation=self.meta.get("generation"),
            )
        return derived

    def observe_end(self, phase: Phase) -> None:
        started = parse_time(self.status.get("startedAt"))
        now = parse_time(self.now)
        if started is not None and now is not None:
            metrics.ROLLOUT_SECONDS.labels(phase.value).observe(now - started)

    # -- driving pods to a version -----------------------------------------------------------

    def request(self, version: str, wave: int, *, report: bool = True) -> UpdateWeightsRequest:
        # The pin is the spec version's: a rollback's previous version has its own manifest.
        pin = self.spec.source.manifest_digest if version == self.spec.version else None
        return UpdateWeightsRequest(
            version=version,
            verify_checksum=self.spec.verify_checksum,
            source=SourceRef(uri=self.spec.source.uri, manifestDigest=pin),
            rollout=RolloutRef(
                namespace=self.meta["namespace"],
                name=self.meta["name"],
                uid=self.meta["uid"],
                wave=wave,
                report=report,
            ),
        )

    async def drive(
        self,
        *,
        version: str,
        members: list[str],
        called: list[str],
        persist_called: Callable[[list[str]], Awaitable[None]],
        wave: int,
        may_call: bool = True,
    ) -> dict[str, Outcome] | None:
        """One step toward ``members`` serving ``version``. Returns every member's outcome once
        all are decided, else None (work continues on the next step)."""
        self.pulling = len(members) > self.tuning.push_max_wave
        outcomes = self.outcomes(members, called, version)
        uncalled = [p for p, o in outcomes.items() if o is Outcome.UNCALLED]
        if uncalled and may_call:
            # A pulled wave is called in full in this step, batch after batch; a pushed one
            # (small) is one batch.
            batches = range(0, len(uncalled), self.tuning.call_batch) if self.pulling else [0]
            for first in batches:
                batch = uncalled[first : first + self.tuning.call_batch]
                # Intent first: a crash after this write and before the calls is repaired by
                # the pull fallback (the agent says it never saw the call), never by a blind
                # re-call.
                called = [*called, *batch]
                await persist_called(called)
                await self.call(batch, version, wave)
            if not self.pulling:
                return None
            # Fast loads are done by now: pull them in this step rather than the next.
            await asyncio.sleep(self.tuning.pull_first_s)
            outcomes = self.outcomes(members, called, version)
            uncalled = [p for p, o in outcomes.items() if o is Outcome.UNCALLED]
        waiting = [p for p, o in outcomes.items() if o is Outcome.WAITING]
        if waiting:
            updates = await self.check_waiting(waiting, version, wave)
            if self.pulling and not uncalled and _all_updated(updates, waiting):
                # The last outcomes, all successes: the wave completes in this step and folds
                # them into its counter, so writing them first would be a patch for nothing.
                return {**outcomes, **dict.fromkeys(updates, Outcome.UPDATED)}
            if updates:
                await self.write({"workers": updates})
            if not self.pulling:
                return None
            outcomes = self.outcomes(members, called, version)
            if any(o is Outcome.WAITING for o in outcomes.values()):
                return None
        if uncalled:
            return None
        return outcomes

    def outcomes(self, members: list[str], called: list[str], version: str) -> dict[str, Outcome]:
        """Each member's outcome as the status says now (pushed or pulled entries)."""
        workers: dict[str, Any] = self.status.get("workers") or {}
        called_set = set(called)
        outcomes = {
            p: reported_outcome(
                workers.get(p), target=version, present=p in self.pods, called=p in called_set
            )
            for p in members
        }
        self.announce_failures(outcomes, workers)
        return outcomes

    def relay_peers(self, version: str) -> list[str]:
        """Pods that finished an earlier wave on ``version``: later waves pull bytes from them
        (the manifest still comes from the source, so a bad peer cannot inject weights)."""
        if not self.spec.strategy.peer_relay or version != self.spec.version:
            return []
        workers: dict[str, Any] = self.status.get("workers") or {}
        done = {
            p
            for w in self.status.get("waves") or []
            if w.get("phase") == WavePhase.COMPLETED
            for p in w.get("pods", [])
        }
        return sorted(
            p for p in done if p in self.pods and (workers.get(p) or {}).get("phase") != WorkerPhase.FAILED
        )

    async def call(self, pods: list[str], version: str, wave: int) -> None:
        body = self.request(version, wave, report=not self.pulling)
        peers = self.relay_peers(version)
        sem = asyncio.Semaphore(self.spec.strategy.max_concurrency)
        failures: dict[str, Any] = {}

        def body_for(position: int) -> UpdateWeightsRequest:
            if not peers or body.source is None:
                return body
            # Spread the wave over every updated peer, so relay fan-out doubles each wave.
            peer = self.pods[peers[position % len(peers)]]
            source = SourceRef(
                uri=body.source.uri,
                manifestDigest=body.source.manifest_digest,
                peer=agent_url(peer.ip, self.spec.agent.port),
            )
            return body.model_copy(update={"source": source})

        async def one(position: int, name: str) -> None:
            pod = self.pods[name]
            async with sem:
                started = time.monotonic()
                result = await self.agents.update_weights(pod.ip, self.spec.agent.port, body_for(position))
                metrics.AGENT_CALL_SECONDS.labels("update_weights").observe(time.monotonic() - started)
            if not result.connected:
                # Nobody listens yet (a pod that just started, its agent still booting): the
                # request never got there, so calling again is safe. The worker timeout runs
                # from the first attempt and bounds the wait.
                self.memory.call_times.setdefault(name, time.monotonic())
                self.memory.busy_until[name] = time.monotonic() + self.tuning.busy_retry_s
                return
            self.memory.call_times[name] = time.monotonic()
            if result.busy:
                # Another load runs (e.g. a superseded version): it finishes first, then we call.
                self.memory.busy_until[name] = time.monotonic() + self.tuning.busy_retry_s
            elif not result.accepted:
                failures[name] = self.failure_entry(version, wave, *self.describe(result))

        await asyncio.gather(*(one(i, p) for i, p in enumerate(pods)))
        if failures:
            await self.write({"workers": failures})

    @staticmethod
    def describe(result: CallResult) -> tuple[str, str]:
        if result.status == 0:
            return WorkerReason.AGENT_UNREACHABLE, result.error
        error = result.error_body()
        if error is not None:
            return error.error, error.message
        return f"HTTP{result.status}", str(result.body.get("message") or result.body)

    def failure_entry(self, version: str, wave: int, reason: str, message: str) -> dict[str, Any]:
        return WorkerStatus(
            version=version,
            phase=WorkerPhase.FAILED,
            reason=reason,
            message=message[:1000],
            last_transition_time=self.now,
            wave=wave,
        ).to_wire()

    async def check_waiting(self, waiting: list[str], version: str, wave: int) -> dict[str, Any]:
        """Time out, re-call or pull the waiting workers; returns the status.workers entries
        of those now decided (for the caller to write)."""
        now = time.monotonic()
        updates: dict[str, Any] = {}
        to_pull: list[str] = []
        recall: list[str] = []
        for name in waiting:
            called_at = self.memory.call_times.setdefault(name, now)
            if now - called_at > self.spec.timeouts.worker_seconds:
                updates[name] = self.failure_entry(
                    version,
                    wave,
                    WorkerReason.WORKER_TIMEOUT,
                    f"no outcome within {self.spec.timeouts.worker_seconds}s",
                )
                continue
            busy = self.memory.busy_until.get(name)
            if busy is not None:
                if now >= busy:
                    del self.memory.busy_until[name]
                    recall.append(name)
                continue
            last = self.memory.last_pull.get(name)
            if last is None:
                # First look since the call (or since a restart): pull once the agent had time
                # to push, or at once when we can't know when we called.
                first = self.tuning.pull_first_s if self.pulling else self.tuning.pull_after_s
                due = now - called_at >= first or called_at == now
            elif self.pulling:
                # Quick loads are seen quickly; long ones (in big waves) are not polled more
                # than the operator and the agents can take.
                every = max(
                    self.tuning.pull_first_s,
                    min(self.tuning.pull_every_s, (now - called_at) / 2),
                    len(waiting) / self.tuning.pull_rate,
                )
                due = now - last >= every
            else:
                due = now - last >= self.tuning.pull_every_s
            if due:
                to_pull.append(name)
        pulled = await asyncio.gather(
            *(self.agents.status(self.pods[n].ip, self.spec.agent.port) for n in to_pull)
        )
        for name, result in zip(to_pull, pulled, strict=True):
            self.memory.last_pull[name] = now
            if not result.accepted or result.agent_status is None:
                continue  # unreachable for now: the worker timeout decides
            outcome, reason, message = pulled_outcome(result.agent_status, target=version)
            if outcome is Outcome.UPDATED or outcome is Outcome.FAILED:
                updates[name] = WorkerStatus(
                    version=version,
                    phase=WorkerPhase.UPDATED if outcome is Outcome.UPDATED else WorkerPhase.FAILED,
                    reason=reason,
                    message=message[:1000],
                    checksum_verified=result.agent_status.checksum_verified,
                    last_transition_time=self.now,
                    wave=wave,
                ).to_wire()
            elif outcome is Outcome.LOST:
                recall.append(name)
        if recall:
            await self.call(recall, version, wave)
        return updates

    def announce_failures(self, outcomes: dict[str, Outcome], workers: dict[str, Any]) -> None:
        for name, outcome in outcomes.items():
            entry = workers.get(name, {})
            key = f"{name}/{entry.get('version')}"
            if outcome is Outcome.FAILED and key not in self.memory.announced:
                self.memory.announced.add(key)
                metrics.WORKERS.labels(WorkerResult.FAILED).inc()
                self.emit(
                    EventType.WARNING,
                    EventReason.WORKER_FAILED,
                    f"{name}: {entry.get('reason')}: {entry.get('message', '')}"[:1000],
                )


def _all_updated(updates: dict[str, Any], waiting: list[str]) -> bool:
    return len(updates) == len(waiting) and all(
        e.get("phase") == WorkerPhase.UPDATED for e in updates.values()
    )
