"""The chart's alert rules, unit-tested with `promtool test rules`: each alert fires when it
should and stays quiet when it should not. The rules come from `helm template`, so what is
tested is what a user installs."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_render import Helm, Obj

from ckpt_rollout.chartgen.chart_values import DEFAULT_AGENT_JOB


@pytest.fixture(scope="session")
def promtool() -> Path:
    from ckpt_e2e.provision import cached_path, explicit_path

    path = explicit_path("promtool") or cached_path("promtool")
    # `make test` provisions promtool first; a missing binary is a set-up bug, never a skip.
    assert path.is_file(), "promtool missing: `make provision` (python3 e2e/ckpt_e2e/provision.py promtool)"
    return path


def rendered_rules(helm: Helm, *sets: str) -> Obj:
    rendered = helm.template(None, "metrics.prometheusRule.enabled=true", *sets)
    rule: Obj = rendered.one("PrometheusRule")["spec"]
    return rule


CR = {"namespace": "rl", "name": "fleet"}
POD = {"namespace": "rl", "pod": "worker-0"}


def _series(metric: str, labels: dict[str, str], values: str) -> dict[str, str]:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{inner}}}", "values": values}


def _phase(phase: str, values: str) -> dict[str, str]:
    return _series("ckpt_rollout_phase", {**CR, "phase": phase}, values)


TARGET_V2 = _series("ckpt_rollout_target_version_info", {**CR, "version": "v2"}, "1x30")


def _failed_alert() -> Obj:
    return {
        "exp_labels": {**CR, "version": "v2", "severity": "warning"},
        "exp_annotations": {
            "summary": "CheckpointRollout rl/fleet failed to roll out v2",
            "description": "kubectl -n rl describe ckr fleet: status.message and the failed workers say why.",
        },
    }


def _stalled_alert() -> Obj:
    return {
        "exp_labels": {**CR, "severity": "warning"},
        "exp_annotations": {
            "summary": "CheckpointRollout rl/fleet is past its progress deadline",
            "description": "Still Progressing after spec.timeouts.progressDeadlineSeconds (paused time "
            "excluded): check the operator log and the workers of the current wave.",
        },
    }


def _loads_alert(value: str) -> Obj:
    return {
        "exp_labels": {**POD, "severity": "warning"},
        "exp_annotations": {
            "summary": f"Agent rl/worker-0 failed {value} weight loads in 15m",
            "description": 'ckpt_agent_loads_total{result="failed"} has the reasons; /v1/status of the '
            "agent has last_error.",
        },
    }


def _unreachable_alert(job: str = DEFAULT_AGENT_JOB) -> Obj:
    return {
        "exp_labels": {**POD, "job": job, "instance": "10.0.0.1:8090", "severity": "warning"},
        "exp_annotations": {
            "summary": "Agent rl/worker-0 does not answer scrapes",
            "description": "Its metrics port has not answered for 2m: the operator cannot roll weights "
            "out to this pod either.",
        },
    }


def _deadline(at_s: int) -> dict[str, str]:
    return _series("ckpt_rollout_progress_deadline_timestamp_seconds", CR, f"{at_s}x30")


def _failed_loads(values: str) -> dict[str, str]:
    labels = {**POD, "job": DEFAULT_AGENT_JOB, "result": "failed"}
    return _series("ckpt_agent_load_seconds_count", labels, values)


def _up(values: str, job: str = DEFAULT_AGENT_JOB) -> dict[str, str]:
    return _series("up", {**POD, "job": job, "instance": "10.0.0.1:8090"}, values)


@dataclass(frozen=True)
class Case:
    alert: str
    series: list[dict[str, str]]
    eval_time: str
    expected: list[Obj]
    sets: tuple[str, ...] = field(default=())


CASES = {
    "failed-fires": Case(
        "CheckpointRolloutFailed", [_phase("Failed", "0 0 1x28"), TARGET_V2], "3m", [_failed_alert()]
    ),
    "rolled-back-fires": Case(
        "CheckpointRolloutFailed", [_phase("RolledBack", "1x30"), TARGET_V2], "1m", [_failed_alert()]
    ),
    "succeeded-is-quiet": Case(
        "CheckpointRolloutFailed",
        [_phase("Succeeded", "1x30"), _phase("Failed", "0x30"), TARGET_V2],
        "10m",
        [],
    ),
    "failed-before-it-failed-is-quiet": Case(
        "CheckpointRolloutFailed", [_phase("Failed", "0 0 0 0 1x26"), TARGET_V2], "3m", []
    ),
    "stalled-fires-5m-past-the-deadline": Case(
        "CheckpointRolloutStalled", [_phase("Progressing", "1x30"), _deadline(60)], "7m", [_stalled_alert()]
    ),
    "stalled-is-pending-for-5m": Case(
        "CheckpointRolloutStalled", [_phase("Progressing", "1x30"), _deadline(60)], "5m", []
    ),
    "before-the-deadline-is-quiet": Case(
        "CheckpointRolloutStalled", [_phase("Progressing", "1x30"), _deadline(3600)], "20m", []
    ),
    "paused-past-the-deadline-is-quiet": Case(
        "CheckpointRolloutStalled",
        [_phase("Progressing", "0x30"), _phase("Paused", "1x30"), _deadline(60)],
        "20m",
        [],
    ),
    "failing-loads-fire": Case(
        "CheckpointAgentLoadsFailing", [_failed_loads("0 0 1 2x27")], "4m", [_loads_alert("2")]
    ),
    "no-failed-loads-is-quiet": Case("CheckpointAgentLoadsFailing", [_failed_loads("0x30")], "10m", []),
    "an-old-failure-is-quiet": Case("CheckpointAgentLoadsFailing", [_failed_loads("0 1x29")], "25m", []),
    "unreachable-fires-after-2m": Case(
        "CheckpointAgentUnreachable", [_up("1 0x29")], "4m", [_unreachable_alert()]
    ),
    "unreachable-is-pending-for-2m": Case("CheckpointAgentUnreachable", [_up("1 1 0x28")], "3m", []),
    "up-is-quiet": Case("CheckpointAgentUnreachable", [_up("1x30")], "10m", []),
    "another-job-down-is-quiet": Case("CheckpointAgentUnreachable", [_up("0x30", job="node")], "10m", []),
    "the-agent-job-is-a-value": Case(
        "CheckpointAgentUnreachable",
        [_up("0x30", job="my-agents")],
        "5m",
        [_unreachable_alert("my-agents")],
        ("metrics.prometheusRule.agentJob=my-agents",),
    ),
}


def run_promtool(
    promtool: Path, rules: Obj, tests: list[Obj], work: Path
) -> subprocess.CompletedProcess[str]:
    (work / "rules.yaml").write_text(yaml.safe_dump({"groups": rules["groups"]}))
    suite: dict[str, Any] = {"rule_files": ["rules.yaml"], "evaluation_interval": "1m", "tests": tests}
    (work / "tests.yaml").write_text(yaml.safe_dump(suite, sort_keys=False))
    return subprocess.run(
        [str(promtool), "test", "rules", "tests.yaml"], cwd=work, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_alert(helm: Helm, promtool: Path, tmp_path: Path, case: Case) -> None:
    test = {
        "interval": "1m",
        "input_series": case.series,
        "alert_rule_test": [
            {"eval_time": case.eval_time, "alertname": case.alert, "exp_alerts": case.expected}
        ],
    }
    result = run_promtool(promtool, rendered_rules(helm, *case.sets), [test], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_catches_a_wrong_expectation(helm: Helm, promtool: Path, tmp_path: Path) -> None:
    """The harness itself: a firing alert expected quiet must fail the run."""
    case = CASES["failed-fires"]
    test = {
        "interval": "1m",
        "input_series": case.series,
        "alert_rule_test": [{"eval_time": case.eval_time, "alertname": case.alert, "exp_alerts": []}],
    }
    result = run_promtool(promtool, rendered_rules(helm), [test], tmp_path)
    assert result.returncode != 0
    assert "CheckpointRolloutFailed" in result.stdout + result.stderr


def test_every_alert_has_cases_both_ways(helm: Helm) -> None:
    rendered = {r["alert"] for g in rendered_rules(helm)["groups"] for r in g["rules"]}
    assert rendered == {c.alert for c in CASES.values()}
    outcomes = {(c.alert, bool(c.expected)) for c in CASES.values()}
    assert outcomes == {(a, fires) for a in rendered for fires in (True, False)}


def test_rules_pass_promtool_check(helm: Helm, promtool: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": rendered_rules(helm)["groups"]}))
    result = subprocess.run(
        [str(promtool), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 rules found" in result.stdout
