"""Rollbacks pinned to the digest of the version they return to: what the operator learns of
versions' manifest digests (status.manifestDigests), which pin each call carries, and what a
rollback says when it cannot be pinned. Pure tables, then decide() rows."""

from __future__ import annotations

import pytest
from machine_kit import (
    CANARY,
    REST,
    TUNING,
    Case,
    called_long_ago,
    entry,
    progressing,
    rollout,
    table_tests,
    wave,
)
from test_executor import Agents, Api, _rollout

from ckpt_api.agent_api import AgentStatus
from ckpt_api.vocabulary import AgentState, EventReason, Phase
from ckpt_rollout.controller.executor import Reconciler
from ckpt_rollout.domain.machine import State
from ckpt_rollout.domain.pinning import learned_digests, pin_for, unpinned_note
from ckpt_rollout.domain.plan import Plan
from ckpt_rollout.domain.world import Memory, Tuning
from ckpt_rollout.io.agent_client import CallResult

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
D3 = "sha256:" + "3" * 64


@pytest.mark.parametrize(
    ("version", "spec_pin", "known", "pin"),
    [
        ("v2", None, {}, None),
        ("v2", D2, {}, D2),
        # An unpinned spec version stays unpinned, whatever the agents reported for it.
        ("v2", None, {"v2": D3}, None),
        ("v2", D2, {"v2": D3}, D2),
        # A rollback's version: the digest recorded for it, or none.
        ("v1", D2, {"v1": D1}, D1),
        ("v1", D2, {"v0": D1}, None),
    ],
)
def test_pin_for(version: str, spec_pin: str | None, known: dict[str, str], pin: str | None) -> None:
    assert pin_for(version, spec_version="v2", spec_pin=spec_pin, known=known) == pin


KEEP = ("v2", "v2", "v1", "v1")  # spec, target, stable, previous


@pytest.mark.parametrize(
    ("known", "version", "reported", "spec_pin", "keep", "learned"),
    [
        ({}, "v2", [D2], None, KEEP, {"v2": D2}),
        ({}, "v2", [D2, D2, None], None, KEEP, {"v2": D2}),
        # No report yet, or none with a digest (an agent from before manifestDigest).
        ({"v1": D1}, "v2", [], None, KEEP, {"v1": D1}),
        ({"v1": D1}, "v2", [None], None, KEEP, {"v1": D1}),
        # Reports that disagree (republished mid-rollout) change nothing.
        ({"v2": D2}, "v2", [D2, D3], None, KEEP, {"v2": D2}),
        ({}, "v2", [D2, D3], None, KEEP, {}),
        # A later step's single report replaces what an earlier step recorded.
        ({"v2": D2}, "v2", [D3], None, KEEP, {"v2": D3}),
        # A pinned spec version's digest is its pin, not what an entry claims.
        ({}, "v2", [D3], D2, KEEP, {"v2": D2}),
        ({}, "v2", [], D2, KEEP, {"v2": D2}),
        # A malformed digest is no digest.
        ({}, "v2", ["sha256:zz", "md5:" + "0" * 32], None, KEEP, {}),
        # Versions no rollback can return to are dropped; a rollback target's digest is learned.
        ({"v0": D3, "v1": D1}, "v1", [D1], None, KEEP, {"v1": D1}),
        ({}, "v9", [D3], None, KEEP, {}),
        ({"v1": D1}, "v2", [D2], None, ("v2", "v2", None, None), {"v2": D2}),
    ],
)
def test_learned_digests(
    known: dict[str, str],
    version: str,
    reported: list[str | None],
    spec_pin: str | None,
    keep: tuple[str | None, ...],
    learned: dict[str, str],
) -> None:
    result = learned_digests(
        known, version=version, reported=reported, spec_version="v2", spec_pin=spec_pin, keep=keep
    )
    assert result == learned


def test_unpinned_note_names_the_version_only_when_it_has_no_digest() -> None:
    assert unpinned_note("v1", {"v1": D1}) == ""
    assert unpinned_note("v1", {"v2": D2}) == ", unpinned: no manifest digest of v1 is recorded"


