"""Runs one reconcile step: parse the CR, ask the machine for a Plan, carry it out.

Order matters for crash safety: the Plan's status (wave membership, the pods about to be
called) is written before the calls go out, so a restart never re-calls blindly: the pull
fallback asks the agent whether it saw the call. What the calls and pulls return goes into the
CR's Memory and reaches status through the next step's Plan."""

import asyncio
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException

from ckpt_api.spec import CheckpointRolloutSpec
from ckpt_api.status import CheckpointRolloutStatus
from ckpt_api.vocabulary import WorkerPhase, WorkerReason
from ckpt_api.worker_entries import worker_entry
from ckpt_rollout.domain.drive import failure_entry
from ckpt_rollout.domain.entry_trust import trusted_status, untrusted_entries
from ckpt_rollout.domain.machine import decide
from ckpt_rollout.domain.mergepatch import merge_diff
from ckpt_rollout.domain.outcomes import Outcome, pulled_outcome
from ckpt_rollout.domain.plan import Call, Cancel, Measure, Meta, Plan, Pull, Rollout
from ckpt_rollout.domain.selectors import selector_matches
from ckpt_rollout.domain.troubles import ongoing, pod_trouble, wants_events
from ckpt_rollout.domain.world import Memory, Now, Peer, Pod, Tuning, parse_time, rfc3339
from ckpt_rollout.io import metrics, promquery
from ckpt_rollout.io.agent_client import AgentClient, CallResult
from ckpt_rollout.io.kube import RolloutApi

log = logging.getLogger(__name__)
_UPDATE_SECONDS = metrics.AGENT_CALL_SECONDS.labels("update_weights")

Emit = Callable[[str, str, str], None]  # (type, reason, message)
Warnings = Mapping[str, Sequence[dict[str, Any]]]  # pod uid -> its Warning events
# A pod's Warning events are read again after this long while it still cannot start.
WARNINGS_TTL_S = 5.0


def _selected_waiting(
    spec: CheckpointRolloutSpec, waiting: list[dict[str, Any]] | None
) -> list[dict[str, Any]]:
    return [
        pod
        for pod in waiting or []
        if selector_matches(spec.selector, (pod.get("metadata") or {}).get("labels") or {})
    ]


def rollout_from(
    obj: dict[str, Any],
    pods: list[Pod],
    peers: list[Peer],
    waiting: list[dict[str, Any]] | None = None,
    warnings: Warnings | None = None,
) -> Rollout:
    """The typed view of a CR as the apiserver returned it. ``waiting``: pods (as the apiserver
    returned them) not Running yet, of which those that cannot start are the rollout's stuck ones;
    ``warnings``: the Warning events read for some of them."""
    meta = obj["metadata"]
    spec = CheckpointRolloutSpec.model_validate(obj["spec"])
    stuck = {}
    for pod in _selected_waiting(spec, waiting):
        pod_meta = pod.get("metadata") or {}
        said = (warnings or {}).get(str(pod_meta.get("uid")), ())
        trouble = pod_trouble(pod, time.time(), parse_time(pod_meta.get("creationTimestamp")), said)
        if trouble is not None:
            stuck[str(pod_meta.get("name"))] = trouble
    return Rollout(
        meta=Meta(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta.get("uid", ""),
            generation=meta.get("generation"),
            created=meta.get("creationTimestamp") or "",
            annotations=meta.get("annotations") or {},
        ),
        spec=spec,
        status=CheckpointRolloutStatus.model_validate(obj.get("status") or {}),
        pods={p.name: p for p in pods if selector_matches(spec.selector, p.labels)},
        peers=tuple(peers),
        stuck=stuck,
    )


def _trusted(rollout: Rollout, memory: Memory) -> Rollout:
    """The rollout without the worker entries it cannot tie to its pods, each logged once."""
    ignored = untrusted_entries(rollout.status, {n: p.uid for n, p in rollout.pods.items()})
    for name, why in ignored.items():
        if f"{name}: {why}" not in memory.ignored:
            memory.ignored.add(f"{name}: {why}")
            log.warning(
                "%s/%s: ignoring status.workers.%s: %s", rollout.meta.namespace, rollout.meta.name, name, why
            )
    return (
        dataclasses.replace(rollout, status=trusted_status(rollout.status, ignored)) if ignored else rollout
    )


