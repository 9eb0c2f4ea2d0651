"""The one primitive every phase uses: one step toward a set of pods serving a version. Decides
whom to call (intent recorded in the draft first), whom to pull, who timed out, and when to
look again. Pure: works on a Draft."""

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from ckpt_api.agent_api import HealthCheckRequest, LoadChecks, RolloutRef, SourceRef, UpdateWeightsRequest
from ckpt_api.relay_tree import fanout_for, feeds, relay_parents
from ckpt_api.spec import HealthCheck
from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import EventReason, EventType, WavePhase, WorkerPhase, WorkerReason, WorkerResult
from ckpt_api.worker_entries import worker_entry
from ckpt_rollout.domain.outcomes import Outcome, reported_outcome, settles
from ckpt_rollout.domain.pinning import learned_digests, pin_for
from ckpt_rollout.domain.plan import Call, Cancel, Draft, Measure, Pull
from ckpt_rollout.domain.troubles import Trouble
from ckpt_rollout.domain.world import agent_url


@dataclass(frozen=True)
class Target:
    """Members to bring to ``version``; ``wave`` is their status.waves index (one past the
    last for the rollback), ``called`` who was already sent the call."""

    version: str
    members: list[str]
    called: list[str]
    wave: int
    kind: Literal["wave", "rollback"]
    may_call: bool = True
    stage: bool = False  # a replica's followers, staging for their leaders (engine member)
    # Who may feed these members (relay roots); None: the pods of the waves completed already.
    peers: tuple[str, ...] | None = None


def failure_entry(version: str, wave: int, reason: str, message: str, stamp: str) -> WorkerStatus:
    return worker_entry(
        version=version,
        phase=WorkerPhase.FAILED,
        reason=reason,
        message=message,
        last_transition_time=stamp,
        wave=wave,
    )


def fold_heard(d: Draft) -> None:
    """Outcomes the operator learned since the last step become status entries, unless the
    agent's own push already decided that load (a load cancelled as its agent stopped decided
    nothing: what the restarted agent did next replaces it)."""
    if not d.memory.heard:
        return
    entries: dict[str, WorkerStatus] = {}
    for name, entry in d.memory.heard.items():
        current = d.status.workers.get(name)
        if current is None or not settles(current, entry.version):
            entries[name] = entry
    d.plan.consumed.extend(d.memory.heard)
    if entries:
        d.set_workers(entries)


def fold_settled(d: Draft) -> None:
    """An agent's queued report can land after the operator pulled that load and completed its
    wave (or the whole rollout): folded away as the wave's own successes were, so no settled pod
    shows as still loading. Failures stay listed, and so do other versions' entries. A departed
    member's (replaced in its wave, or gone from a completed one) goes too, but for a failure it
    reported before it left: what an agent says as it shuts down (Cancelled) is no failure."""
    target = d.status.target_version
    settled = {p for w in d.status.waves if w.phase is WavePhase.COMPLETED for p in w.pods}
    departed = {p for w in d.status.waves for p in w.replaced} | (settled - set(d.rollout.units))
    # A settled replica's followers staged for it: their entries go with the leader's.
    settled |= {f for p in settled for f in d.rollout.replicas.followers.get(p, ())}
    late = [
        name
        for name, entry in d.status.workers.items()
        if entry.version == target
        and (
            (name in settled and entry.phase in (WorkerPhase.LOADING, WorkerPhase.UPDATED))
            or (name in departed and not (entry.phase is WorkerPhase.FAILED and settles(entry, target)))
        )
    ]
    d.set_workers(dict.fromkeys(late))