def _rollback_request(p: Plan) -> list[tuple[str, str | None]]:
    """(version, pin) of the plan's calls."""
    return sorted(
        {(c.request.version, c.request.source and c.request.source.manifest_digest) for c in p.calls}
    )


def _timed_out_canary(**status: object) -> dict[str, object]:
    """The canary never answered: it may hold v2, so it is rolled back."""
    return progressing(wave(0, [CANARY]), stableVersion="v1", **status)


CASES = [
    Case(
        "a-rollback-is-pinned-to-the-digest-recorded-for-its-version",
        rollout(_timed_out_canary(manifestDigests={"v1": D1})),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        cancels=[(CANARY, "v2")],  # timed out: its load is stopped
        calls=[CANARY],
        events=[EventReason.WORKER_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=called_long_ago(CANARY),
        observe=lambda p: (_rollback_request(p), "unpinned" in (p.status.message or "")),
        observed=([("v1", D1)], False),
    ),
    Case(
        "a-rollback-with-no-recorded-digest-is-unpinned-and-says-so",
        rollout(_timed_out_canary()),
        State.ADVANCE,
        Phase.ROLLING_BACK,
        cancels=[(CANARY, "v2")],  # timed out: its load is stopped
        calls=[CANARY],
        events=[EventReason.WORKER_FAILED, EventReason.ROLLBACK_STARTED],
        wake=TUNING.pull_after_s,
        memory=called_long_ago(CANARY),
        observe=lambda p: (
            _rollback_request(p),
            (p.status.message or "").endswith("back to v1, unpinned: no manifest digest of v1 is recorded"),
            "unpinned" in next(e.message for e in p.events if e.reason == EventReason.ROLLBACK_STARTED),
        ),
        observed=([("v1", None)], True, True),
    ),
    Case(
        "an-updated-canary-s-digest-is-kept-once-its-entry-is-folded-away",
        rollout(
            progressing(
                wave(0, [CANARY]),
                stableVersion="v1",
                manifestDigests={"v1": D1, "v0": D3},
                workers={CANARY: {**entry("v2", "Updated"), "manifestDigest": D2}},
            )
        ),
        State.ADVANCE,
        Phase.PROGRESSING,
        calls=REST,
        events=[EventReason.WAVE_COMPLETED, EventReason.WAVE_STARTED],
        wake=TUNING.pull_after_s,
        observe=lambda p: (CANARY in p.status.workers, p.status.manifest_digests),
        observed=(False, {"v1": D1, "v2": D2}),
    ),
]

test_decide, test_every_step_comes_to_rest = table_tests(CASES)


class _AgentsOnV2(Agents):
    """Agents that, asked for their status, have loaded v2 from the manifest with digest D2."""

    async def status(self, ip: str, port: int, *, namespace: str, pod: str = "") -> CallResult:
        status = AgentStatus(version="v2", state=AgentState.IDLE, manifest_digest=D2)
        return CallResult(200, status.to_wire(), agent_status=status)


async def test_a_pulled_wave_records_the_digest_its_agents_report() -> None:
    """A wave too big for pushed reports: the digest comes from each agent's /v1/status, and
    outlives the entries (folded away once the wave completes) as the stable version's."""
    obj, fleet = _rollout(TUNING.push_max_wave + 2, 16)
    api = Api(obj)
    reconciler = Reconciler(api, _AgentsOnV2(api), Tuning(pull_first_s=0.0))  # type: ignore[arg-type]
    memory = Memory()
    for _ in range(4):
        await reconciler.step(api.obj, fleet, memory, lambda *_: None)
        if api.obj["status"].get("phase") == "Succeeded":
            break
    status = api.obj["status"]
    assert (status["phase"], status["stableVersion"]) == ("Succeeded", "v2")
    assert status["manifestDigests"] == {"v2": D2}
    assert not status.get("workers")
