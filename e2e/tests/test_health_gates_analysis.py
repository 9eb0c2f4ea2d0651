"""Analysis between waves against the real Prometheus the project builds, scraping the real
agents of a fleet on the local control plane: a query that fails after the canary rolls the
rollout back before wave 2 is called; passing queries let every wave complete, each wave's
status keeping its measurements; `promote` does not end a running analysis, and
`promote --skip-analysis` does.

The queries read `up` of the agents' scrape job, which Prometheus has for every agent before
the rollout starts (wait_scraped): a value each test knows, so what an analysis measured is
asserted exactly, placeholders ({{namespace}}) included."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ckpt_api.constants import DEFAULT_AGENT_METRICS_PORT
from ckpt_api.vocabulary import SKIP_ANALYSIS_ANNOTATION, AnalysisPhase, EventReason, Phase, WavePhase
from ckpt_e2e.fixtures import ClusterHandle
from ckpt_e2e.procs import wait_for
from ckpt_e2e.prometheus import Job, Prometheus, prometheus_server
from ckpt_e2e.rollout_env import (
    CLI,
    CheckpointSource,
    OperatorProcess,
    Rollouts,
    Worker,
    rollout_spec,
    serving_versions,
    update_calls,
)
from ckpt_e2e.rollout_fixtures import Fleet, OperatorIdentity
from ckpt_rollout.chartgen.chart_values import DEFAULT_AGENT_JOB

pytestmark = pytest.mark.integration

NAME = "fleet"
REPLICAS = 3
ENDED = {Phase.SUCCEEDED, Phase.FAILED, Phase.ROLLED_BACK}
AGENTS_UP = f'sum(up{{job="{DEFAULT_AGENT_JOB}", namespace="{{{{namespace}}}}"}})'


@pytest.fixture
def operator(
    crd_installed: None, namespace: str, operator_identity: OperatorIdentity, tmp_path: Path
) -> Iterator[OperatorProcess]:
    """The usual operator, allowing CRs to name this test's Prometheus (on 127.0.0.1, its port
    picked per test): it dials no prometheusAddress it was not told it may."""
    proc = OperatorProcess(
        operator_identity.kubeconfig,
        namespace,
        operator_identity.minted,
        tmp_path / "operator",
        ["--allowed-prometheus", "http://127.0.0.1"],
    )
    proc.start()
    yield proc
    proc.stop()


@contextmanager
def _scraped_fleet(
    fleet_factory: Callable[..., Fleet], namespace: str, work: Path
) -> Iterator[tuple[Prometheus, Fleet, list[Worker]]]:
    """A fleet on v1 whose agents a real Prometheus has scraped at least once."""
    with prometheus_server(work, [Job(DEFAULT_AGENT_JOB)]) as prom:
        fleet = fleet_factory(REPLICAS)
        workers = fleet.workers(REPLICAS)
        prom.set_targets(
            DEFAULT_AGENT_JOB,
            {
                f"{w.ip}:{DEFAULT_AGENT_METRICS_PORT}": {"namespace": namespace, "pod": w.name}
                for w in workers
            },
        )
        prom.wait_scraped({DEFAULT_AGENT_JOB: REPLICAS}, after=time.time())
        yield prom, fleet, workers


def _analysis(condition: str, **more: Any) -> dict[str, Any]:
    return {
        "intervalSeconds": 1,
        "durationSeconds": 2,
        "queries": [{"name": "agents-up", "query": AGENTS_UP, "successCondition": condition}],
        **more,
    }


def _events(rollouts: Rollouts, reasons: dict[str, int]) -> list[dict[str, Any]]:
    """The rollout's events once each reason in ``reasons`` was posted that many times: kopf
    posts them in the background, a moment after the status changed."""

    def posted() -> list[dict[str, Any]] | None:
        events = rollouts.events(NAME)
        seen = [e["reason"] for e in events]
        return events if all(seen.count(r) >= n for r, n in reasons.items()) else None

    return wait_for(posted, 30, f"events {reasons}", interval=0.2)


def _why(status: dict[str, Any]) -> str:
    return f"{status.get('message')}; waves={status.get('waves')}; workers={status.get('workers')}"


def test_an_analysis_failing_after_the_canary_rolls_back_before_wave_2(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    namespace: str,
    rollouts: Rollouts,
    tmp_path: Path,
) -> None:
    with _scraped_fleet(fleet_factory, namespace, tmp_path / "prometheus") as (prom, fleet, workers):
        analysis = _analysis("result < 1", prometheusAddress=prom.url)
        strategy = {"waves": [1, "100%"], "analysis": analysis}
        rollouts.create(NAME, rollout_spec(checkpoint_source.url, "v2", fleet.labels, strategy=strategy))
        status = rollouts.wait_phase(NAME, ENDED, timeout=180)

    assert status["phase"] == Phase.ROLLED_BACK, _why(status)
    assert status["rollback"]["reason"] == "AnalysisFailed"
    (canary_wave,) = status["waves"]  # wave 2 never started
    assert canary_wave["phase"] == WavePhase.FAILED
    result = canary_wave["analysis"]
    assert (result["phase"], result["measurements"], result["failedMeasurements"]) == (
        AnalysisPhase.FAILED,
        1,
        1,
    )
    # Prometheus answered for this namespace's agents: all three up, which misses "< 1".
    assert result["results"] == [
        {"name": "agents-up", "value": 3.0, "passed": False, "message": "returned 3, which misses result < 1"}
    ]
    failure = (
        "wave 1/2: analysis failed: query agents-up returned 3, which misses result < 1; "
        "1 failed measurement > failureLimit 0"
    )
    assert result["message"] == failure

    # The canary went to v2 and back; nobody else was called; every pod serves v1.
    (canary,) = canary_wave["pods"]
    calls = {w.name: update_calls(w, fleet.token) for w in workers}
    assert calls == {w.name: (2 if w.name == canary else 0) for w in workers}
    versions = {v: checkpoint_source.version_dir(v) for v in ("v1", "v2")}
    assert serving_versions(workers, fleet.token, versions) == dict.fromkeys(calls, "v1")
    events = _events(rollouts, {EventReason.ANALYSIS_FAILED: 1})
    assert [e["message"] for e in events if e["reason"] == EventReason.ANALYSIS_FAILED] == [failure]
    reasons = [e["reason"] for e in events]
    assert reasons.count(EventReason.ANALYSIS_STARTED) == 1
    assert EventReason.ANALYSIS_PASSED not in reasons


def test_passing_analyses_let_every_wave_complete(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    crd_installed: None,
    namespace: str,
    operator_identity: OperatorIdentity,
    rollouts: Rollouts,
    tmp_path: Path,
) -> None:
    with _scraped_fleet(fleet_factory, namespace, tmp_path / "prometheus") as (prom, fleet, workers):
        # No address in the CR: the operator's --prometheus-url serves it.
        operator = OperatorProcess(
            operator_identity.kubeconfig,
            namespace,
            operator_identity.token_file,
            tmp_path / "operator",
            ["--prometheus-url", prom.url],
        )
        operator.start()
        try:
            strategy = {"waves": [1, "100%"], "analysis": _analysis("result == 3")}
            rollouts.create(NAME, rollout_spec(checkpoint_source.url, "v2", fleet.labels, strategy=strategy))
            status = rollouts.wait_phase(NAME, ENDED, timeout=180)
            # Read while the operator runs: it posts events in the background after the status
            # write, and one stopped at once may not have posted the last of them yet.
            if status["phase"] == Phase.SUCCEEDED:
                _events(rollouts, {EventReason.ANALYSIS_STARTED: 2, EventReason.ANALYSIS_PASSED: 2})
        finally:
            operator.stop()

    assert status["phase"] == Phase.SUCCEEDED, _why(status)
    assert [w["phase"] for w in status["waves"]] == [WavePhase.COMPLETED, WavePhase.COMPLETED]
    for wave in status["waves"]:
        result = wave["analysis"]
        assert result["phase"] == AnalysisPhase.PASSED
        # Every 1 s for 2 s: at least two measurements, none failed, the last one recorded.
        assert result["measurements"] >= 2
        assert result["failedMeasurements"] == 0
        assert result["results"] == [
            {
                "name": "agents-up",
                "value": 3.0,
                "passed": True,
                "message": "returned 3, which meets result == 3",
            }
        ]
    # A wave completes only after its analysis ended: wave 2 started once wave 1's passed.
    assert status["waves"][1]["startedAt"] >= status["waves"][0]["analysis"]["completedAt"]
    versions = {v: checkpoint_source.version_dir(v) for v in ("v1", "v2")}
    assert serving_versions(workers, fleet.token, versions) == {w.name: "v2" for w in workers}


def _cli(cluster: ClusterHandle, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    return subprocess.run(
        [*CLI, *args, NAME, "-n", namespace], capture_output=True, text=True, timeout=60, env=env
    )


def test_promote_leaves_a_running_analysis_and_skip_analysis_ends_it(
    cluster: ClusterHandle,
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    operator: OperatorProcess,
    namespace: str,
    rollouts: Rollouts,
    tmp_path: Path,
) -> None:
    with _scraped_fleet(fleet_factory, namespace, tmp_path / "prometheus") as (prom, fleet, _):
        # Long enough that only the skip can end it within the test.
        analysis = _analysis(
            "result == 3", prometheusAddress=prom.url, durationSeconds=3600, intervalSeconds=30
        )
        strategy = {"waves": [1, "100%"], "analysis": analysis}
        rollouts.create(NAME, rollout_spec(checkpoint_source.url, "v2", fleet.labels, strategy=strategy))

        def analyzing() -> dict[str, Any] | None:
            status = rollouts.status(NAME)
            waves = status.get("waves") or []
            measured = waves and (waves[0].get("analysis") or {}).get("measurements")
            return status if waves and waves[0]["phase"] == WavePhase.ANALYZING and measured else None

        wait_for(analyzing, 120, "wave 1 analyzing, measured once", interval=0.2)
        refused = _cli(cluster, namespace, "promote")
        assert refused.returncode == 5, refused.stderr
        assert "nothing to promote" in refused.stderr
        shown = _cli(cluster, namespace, "status")
        assert shown.returncode == 0, shown.stderr
        assert "Analyzing" in shown.stdout
        assert "Analysis:   wave 1: Running 1/120 (0 failed), every query passed" in shown.stdout, (
            shown.stdout
        )

        skipped = _cli(cluster, namespace, "promote", "--skip-analysis")
        assert skipped.returncode == 0, skipped.stderr
        assert skipped.stdout.strip() == f"{NAME}: skipping the analysis of wave 1"
        annotations = rollouts.get(NAME)["metadata"]["annotations"]
        assert annotations[SKIP_ANALYSIS_ANNOTATION] == "0@v2"
        # Wave 2's analysis is not the one skipped: it runs, and is skipped in turn.

        def second_analyzing() -> dict[str, Any] | None:
            status = rollouts.status(NAME)
            waves = status.get("waves") or []
            return status if len(waves) == 2 and waves[1]["phase"] == WavePhase.ANALYZING else None

        status = wait_for(second_analyzing, 120, "wave 2 analyzing", interval=0.2)
        assert [w["analysis"]["phase"] for w in status["waves"]] == [
            AnalysisPhase.SKIPPED,
            AnalysisPhase.RUNNING,
        ]
        assert _cli(cluster, namespace, "promote", "--skip-analysis").returncode == 0
        status = rollouts.wait_phase(NAME, ENDED, timeout=120)

    assert status["phase"] == Phase.SUCCEEDED, _why(status)
    assert [w["analysis"]["phase"] for w in status["waves"]] == [AnalysisPhase.SKIPPED, AnalysisPhase.SKIPPED]
    _events(rollouts, {EventReason.ANALYSIS_SKIPPED: 2})