class Reconciler:
    def __init__(self, api: RolloutApi, agents: AgentClient, tuning: Tuning | None = None) -> None:
        self.api = api
        self.agents = agents
        self.tuning = tuning or Tuning()
        # pod uid -> (monotonic time read, its Warning events): one read per pod per TTL, however
        # many rollouts select it.
        self._warnings: dict[str, tuple[float, list[dict[str, Any]]]] = {}

    async def _warnings_of(self, obj: dict[str, Any], waiting: list[dict[str, Any]] | None) -> Warnings:
        """The Warning events of the selected pods whose containers take long to be created."""
        if not waiting:
            return {}
        now, mono = time.time(), time.monotonic()
        self._warnings = {
            uid: kept for uid, kept in self._warnings.items() if mono - kept[0] < WARNINGS_TTL_S
        }
        found: dict[str, list[dict[str, Any]]] = {}
        for pod in _selected_waiting(CheckpointRolloutSpec.model_validate(obj["spec"]), waiting):
            meta = pod.get("metadata") or {}
            uid = str(meta.get("uid") or "")
            if not uid or not wants_events(pod, now, parse_time(meta.get("creationTimestamp"))):
                continue
            if uid not in self._warnings:
                try:
                    events = await self.api.pod_warnings(str(meta.get("namespace")), uid)
                except ApiException as exc:
                    # Without `list events` (RBAC older than the chart's) the pod is still named,
                    # after CREATING_GRACE_S, without the event's words.
                    log.debug("events of pod %s: API error %s", meta.get("name"), exc.status)
                    events = []
                self._warnings[uid] = (mono, events)
            found[uid] = self._warnings[uid][1]
        return found

    async def step(
        self,
        obj: dict[str, Any],
        pods: list[Pod],
        memory: Memory,
        emit: Emit,
        peers: list[Peer] | None = None,
        waiting: list[dict[str, Any]] | None = None,
    ) -> tuple[dict[str, Any], float | None]:
        """One step. Returns the CR as last written (or ``obj``) and when to look again
        (None: when the CR or its pods change)."""
        rollout = rollout_from(obj, pods, peers or [], waiting, await self._warnings_of(obj, waiting))
        rollout = _trusted(rollout, memory)
        now = Now(wall=time.time(), mono=time.monotonic())
        plan = decide(rollout, memory, self.tuning, now)
        log.debug(
            "%s/%s: %s, %d calls, %d pulls, next look %s",
            rollout.meta.namespace,
            rollout.meta.name,
            plan.status.phase,
            len(plan.calls),
            len(plan.pulls),
            "on change" if plan.wake_after is None else f"in {plan.wake_after:.2f}s",
        )
        meta = rollout.meta
        patch = merge_diff(rollout.status.to_wire(), plan.status.to_wire())
        if patch:
            obj = await self.api.patch_status(meta.namespace, meta.name, patch)
        remember(memory, plan, now.mono, rollout.pods)  # only once the plan's status is stored
        metrics.observe_rollout((meta.namespace, meta.name), rollout.spec, plan.status)
        for event in plan.events:
            emit(event.type, event.reason, event.message)
        _measure(plan)
        # Before the calls: a rollback's call then finds its agent free, not busy with the load
        # the cancel stops.
        await self._cancels(plan.cancels, meta.namespace)
        heard = len(memory.heard) + len(memory.lost)
        probed, measured = memory.probed, memory.measured
        await asyncio.gather(
            self._calls(plan.calls, memory, rollout.spec.strategy.max_concurrency, meta.namespace),
            self._confirms(plan.confirms, memory, meta.namespace),
            self._pulls(plan.pulls, memory, now.stamp, meta.namespace),
            self._probe(plan, memory, meta.namespace),
            self._measure(plan, memory),
        )
        # A measurement taken is folded in at once (its answers may equal the last ones).
        changed = memory.probed != probed or memory.measured != measured or plan.measurement is not None
        if len(memory.heard) + len(memory.lost) != heard or changed:
            return obj, 0.0  # something to act on: the next step at once
        return obj, plan.wake_after

    async def _calls(self, calls: list[Call], memory: Memory, concurrency: int, namespace: str) -> None:
        if not calls:
            return
        sem = asyncio.Semaphore(concurrency)

        async def one(call: Call) -> None:
            async with sem:
                started = time.monotonic()
                result = await self.agents.update_weights(
                    call.ip, call.port, call.request, namespace=namespace, pod=call.pod
                )
                _UPDATE_SECONDS.observe(time.monotonic() - started)
            record_call(memory, call, result, self.tuning, time.monotonic(), _stamp(int(time.time())))

        await asyncio.gather(*(one(c) for c in calls))

    async def _confirms(self, confirms: list[Call], memory: Memory, namespace: str) -> None:
        """Best effort, sent once: a follower that missed its confirm stays NotReady (Staged)
        until its replica's next switch, which its pod's condition says."""
        sent = [
            self.agents.update_weights(c.ip, c.port, c.request, namespace=namespace, pod=c.pod)
            for c in confirms
        ]
        for confirm, result in zip(confirms, await asyncio.gather(*sent), strict=True):
            memory.confirmed.add(f"{confirm.pod}/{confirm.request.version}")
            if not result.accepted:
                why = result.status or result.error
                log.warning(
                    "%s/%s: confirm of %s refused (%s)", namespace, confirm.pod, confirm.request.version, why
                )

    async def _cancels(self, cancels: list[Cancel], namespace: str) -> None:
        """Best effort: an agent that cannot be told stops at its load's own deadline."""
        if not cancels:
            return
        results = await asyncio.gather(
            *(
                self.agents.cancel_load(c.ip, c.port, c.version, namespace=namespace, pod=c.pod)
                for c in cancels
            )
        )
        for cancel, result in zip(cancels, results, strict=True):
            said = "cancelled" if result.status == 200 else f"not cancelled ({result.status or result.error})"
            log.info("%s/%s: load of %s %s", namespace, cancel.pod, cancel.version, said)

    async def _pulls(self, pulls: list[Pull], memory: Memory, stamp: str, namespace: str) -> None:
        if not pulls:
            return
        results = await asyncio.gather(
            *(self.agents.status(p.ip, p.port, namespace=namespace, pod=p.pod) for p in pulls)
        )
        now = time.monotonic()
        for pull, result in zip(pulls, results, strict=True):
            record_pull(memory, pull, result, now, stamp)

    async def _probe(self, plan: Plan, memory: Memory, namespace: str) -> None:
        if plan.probe is None:
            return
        probe = plan.probe
        result = await self.agents.status(probe.ip, probe.port, namespace=namespace, pod=probe.pod)
        served = result.agent_status.version if result.agent_status is not None else None
        memory.probed = (plan.probe.pod, served)

    async def _measure(self, plan: Plan, memory: Memory) -> None:
        if plan.measurement is None:
            return
        memory.measured = (plan.measurement.key, await promquery.measure(plan.measurement))