def outcomes(d: Draft, target: Target, called: list[str]) -> dict[str, Outcome]:
    """Each member's outcome as the draft status says now; failures are announced once."""
    workers = d.status.workers
    called_set = set(called)
    result = {
        p: reported_outcome(
            workers.get(p), target=target.version, present=_present(d, p), called=p in called_set
        )
        for p in target.members
    }
    learn_digest(
        d, target.version, [workers[p].manifest_digest for p, o in result.items() if o is Outcome.UPDATED]
    )
    for name, outcome in result.items():
        if outcome is not Outcome.FAILED:
            continue
        entry = workers[name]
        key = f"{name}/{entry.version}"
        if key in d.memory.announced or key in d.plan.announced:
            continue
        d.plan.announced.append(key)
        d.metric(Measure.WORKERS, 1, WorkerResult.FAILED)
        d.event(
            EventType.WARNING,
            EventReason.WORKER_FAILED,
            f"{name}: {entry.reason}: {entry.message or ''}"[:1000],
        )
    return result


def _present(d: Draft, pod: str) -> bool:
    """A unit (a whole replica's leader, or a pod) or a whole replica's follower is present."""
    return pod in d.rollout.units or pod in d.rollout.replicas.follower_names


def learn_digest(d: Draft, version: str, reported: list[str | None]) -> None:
    """Record the manifest digest the members that loaded ``version`` report, before their
    entries are folded away: a later rollback to it is pinned to that digest."""
    status = d.status
    digests = learned_digests(
        status.manifest_digests,
        version=version,
        reported=reported,
        spec_version=d.spec.version,
        spec_pin=d.spec.source.manifest_digest,
        keep=(d.spec.version, status.target_version, status.stable_version, status.previous_version),
    )
    if digests != status.manifest_digests:
        d.set(manifest_digests=digests)


def drive(d: Draft, target: Target) -> tuple[list[str], dict[str, Outcome] | None]:
    """One step toward ``target``. Returns the members called so far (for the caller to record
    before the calls go out) and every member's outcome once all are decided, else None."""
    pulling = len(target.members) > d.tuning.push_max_wave
    called = list(target.called)
    current = outcomes(d, target, called)
    uncalled = [p for p, o in current.items() if o is Outcome.UNCALLED]
    calling: list[str] = []
    if uncalled and target.may_call:
        # Every member in one step, recorded as called in one write: a pulled wave's outcomes
        # then arrive in few rounds, and the wave completes without its successes ever being
        # written one by one. (After a crash mid-calls, members recorded but never called are
        # found by the pull fallback and called then.)
        calling, uncalled = uncalled, []
        called += calling
        # The first look (a pushed outcome wakes the loop sooner).
        d.wake(d.tuning.pull_first_s if pulling else d.tuning.pull_after_s)
    waiting = [p for p, o in current.items() if o is Outcome.WAITING and p not in calling]
    recall = _check_waiting(d, target, waiting, pulling)
    _plan_calls(d, target, [*calling, *recall], report=not pulling)
    if uncalled:
        return called, None
    current = outcomes(d, target, called)
    if any(o is Outcome.WAITING or o is Outcome.UNCALLED for o in current.values()):
        return called, None
    return called, current


