"""A Plan — what one reconcile step decided — and the Draft the machine builds it in.

The executor runs a Plan in this order: the status (with wave membership and the pods about to
be called: intent first), events and metrics, the cancels, then the calls, pulls, probe and
analysis measurement. Nothing here does I/O."""

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property

from ckpt_api.agent_api import UpdateWeightsRequest
from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.status import CheckpointRolloutStatus, Condition, WaveStatus, WorkerStatus
from ckpt_api.vocabulary import EventReason, EventType, WaveKind, WavePhase, WorkerPhase
from ckpt_rollout.domain.conditions import Verdict, evaluate_conditions
from ckpt_rollout.domain.outcomes import failed_workers
from ckpt_rollout.domain.replicas import Replicas, form_replicas
from ckpt_rollout.domain.troubles import Trouble
from ckpt_rollout.domain.world import Memory, Now, Peer, Pod, Tuning


@dataclass(frozen=True)
class Meta:
    namespace: str
    name: str
    uid: str
    generation: int | None
    created: str
    annotations: Mapping[str, str]


@dataclass(frozen=True)
class Rollout:
    """Everything a step reads: the CR, its selected pods, the other CRs of its namespace."""

    meta: Meta
    spec: CheckpointRolloutSpec
    status: CheckpointRolloutStatus
    pods: Mapping[str, Pod]  # Running, with an IP, matching spec.selector
    peers: tuple[Peer, ...] = ()
    # Selected pods that are not Running and cannot start, with why.
    stuck: Mapping[str, Trouble] = field(default_factory=dict)

    @cached_property
    def replicas(self) -> Replicas:
        return form_replicas(self.pods, self.spec.replica_groups)

    @property
    def units(self) -> Mapping[str, Pod]:
        """What waves, budgets and counters count: whole replicas' leaders (every pod when the
        rollout has no replica groups)."""
        return self.replicas.leaders


@dataclass(frozen=True)
class Call:
    pod: str
    ip: str
    port: int
    request: UpdateWeightsRequest


@dataclass(frozen=True)
class Pull:
    """Read the agent's /v1/status for the outcome of its load of ``version``."""

    pod: str
    ip: str
    port: int
    version: str
    wave: int


@dataclass(frozen=True)
class Cancel:
    """Stop the agent's load of ``version`` (POST /v1/cancel_load): the operator gave it up, so
    the agent is freed now rather than at the load's own deadline."""

    pod: str
    ip: str
    port: int
    version: str


@dataclass(frozen=True)
class Probe:
    """Ask the agent what it serves (the rollout's previousVersion, on its first rollout)."""

    pod: str
    ip: str
    port: int


@dataclass(frozen=True)
class Measurement:
    """Run a wave's analysis queries once, each an instant query, and keep the answers in
    Memory.measured under ``key`` (the version, wave and measurement number)."""

    key: str
    address: str
    queries: tuple[tuple[str, str], ...]  # (name, PromQL with its placeholders filled in)
    timeout_s: float


@dataclass(frozen=True)
class Event:
    type: EventType
    reason: EventReason
    message: str


class Measure(Enum):
    WORKERS = "workers"  # label: a WorkerResult; value: how many
    WAVE_SECONDS = "wave_seconds"
    ROLLOUT_SECONDS = "rollout_seconds"  # label: the end phase


@dataclass(frozen=True)
class Metric:
    measure: Measure
    value: float
    label: str = ""


@dataclass
class Plan:
    status: CheckpointRolloutStatus
    calls: list[Call] = field(default_factory=list)
    pulls: list[Pull] = field(default_factory=list)
    cancels: list[Cancel] = field(default_factory=list)  # sent before the calls
    # A switched (or given up) replica's followers told their staged version is settled, so
    # their pods are Ready again; noops, answered at once, outcomes never waited for.
    confirms: list[Call] = field(default_factory=list)
    probe: Probe | None = None
    measurement: Measurement | None = None
    events: list[Event] = field(default_factory=list)
    metrics: list[Metric] = field(default_factory=list)
    # Memory bookkeeping for the executor.
    reset_memory: bool = False
    first_seen: list[str] = field(default_factory=list)  # waiting pods with no call time known
    consumed: list[str] = field(default_factory=list)  # Memory.heard entries now in status
    announced: list[str] = field(default_factory=list)
    wake_after: float | None = None  # None: only a change to the CR or its pods needs a look
    # A pulled member waits for its pod's WeightsReady condition to change (drive._doorbell):
    # such a change is worth a look before wake_after.
    doorbell: bool = False