@functools.lru_cache(maxsize=2)
def _stamp(second: int) -> str:
    # Every recorded call is stamped; a wave's thousands of calls share a few seconds.
    return rfc3339(second)


def remember(memory: Memory, plan: Plan, now: float, pods: Mapping[str, Pod] | None = None) -> None:
    """What the plan says about Memory, once its status is stored. ``pods``: the step's pods, whose
    WeightsReady conditions are noted as they were when their agents are asked."""
    if plan.reset_memory:
        memory.reset()
    for name in plan.first_seen:
        memory.call_times.setdefault(name, now)
    for name in plan.consumed:
        memory.heard.pop(name, None)
    memory.announced.update(plan.announced)
    for call in plan.calls:
        memory.lost.discard(call.pod)
        memory.busy_until.pop(call.pod, None)
    memory.doorbell = plan.doorbell
    for name in [c.pod for c in plan.calls] + [p.pod for p in plan.pulls]:
        pod = (pods or {}).get(name)
        memory.asked[name] = pod.weights if pod is not None else None


def record_call(
    memory: Memory, call: Call, result: CallResult, tuning: Tuning, now: float, stamp: str
) -> None:
    """What an update_weights answer tells the next step."""
    trouble = result.trouble()
    if trouble is not None and trouble.retried:
        # Nobody listens yet (a pod that just started, its agent still booting), or the agent
        # could not review our token while the apiserver is away: the request did nothing, so
        # calling again is safe. No answer came (a slow agent, a reset): the pull asks whether
        # the call arrived, and it is sent again only if not (Outcome.LOST). The worker timeout
        # runs from the first attempt and bounds the wait; meanwhile the cause is shown
        # (domain.stalls).
        memory.troubles[call.pod] = ongoing(memory.troubles.get(call.pod), trouble, now)
        memory.call_times.setdefault(call.pod, now)
        if not trouble.ask_first:
            memory.busy_until[call.pod] = now + tuning.busy_retry_s
        return
    memory.troubles.pop(call.pod, None)
    memory.call_times[call.pod] = now
    if result.busy:
        # Another load runs (e.g. a superseded version): it finishes first, then we call.
        memory.busy_until[call.pod] = now + tuning.busy_retry_s
    elif not result.accepted:
        reason, message = (trouble.reason, trouble.message) if trouble is not None else describe(result)
        rollout = call.request.rollout
        wave = rollout.wave if rollout is not None else 0
        memory.heard[call.pod] = failure_entry(call.request.version, wave, reason, message, stamp)