def _check_waiting(d: Draft, target: Target, waiting: list[str], pulling: bool) -> list[str]:
    """Time out or pull the waiting members; returns those to call again."""
    now = d.now.mono
    tuning, memory = d.tuning, d.memory
    timeout = d.spec.timeouts.worker_seconds
    timed_out: dict[str, WorkerStatus | None] = {}
    recall: list[str] = []
    candidates: list[tuple[str, float, float]] = []  # (pod, when its pull is due, interval)
    for name in waiting:
        called_at = memory.call_times.get(name)
        if called_at is None:  # called before a restart: its clock starts now
            d.plan.first_seen.append(name)
            called_at = now
        if now - called_at > timeout:
            # Given up: the agent, if it still loads, is told to stop now, old weights serving.
            pod = d.rollout.pods[name]
            d.plan.cancels.append(Cancel(name, pod.ip, d.spec.agent.port, target.version))
            timed_out[name] = failure_entry(
                target.version,
                target.wave,
                WorkerReason.WORKER_TIMEOUT,
                timeout_message(timeout, memory.troubles.get(name)),
                d.now.stamp,
            )
            continue
        d.wake(called_at + timeout - now)
        first = tuning.pull_first_s if pulling else tuning.pull_after_s
        busy = memory.busy_until.get(name)
        if name in memory.lost or (busy is not None and now >= busy):
            recall.append(name)
            d.wake(first)  # the pull fallback, should its outcome never be pushed
            continue
        if busy is not None:
            d.wake(busy - now)
            continue
        if pulling:
            # Quick loads are seen quickly; long ones (in big waves) are not polled more than
            # the operator and the agents can take.
            every = max(
                tuning.pull_first_s,
                min(tuning.pull_every_s, (now - called_at) / 2),
                len(waiting) / tuning.pull_rate,
            )
        else:
            every = tuning.pull_every_s
        last = memory.last_pull.get(name)
        rang = _doorbell(d, name) if pulling else None
        if rang is False:
            # Its agent says it is loading: the condition's next write (the load ended) rings;
            # only a lost write leaves it to the slow schedule.
            contact = last if last is not None else called_at
            if now < contact + tuning.pull_loading_s:
                d.plan.doorbell = True
                d.wake(min(every, contact + tuning.pull_loading_s - now))  # should it ring unheard
                continue
            due_at = now
        elif rang:
            due_at = now
        elif last is not None:
            due_at = last + every
        elif name in d.plan.first_seen:
            due_at = now  # called before a restart: whether it saw the call is unknown
        else:
            due_at = called_at + first  # once the agent had time to push
        candidates.append((name, due_at, every))
    if timed_out:
        d.set_workers(timed_out)
    # A pulled wave is pulled in rounds: once one member is due, so is every member due within
    # its next interval (each round's outcomes cost one status write, so fewer, fuller rounds).
    round_due = pulling and any(due_at <= now for _, due_at, _ in candidates)
    for name, due_at, every in candidates:
        if due_at <= now or (round_due and due_at <= now + every):
            pod = d.rollout.pods[name]
            d.plan.pulls.append(Pull(name, pod.ip, d.spec.agent.port, target.version, target.wave))
            d.wake(every)  # the next pull, should this one find the load still going
        else:
            d.wake(due_at - now)
    return recall


def _doorbell(d: Draft, name: str) -> bool | None:
    """What a pulled member's WeightsReady condition says once its agent was asked: False, it
    loads (the pull waits for the next write); True, it changed since and no longer says Loading
    (worth a pull now); None, unchanged, absent or never asked (the pull schedule decides)."""
    if name not in d.memory.asked:
        return None
    signal = d.rollout.pods[name].weights
    if signal is None:
        return None
    if signal.loading:
        return False
    return True if signal != d.memory.asked[name] else None


def cancel_loads(d: Draft, version: str | None) -> None:
    """Plan a cancel for every called pod still loading ``version`` (the rollout that asked for
    it is being given up): each agent stops at once, old weights serving, free for what the
    operator asks next, instead of holding its engine paused until the load's own deadline."""
    if not version:
        return
    # A completed wave's successes are folded away: its members are done, not waiting.
    called = {p for w in d.status.waves if w.phase is not WavePhase.COMPLETED for p in w.called}
    for name in sorted(called):
        pod = d.rollout.pods.get(name)
        if pod is None:
            continue
        entry = d.status.workers.get(name)
        if reported_outcome(entry, target=version, present=True, called=True) is Outcome.WAITING:
            d.plan.cancels.append(Cancel(name, pod.ip, d.spec.agent.port, version))


def timeout_message(timeout: int, trouble: Trouble | None) -> str:
    """Why a worker timed out: what last held it up, if anything did."""
    return f"no outcome within {timeout}s" + (f" (last: {trouble.line()})" if trouble is not None else "")


