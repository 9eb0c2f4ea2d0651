"""One step toward replicas that span pods serving a version (`spec.replicaGroups`): a replica
switches as one. Its followers' agents stage the version first (each pulls and verifies it where
its node's engine rank reads it; nothing serves it yet); only once every follower holds it is
the leader's agent called, which updates the engine once for the whole replica, checks it and
resumes it. A follower that cannot stage fails its replica with the leader never called, so
nothing was applied. Followers stage with `stage` set, which keeps their pods NotReady until the
replica's leader is decided and they are told so (a confirm). Pure: works on a Draft, through
`drive` for each side."""

from ckpt_api.status import WorkerStatus
from ckpt_api.vocabulary import WavePhase, WorkerPhase, WorkerReason
from ckpt_rollout.domain.drive import Target, drive, failure_entry, outcomes, request
from ckpt_rollout.domain.outcomes import Outcome
from ckpt_rollout.domain.plan import Call, Draft


def drive_units(d: Draft, target: Target) -> tuple[list[str], dict[str, Outcome] | None]:
    """`drive` for a rollout's units: ``target.members`` are pods, or replicas' leaders when the
    rollout has replica groups. Returns who was called so far (followers included) and each
    unit's outcome once every one is decided, else None."""
    if d.spec.replica_groups is None:
        return drive(d, target)
    followers = d.rollout.replicas.followers
    called = list(target.called)
    leads = outcomes(d, target, called)
    # Replicas whose leader was not called yet stage first (a leader called already needs its
    # followers no more: they staged before it was).
    staging = [lead for lead, o in leads.items() if o is Outcome.UNCALLED]
    stagers = [f for lead in staging for f in followers.get(lead, ())]
    staged: dict[str, Outcome] = {}
    for position, group in _by_position(d, stagers).items():
        peers = _position_peers(d, position)
        stage = _part(target, group, called, stage=True, peers=peers)
        stage_called, _ = drive(d, stage)
        called = _merged(called, stage_called)
        staged.update(outcomes(d, stage, stage_called))
    ready: list[str] = []
    failed: dict[str, WorkerStatus | None] = {}
    for lead in staging:
        states = {f: staged[f] for f in followers.get(lead, ())}
        broken = [f for f, o in states.items() if o is Outcome.FAILED]
        if broken:
            failed[lead] = _member_failure(d, target, broken[0])
        elif all(o is Outcome.UPDATED for o in states.values()):
            ready.append(lead)
    if failed:
        d.set_workers(failed)
    called_set = set(called)
    leaders = [lead for lead in target.members if lead in called_set or lead in ready]
    if leaders:
        leading = _part(target, leaders, called)
        lead_called, _ = drive(d, leading)
        called = _merged(called, lead_called)
    decided = outcomes(d, target, called)
    confirming = _confirm_followers(d, target, decided)
    if confirming or any(o in (Outcome.WAITING, Outcome.UNCALLED) for o in decided.values()):
        return called, None
    return called, decided


def _confirm_followers(d: Draft, target: Target, leads: dict[str, Outcome]) -> bool:
    """Once a replica's leader is decided (switched, failed and put back, or never called for a
    member's failure), its followers still staged for it are told the replica is settled: the
    same call without `stage`, a noop that makes their pods Ready again. Returns whether any is
    sent now: the wave waits for that step, so an operator restarted before it sends them again
    (noops) instead of leaving pods NotReady."""
    followers, workers = d.rollout.replicas.followers, d.status.workers
    staged = (target.version, WorkerPhase.UPDATED, WorkerReason.STAGED)
    pending = [
        f
        for lead, o in leads.items()
        if o is Outcome.UPDATED or o is Outcome.FAILED
        for f in followers.get(lead, ())
        if (entry := workers.get(f)) is not None
        and (entry.version, entry.phase, entry.reason) == staged
        and f"{f}/{target.version}" not in d.memory.confirmed
    ]
    if not pending:
        return False
    body = request(d, target.version, target.wave, report=False, rollback=target.kind == "rollback")
    for name in pending:
        pod = d.rollout.pods[name]
        d.plan.confirms.append(Call(name, pod.ip, d.spec.agent.port, body))
    d.wake(0.0)
    return True


def _by_position(d: Draft, followers: list[str]) -> dict[str, list[str]]:
    """Followers by their place in their replica (the leader label's value, e.g. a
    LeaderWorkerSet's worker-index): pods at one place run the same ranks, so only they may feed
    each other a version saved per rank (each holds its ranks' share of it)."""
    groups = d.spec.replica_groups
    assert groups is not None
    by: dict[str, list[str]] = {}
    for name in followers:
        by.setdefault(d.rollout.pods[name].labels.get(groups.leader_label, ""), []).append(name)
    return by


def _position_peers(d: Draft, position: str) -> tuple[str, ...]:
    """The followers at ``position`` of the replicas that completed a wave: who may feed it."""
    groups = d.spec.replica_groups
    assert groups is not None
    done = [p for w in d.status.waves if w.phase is WavePhase.COMPLETED for p in w.pods]
    followers = d.rollout.replicas.followers
    return tuple(
        f
        for lead in done
        for f in followers.get(lead, ())
        if d.rollout.pods[f].labels.get(groups.leader_label, "") == position
    )


def _part(
    target: Target,
    members: list[str],
    called: list[str],
    *,
    stage: bool = False,
    peers: tuple[str, ...] | None = None,
) -> Target:
    chosen = set(members)
    return Target(
        version=target.version,
        members=members,
        called=[p for p in called if p in chosen],
        wave=target.wave,
        kind=target.kind,
        may_call=target.may_call,
        stage=stage,
        peers=peers,
    )


def _merged(called: list[str], more: list[str]) -> list[str]:
    seen = set(called)
    return [*called, *(p for p in more if p not in seen)]


def _member_failure(d: Draft, target: Target, follower: str) -> WorkerStatus:
    entry = d.status.workers[follower]
    why = f"{entry.reason}: {entry.message}" if entry.message else str(entry.reason)
    return failure_entry(
        target.version,
        target.wave,
        WorkerReason.MEMBER_FAILED,
        f"member {follower} could not stage {target.version} ({why}); the replica was left as it was",
        d.now.stamp,
    )