def record_pull(memory: Memory, pull: Pull, result: CallResult, now: float, stamp: str) -> None:
    """What a /v1/status answer tells the next step."""
    memory.last_pull[pull.pod] = now
    if not result.accepted or result.agent_status is None:
        # Unreachable for now (the worker timeout decides): why is shown meanwhile.
        trouble = result.trouble()
        if trouble is not None:
            memory.troubles[pull.pod] = ongoing(memory.troubles.get(pull.pod), trouble, now)
        return
    memory.troubles.pop(pull.pod, None)
    outcome, reason, message = pulled_outcome(result.agent_status, target=pull.version)
    last = result.agent_status.last_load
    moved = last if last is not None and last.version == pull.version else None
    if outcome is Outcome.UPDATED or outcome is Outcome.FAILED:
        memory.heard[pull.pod] = worker_entry(
            bytes=moved.bytes if moved is not None else None,
            bytes_from_peers=moved.bytes_from_peer
            if moved is not None and outcome is Outcome.UPDATED
            else None,
            version=pull.version,
            phase=WorkerPhase.UPDATED if outcome is Outcome.UPDATED else WorkerPhase.FAILED,
            reason=reason,
            message=message,
            checksum_verified=result.agent_status.checksum_verified,
            last_transition_time=stamp,
            wave=pull.wave,
            manifest_digest=result.agent_status.manifest_digest if outcome is Outcome.UPDATED else None,
        )
    elif outcome is Outcome.LOST:
        memory.lost.add(pull.pod)


def describe(result: CallResult) -> tuple[str, str]:
    if result.status == 0:
        return WorkerReason.AGENT_UNREACHABLE, result.error
    error = result.error_body()
    if error is not None:
        return error.error, error.message
    return f"HTTP{result.status}", str(result.body.get("message") or result.body)


def _measure(plan: Plan) -> None:
    for metric in plan.metrics:
        if metric.measure is Measure.WORKERS:
            metrics.WORKERS.labels(metric.label).inc(metric.value)
        elif metric.measure is Measure.WAVE_SECONDS:
            metrics.WAVE_SECONDS.observe(metric.value)
        else:
            metrics.ROLLOUT_SECONDS.labels(metric.label).observe(metric.value)
