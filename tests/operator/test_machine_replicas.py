"""decide(), replicas that span pods (spec.replicaGroups): waves count replicas, followers stage
before their leader is called, a follower that cannot stage fails its replica with the leader
never called, a replica missing a member is not switched, the rollback goes through leaders.
One row per situation, with the plan it must produce."""

from __future__ import annotations

from typing import Any

from machine_kit import (
    EARLIER,
    NOW,
    TUNING,
    Case,
    called_now,
    done,
    entry,
    progressing,
    table_tests,
    wave,
    wave_rows,
)

from ckpt_api.spec import LWS_GROUP_KEY_LABEL, LWS_WORKER_INDEX_LABEL, CheckpointRolloutSpec
from ckpt_api.status import CheckpointRolloutStatus
from ckpt_api.vocabulary import EventReason, Phase, WaveKind, WavePhase, WorkerPhase
from ckpt_e2e.testdata import valid_spec, valid_spec_defaults
from ckpt_rollout.domain.machine import State, decide
from ckpt_rollout.domain.mergepatch import apply_merge_patch
from ckpt_rollout.domain.plan import Meta, Plan, Rollout
from ckpt_rollout.domain.planning import rollout_order
from ckpt_rollout.domain.world import Memory, Pod

# Three replicas of two pods each, as a LeaderWorkerSet labels them: rN-0 leads rN.
REPLICAS = {f"r{g}-0": (f"r{g}-1",) for g in range(3)}
LEADERS = rollout_order(REPLICAS, "u-1/v2")
CANARY, REST = LEADERS[0], LEADERS[1:]
FOLLOWER = REPLICAS[CANARY][0]
GROUPED = {"replicaGroups": {}, "strategy": {"waves": [1, "100%"]}}


def grouped(
    status: dict[str, Any] | None = None, *, missing: tuple[str, ...] = (), spec: dict[str, Any] | None = None
) -> Rollout:
    wire = apply_merge_patch(valid_spec_defaults(), {**valid_spec(), "version": "v2"})
    wire = apply_merge_patch(apply_merge_patch(wire, GROUPED), spec or {})
    pods = {}
    for number, (leader, followers) in enumerate(sorted(REPLICAS.items())):
        for index, name in enumerate((leader, *followers)):
            if name in missing:
                continue
            labels = {
                "app": "rollout-worker",
                LWS_GROUP_KEY_LABEL: f"key{number}",
                LWS_WORKER_INDEX_LABEL: str(index),
            }
            pods[name] = Pod(name, f"10.0.{number}.{index + 1}", labels, group_size=2)
    return Rollout(
        meta=Meta("rl", "fleet", "u-1", 3, "t1", {}),
        spec=CheckpointRolloutSpec.model_validate(wire),
        status=CheckpointRolloutStatus.model_validate(status or {}),
        pods=pods,
    )


def workers(plan: Plan) -> dict[str, tuple[str, str | None]]:
    return {n: (str(e.phase), e.reason) for n, e in plan.status.workers.items()}


def counters(plan: Plan) -> tuple[int | None, int | None, str | None]:
    return plan.status.replicas, plan.status.updated_replicas, plan.status.message


def rollback_of(plan: Plan) -> tuple[list[str], list[str]] | None:
    rollback = plan.status.rollback
    return None if rollback is None else (rollback.pods, rollback.called)


def followers_of(leaders: list[str]) -> list[str]:
    return [f for leader in leaders for f in REPLICAS[leader]]


def staging(plan: Plan) -> dict[str, bool | None]:
    """Each call's `stage`: True for a follower staging for its leader, None for any other."""
    return {c.pod: c.request.stage for c in plan.calls}


def fed_by(plan: Plan) -> dict[str, str | None]:
    """Each call's relay parent, as the pod it names (None: the source)."""
    by_ip = {p.ip: name for name, p in grouped().pods.items()}
    peers = {c.pod: c.request.source.peer if c.request.source else None for c in plan.calls}
    return {
        pod: None if peer is None else by_ip[peer.split("//")[1].rsplit(":", 1)[0]]
        for pod, peer in peers.items()
    }


def confirms(plan: Plan) -> list[tuple[str, str, bool | None]]:
    return [(c.pod, c.request.version, c.request.stage) for c in plan.confirms]


# The canary replica with its leader decided and its follower still staged (NotReady) for it.
LEADER_DECIDED = {
    "switched": entry("v2", "Updated"),
    "failed": entry("v2", "Failed", "HealthCheckFailed"),
}