def request(
    d: Draft, version: str, wave: int, *, report: bool, rollback: bool = False, stage: bool = False
) -> UpdateWeightsRequest:
    spec, meta = d.spec, d.rollout.meta
    pin = pin_for(
        version,
        spec_version=spec.version,
        spec_pin=spec.source.manifest_digest,
        known=d.status.manifest_digests,
    )
    return UpdateWeightsRequest(
        version=version,
        verify_checksum=spec.verify_checksum,
        source=SourceRef(uri=spec.source.uri, manifestDigest=pin),
        rollout=RolloutRef(namespace=meta.namespace, name=meta.name, uid=meta.uid, wave=wave, report=report),
        # A rollback returns to weights that served already: no gate may refuse it.
        checks=LoadChecks(finite=True) if spec.checks.finite and not rollback else None,
        health_check=health_check_request(spec.strategy.health_check) if not rollback else None,
        # Past the worker timeout the operator has given the worker up: the agent stops moving
        # bytes by then too, so it is free (old weights serving) for what comes next.
        deadline_seconds=spec.timeouts.worker_seconds,
        retain=_retained(d, version) if spec.replica_groups is not None else None,
        stage=True if stage else None,
    )


def _retained(d: Draft, version: str) -> list[str]:
    """What a replica's followers keep staged beside ``version``: every version its leader may
    go back to while the replica switches (the one it serves, the one a rollback leaves)."""
    status = d.status
    known = (status.stable_version, status.previous_version, status.target_version)
    return sorted({v for v in known if v and v != version})


def health_check_request(check: HealthCheck) -> HealthCheckRequest | None:
    if not check.enabled:
        return None
    return HealthCheckRequest(
        prompt=check.prompt, max_tokens=check.max_tokens, timeout_seconds=check.timeout_seconds
    )


def relay_peers(d: Draft, version: str, among: Iterable[str] | None = None) -> list[str]:
    """Pods that finished an earlier wave on ``version`` (``among``: those of them that may feed
    the members at hand): later waves pull bytes from them (the manifest still comes from the
    source, so a bad peer cannot inject weights)."""
    if not d.spec.strategy.peer_relay or version != d.spec.version:
        return []
    workers = d.status.workers
    done = {p for w in d.status.waves if w.phase is WavePhase.COMPLETED for p in w.pods}
    return sorted(
        p
        for p in (done if among is None else among)
        if p in d.rollout.pods and (p not in workers or workers[p].phase is not WorkerPhase.FAILED)
    )


def _plan_calls(d: Draft, target: Target, pods: list[str], *, report: bool) -> None:
    if not pods:
        return
    body = request(
        d, target.version, target.wave, report=report, rollback=target.kind == "rollback", stage=target.stage
    )
    port = d.spec.agent.port
    parents: dict[str, str | None] = {}
    if body.source is not None and d.spec.strategy.peer_relay and target.version == d.spec.version:
        # Chains over the whole wave, not just this step's calls, so a member called again
        # keeps its parent.
        present = [p for p in target.members if p in d.rollout.pods]
        roots = relay_peers(d, target.version, target.peers)
        fanout = fanout_for(len(present), len(roots), d.spec.strategy.relay_fanout)
        parents = relay_parents(present, roots, fanout)
    feeding = feeds(parents)
    for name in pods:
        pod = d.rollout.pods[name]
        parent = parents.get(name)
        call_body = body
        if body.source is not None and (parent is not None or name in feeding):
            relayed = body.source.model_dump(by_alias=True, exclude_unset=True)
            if parent is not None:
                relayed["peer"] = agent_url(d.rollout.pods[parent].ip, port, tls=d.tuning.agent_tls)
            if name in feeding:
                relayed["relayWhileLoading"] = True
            call_body = body.model_copy(update={"source": SourceRef.model_validate(relayed)})
        d.plan.calls.append(Call(name, pod.ip, port, call_body))