class Draft:
    """The status being decided plus the Plan's other parts, built by one decide() call.

    Status parts are replaced, never changed in place, so the parsed status the step started
    from stays intact for the executor's diff."""

    def __init__(self, rollout: Rollout, memory: Memory, tuning: Tuning, now: Now) -> None:
        self.rollout = rollout
        self.spec = rollout.spec
        self.memory = memory
        self.tuning = tuning
        self.now = now
        self.status = rollout.status.model_copy()
        self.verdict: Verdict | None = None
        self.plan = Plan(status=self.status)
        self._wake: float | None = None

    # -- status --------------------------------------------------------------------------

    def set(self, verdict: Verdict | None = None, **fields: object) -> None:
        """Replace top-level status fields (model field names); a verdict sets the conditions."""
        self.status = self.status.model_copy(update=fields)
        if verdict is not None:
            self.verdict = verdict

    def set_workers(self, entries: Mapping[str, WorkerStatus | None]) -> None:
        """Upsert worker entries; None removes one."""
        workers = dict(self.status.workers)
        for name, entry in entries.items():
            if entry is None:
                workers.pop(name, None)
            else:
                workers[name] = entry
        self.set(workers=workers)

    def set_wave(self, index: int, **changes: object) -> None:
        waves = list(self.status.waves)
        waves[index] = waves[index].model_copy(update=changes)
        self.set(waves=waves)

    def add_wave(self, wave: WaveStatus) -> None:
        self.set(waves=[*self.status.waves, wave])

    # -- the rest of the plan --------------------------------------------------------------

    def event(self, type_: EventType, reason: EventReason, message: str) -> None:
        self.plan.events.append(Event(type_, reason, message))

    def metric(self, measure: Measure, value: float, label: str = "") -> None:
        self.plan.metrics.append(Metric(measure, value, label))

    def wake(self, after: float) -> None:
        """Look again within ``after`` seconds (the earliest asked for wins)."""
        after = max(0.0, after)
        self._wake = after if self._wake is None else min(self._wake, after)

    def finish(self) -> Plan:
        status = self.status.model_copy(update=derived_counters(self.status, self.rollout))
        if self.verdict is not None:
            existing = [c.to_wire() for c in status.conditions]
            conditions = evaluate_conditions(
                self.verdict, existing, now=self.now.stamp, generation=self.rollout.meta.generation
            )
            status = status.model_copy(
                update={"conditions": [Condition.model_validate(c) for c in conditions]}
            )
        self.plan.status = status
        self.plan.wake_after = self._wake
        return self.plan


def updated_replicas(status: CheckpointRolloutStatus) -> int:
    """Pods on the target version: completed waves' counts, and running waves' reported loads."""
    target = status.target_version
    done = [w for w in status.waves if w.phase is WavePhase.COMPLETED]
    running = {p for w in status.waves if w.phase is not WavePhase.COMPLETED for p in w.pods}
    return sum(w.updated for w in done) + sum(
        1
        for name, e in status.workers.items()
        if name in running and e.version == target and e.phase is WorkerPhase.UPDATED
    )


def derived_counters(status: CheckpointRolloutStatus, rollout: Rollout) -> dict[str, object]:
    """Counters for kubectl and kstatus, re-derived from waves and workers on every step."""
    done = [w for w in status.waves if w.phase is WavePhase.COMPLETED]
    failed = len(failed_workers(status, rollout.units))
    spec_done = sum(1 for w in done if w.kind is WaveKind.SPEC)
    total = len(rollout.spec.strategy.waves)
    return {
        "observed_generation": rollout.meta.generation,
        "replicas": len(rollout.units),
        "updated_replicas": updated_replicas(status),
        "failed_replicas": failed,
        "current_wave": spec_done,
        "total_waves": total,
        "wave_progress": f"{spec_done}/{total}",
    }


def unit_word(d: Draft) -> str:
    """What messages count: replicas where they span pods, else pods."""
    return "replica" if d.spec.replica_groups is not None else "pod"


def spec_wave_name(d: Draft, spec_index: int) -> str:
    return f"wave {spec_index + 1}/{len(d.spec.strategy.waves)}"


def wave_name(d: Draft, wave: WaveStatus) -> str:
    """How messages name a status wave: a spec wave as "wave N/M", the others by their kind."""
    if wave.spec_index is None:
        return f"{wave.kind} wave"
    return spec_wave_name(d, wave.spec_index)