CASES = [
    Case(
        "the-canary-wave-is-one-replica-and-its-follower-stages-first",
        grouped(progressing()),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[FOLLOWER],
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda plan: (wave_rows(plan), plan.status.replicas, plan.status.message, staging(plan)),
        observed=(
            [(WaveKind.SPEC, WavePhase.RUNNING, [CANARY], [FOLLOWER])],
            3,
            "wave 1/2: 1 replica",
            {FOLLOWER: True},
        ),
    ),
    Case(
        "a-follower-still-staging-holds-its-leader-back",
        grouped(
            progressing(
                wave(0, [CANARY], called=[FOLLOWER]), workers={FOLLOWER: entry("v2", "Loading", "Loading")}
            )
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_after_s,
        memory=called_now(FOLLOWER),
        observe=lambda plan: wave_rows(plan)[0][3],
        observed=[FOLLOWER],
    ),
    Case(
        "every-follower-staged-so-the-leader-is-called-once",
        grouped(
            progressing(wave(0, [CANARY], called=[FOLLOWER]), workers={FOLLOWER: entry("v2", "Updated")})
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[CANARY],
        wake=TUNING.pull_after_s,
        observe=lambda plan: (wave_rows(plan)[0][3], staging(plan), confirms(plan)),
        observed=([FOLLOWER, CANARY], {CANARY: None}, []),
    ),
    *(
        Case(
            f"the-leader-{how}-so-its-staged-follower-is-confirmed-before-the-wave-moves-on",
            grouped(
                progressing(
                    wave(0, [CANARY], called=[FOLLOWER, CANARY]),
                    workers={FOLLOWER: entry("v2", "Updated", "Staged"), CANARY: leader},
                )
            ),
            State.ADVANCE,
            Phase.PROGRESSING,
            events=[EventReason.WORKER_FAILED] if how == "failed" else [],
            wake=0.0,
            observe=lambda plan: (confirms(plan), wave_rows(plan)[0][1]),
            observed=([(FOLLOWER, "v2", None)], WavePhase.RUNNING),
        )
        for how, leader in LEADER_DECIDED.items()
    ),
    Case(
        "a-follower-confirmed-is-not-confirmed-again-and-the-wave-completes",
        grouped(
            progressing(
                wave(0, [CANARY], called=[FOLLOWER, CANARY]),
                workers={FOLLOWER: entry("v2", "Updated", "Staged"), CANARY: entry("v2", "Updated")},
            )
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=followers_of(REST),
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        memory=Memory(confirmed={f"{FOLLOWER}/v2"}),
        observe=lambda plan: (confirms(plan), wave_rows(plan)[0][1], set(staging(plan).values())),
        observed=([], WavePhase.COMPLETED, {True}),
    ),
    Case(
        "a-called-leader-is-not-called-again-while-it-loads",
        grouped(
            progressing(
                wave(0, [CANARY], called=[FOLLOWER, CANARY]),
                workers={FOLLOWER: entry("v2", "Updated"), CANARY: entry("v2", "Loading", "Loading")},
            )
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        wake=TUNING.pull_after_s,
        memory=called_now(FOLLOWER, CANARY),
        observe=workers,
        observed={FOLLOWER: ("Updated", "Loaded"), CANARY: ("Loading", "Loading")},
    ),
    Case(
        "the-leader-loaded-so-the-replica-is-done-and-the-rest-stage",
        grouped(
            progressing(
                wave(0, [CANARY], called=[FOLLOWER, CANARY]),
                workers={FOLLOWER: entry("v2", "Updated"), CANARY: entry("v2", "Updated")},
            )
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=followers_of(REST),
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        # The replica's entries, follower's too, fold into the wave's count. The followers are
        # fed from the canary's follower (its node's ranks hold the same share), not its leader.
        observe=lambda plan: (
            workers(plan),
            wave_rows(plan)[1],
            plan.status.updated_replicas,
            set(fed_by(plan).values()) <= {None, FOLLOWER, *followers_of(REST)},
            FOLLOWER in fed_by(plan).values(),
        ),
        observed=({}, (WaveKind.SPEC, WavePhase.RUNNING, REST, followers_of(REST)), 1, True, True),
    ),
    Case(
        "a-follower-that-cannot-stage-fails-its-replica-and-the-leader-is-never-called",
        grouped(
            progressing(
                wave(0, [CANARY], called=[FOLLOWER]),
                workers={FOLLOWER: entry("v2", "Failed", "ChecksumMismatch")},
            ),
        ),
        State.ADVANCE,
        Phase.ROLLED_BACK,
        # Over the budget of 0 replicas; no engine was touched, so nothing is rolled back.
        events=[
            EventReason.WORKER_FAILED,
            EventReason.WORKER_FAILED,
            EventReason.ROLLBACK_STARTED,
            EventReason.ROLLED_BACK,
        ],
        observe=lambda plan: (
            workers(plan)[CANARY],
            plan.status.workers[CANARY].message,
            plan.status.failed_replicas,
            rollback_of(plan),
        ),
        observed=(
            ("Failed", "MemberFailed"),
            f"member {FOLLOWER} could not stage v2 (ChecksumMismatch: ChecksumMismatch v2); "
            "the replica was left as it was",
            1,
            ([], []),
        ),
    ),
    Case(
        "within-the-budget-the-next-replica-tries-what-a-member-could-not-stage",
        grouped(
            progressing(
                wave(0, [CANARY], called=[FOLLOWER]),
                workers={FOLLOWER: entry("v2", "Failed", "ChecksumMismatch")},
            ),
            spec={"failurePolicy": {"maxFailures": 1}},
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=[REPLICAS[REST[0]][0]],
        events=[EventReason.WORKER_FAILED, EventReason.WORKER_FAILED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda plan: (wave_rows(plan)[0][2:], plan.status.message),
        observed=(
            ([CANARY, REST[0]], [FOLLOWER, REPLICAS[REST[0]][0]]),
            f"wave 1/2: no replica has loaded v2 yet ({CANARY} failed); {REST[0]} tries it",
        ),
    ),
    Case(
        "a-replica-missing-a-member-is-not-counted-nor-called",
        grouped(progressing(done(0, [CANARY])), missing=(REPLICAS[REST[0]][0],)),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=followers_of(REST[1:]),
        events=[EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda plan: (wave_rows(plan)[1][2], plan.status.replicas),
        observed=(REST[1:], 2),
    ),
    Case(
        "a-member-gone-mid-gang-counts-its-replica-gone-not-failed",
        grouped(
            progressing(
                done(0, [CANARY]),
                wave(1, REST, called=[*followers_of(REST), *REST]),
                workers={
                    **{f: entry("v2", "Updated") for f in followers_of(REST)},
                    REST[0]: entry("v2", "Updated"),
                    REST[1]: entry("v2", "Loading", "Loading"),
                },
            ),
            missing=(REPLICAS[REST[1]][0],),
        ),
        State.ADVANCE,
        Phase.SUCCEEDED,
        events=[EventReason.WAVE_COMPLETED, EventReason.ROLLOUT_COMPLETED],
        observe=lambda plan: (wave_rows(plan)[1][1], plan.status.waves[1].gone, plan.status.message),
        observed=(WavePhase.COMPLETED, 1, "v2 is live on 2 replicas"),
    ),
    Case(
        "the-rollback-stages-followers-before-their-leaders",
        grouped(
            {
                **progressing(
                    wave(0, [CANARY], called=[FOLLOWER, CANARY], phase="Failed", completedAt=EARLIER)
                ),
                "phase": "RollingBack",
                "rollback": {
                    "version": "v1",
                    "reason": "HealthCheckFailed",
                    "pods": [CANARY],
                    "startedAt": EARLIER,
                },
                "workers": {CANARY: entry("v2", "Failed", "HealthCheckFailed")},
            }
        ),
        State.ROLLING_BACK,
        Phase.ROLLING_BACK,
        calls=[FOLLOWER],
        wake=TUNING.pull_after_s,
        observe=rollback_of,
        observed=([CANARY], [FOLLOWER]),
    ),
]

test_decide, test_every_step_comes_to_rest = table_tests(CASES)


def test_a_failed_replica_rolls_back_through_its_leader_only() -> None:
    """Over the budget with the leader's engine touched: the rollback names the leader, not the
    followers that only staged."""
    plan = decide(
        grouped(
            progressing(
                wave(0, [CANARY], called=[FOLLOWER, CANARY]),
                workers={FOLLOWER: entry("v2", "Updated"), CANARY: entry("v2", "Failed", "WorkerTimeout")},
            )
        ),
        Memory(),
        TUNING,
        NOW,
    )
    assert plan.status.phase is Phase.ROLLING_BACK
    assert rollback_of(plan) == ([CANARY], [FOLLOWER])
    assert plan.status.workers[FOLLOWER].phase is WorkerPhase.UPDATED
