"""A real Prometheus scrapes the operator and every agent through a rollout on the local control
plane; what a Deployment user would query, alert on and graph is then asserted through PromQL:
the per-CR gauges, the agents' load and byte counters (peer relay included), process metrics,
the chart's alert rules (loaded, evaluating, quiet), and every panel of the chart's dashboard."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from ckpt_api.constants import DEFAULT_AGENT_METRICS_PORT
from ckpt_e2e.prometheus import Job, Prometheus, prometheus_server
from ckpt_e2e.rollout_env import CheckpointSource, Rollouts, operator_with_metrics, rollout_spec
from ckpt_e2e.rollout_fixtures import Fleet, OperatorIdentity
from ckpt_e2e.serviceaccounts import CHART, render_chart
from ckpt_rollout.chartgen.chart_values import DEFAULT_AGENT_JOB

pytestmark = pytest.mark.integration

NAME = "fleet"
REPLICAS = 3
OPERATOR_JOB = "ckpt-rollout-operator"
DASHBOARD = CHART / "dashboards" / "ckpt-rollout.json"
ENDED = {"Succeeded", "Failed", "RolledBack"}


def _chart_rules(namespace: str, path: Path) -> Path:
    """The chart's PrometheusRule, as a rule file for a plain Prometheus."""
    rendered = render_chart(
        "prom", namespace, ["templates/prometheusrule.yaml"], ["metrics.prometheusRule.enabled=true"]
    )
    (rule,) = [d for d in yaml.safe_load_all(rendered) if d]
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def _version_bytes(source: CheckpointSource, version: str) -> int:
    manifest = json.loads((source.version_dir(version) / "manifest.json").read_text())
    return sum(int(t["nbytes"]) for t in manifest["tensors"])


def test_a_rollout_as_prometheus_sees_it(
    fleet_factory: Callable[..., Fleet],
    checkpoint_source: CheckpointSource,
    crd_installed: None,
    namespace: str,
    operator_identity: OperatorIdentity,
    rollouts: Rollouts,
    tmp_path: Path,
) -> None:
    started = time.monotonic()
    identity = operator_identity
    jobs = [Job(DEFAULT_AGENT_JOB), Job(OPERATOR_JOB, honor_labels=True)]
    rules = _chart_rules(namespace, tmp_path / "rules.yaml")
    with (
        operator_with_metrics(identity.kubeconfig, namespace, identity.token_file, tmp_path / "operator") as (
            _,
            metrics_port,
        ),
        prometheus_server(tmp_path / "prometheus", jobs, [rules]) as prom,
    ):
        fleet = fleet_factory(REPLICAS)
        workers = fleet.workers(REPLICAS)
        prom.set_targets(OPERATOR_JOB, {f"127.0.0.1:{metrics_port}": {}})
        prom.set_targets(
            DEFAULT_AGENT_JOB,
            {
                f"{w.ip}:{DEFAULT_AGENT_METRICS_PORT}": {"namespace": namespace, "pod": w.name}
                for w in workers
            },
        )
        counts = {DEFAULT_AGENT_JOB: REPLICAS, OPERATOR_JOB: 1}
        # A scrape before the rollout: the counters' zeroes, which rate() and increase() need.
        prom.wait_scraped(counts, after=time.time())

        spec = rollout_spec(checkpoint_source.url, "v2", fleet.labels, strategy={"waves": [1, "100%"]})
        rollouts.create(NAME, spec)
        status = rollouts.wait_phase(NAME, ENDED, timeout=180)
        assert status["phase"] == "Succeeded", status.get("message")
        prom.wait_scraped(counts, after=time.time())

        _assert_rollout_metrics(prom, namespace, {w.name for w in workers})
        _assert_agent_metrics(
            prom, namespace, {w.name for w in workers}, _version_bytes(checkpoint_source, "v2")
        )
        _assert_alerts_evaluate_and_stay_quiet(prom)
        _assert_every_dashboard_panel_has_data(prom, namespace)
    print(f"\ntest_prometheus: rollout + scrapes + queries in {time.monotonic() - started:.1f}s")


def _assert_rollout_metrics(prom: Prometheus, namespace: str, pods: set[str]) -> None:
    cr = f'namespace="{namespace}", name="{NAME}"'
    assert prom.by(f"ckpt_rollout_phase{{{cr}}}", "phase") == {
        "Pending": 0,
        "Progressing": 0,
        "Paused": 0,
        "Succeeded": 1,
        "Failed": 0,
        "RollingBack": 0,
        "RolledBack": 0,
    }
    assert prom.one(f"ckpt_rollout_replicas{{{cr}}}") == REPLICAS
    assert prom.one(f"ckpt_rollout_updated_replicas{{{cr}}}") == REPLICAS
    assert prom.one(f"ckpt_rollout_failed_replicas{{{cr}}}") == 0
    assert prom.one(f"ckpt_rollout_current_wave{{{cr}}}") == prom.one(f"ckpt_rollout_waves{{{cr}}}") == 2
    assert prom.by(f"ckpt_rollout_target_version_info{{{cr}}}", "version") == {"v2": 1}
    assert prom.by(f"ckpt_rollout_stable_version_info{{{cr}}}", "version") == {"v2": 1}
    assert prom.query(f"ckpt_rollout_progress_deadline_timestamp_seconds{{{cr}}}") == [], "no rollout runs"
    assert prom.by('ckpt_rollout_workers_total{result="updated"}', "result") == {"updated": len(pods)}
    assert prom.one('ckpt_rollout_duration_seconds_count{phase="Succeeded"}') == 1
    assert prom.one("ckpt_rollout_wave_duration_seconds_count") == 2
    assert prom.one(f'up{{job="{OPERATOR_JOB}"}}') == 1
    assert prom.one(f'process_resident_memory_bytes{{job="{OPERATOR_JOB}"}}') > 0


def _assert_agent_metrics(prom: Prometheus, namespace: str, pods: set[str], version_bytes: int) -> None:
    agents = f'job="{DEFAULT_AGENT_JOB}", namespace="{namespace}"'
    assert prom.by(f"up{{{agents}}}", "pod") == dict.fromkeys(pods, 1)
    # Each pod loaded v1 at boot and v2 in the rollout; nothing failed.
    assert prom.by(f'ckpt_agent_loads_total{{{agents}, result="succeeded"}}', "pod") == dict.fromkeys(pods, 2)
    assert prom.one(f'sum(ckpt_agent_load_seconds_count{{{agents}, result="failed"}})') == 0
    assert prom.by(f'ckpt_agent_version_info{{{agents}, version="v2"}}', "pod") == dict.fromkeys(pods, 1)
    # Every pod pulled v2 once, whole: the canary from the source; the second wave (two members)
    # as two chains, one fed by the canary, one by the source.
    rollout = f'{agents}, rollout="{NAME}"'
    pulled = prom.by(f"sum by (pod) (ckpt_agent_pulled_bytes_total{{{rollout}}})", "pod")
    assert pulled == dict.fromkeys(pods, version_bytes)
    by_origin = prom.by(f"sum by (origin) (ckpt_agent_pulled_bytes_total{{{rollout}}})", "origin")
    assert by_origin == {"source": 2 * version_bytes, "peer": (REPLICAS - 2) * version_bytes}
    resident = prom.by(f"process_resident_memory_bytes{{{agents}}}", "pod")
    assert set(resident) == pods
    assert min(resident.values()) > 0


def _assert_alerts_evaluate_and_stay_quiet(prom: Prometheus) -> None:
    groups = prom.api("/api/v1/rules")["groups"]
    health = {r["name"]: (r["health"], r.get("lastError", "")) for g in groups for r in g["rules"]}
    assert set(health) == {
        "CheckpointRolloutFailed",
        "CheckpointRolloutStalled",
        "CheckpointAgentLoadsFailing",
        "CheckpointAgentUnreachable",
    }
    assert all(h == ("ok", "") for h in health.values()), health
    assert prom.query("ALERTS") == [], "a successful rollout fires no alert"


def _assert_every_dashboard_panel_has_data(prom: Prometheus, namespace: str) -> None:
    """Each query of each panel returns series and at least one number per panel, with the
    dashboard's variables set to this rollout, as Grafana would send them."""
    dashboard = json.loads(DASHBOARD.read_text())
    values = {"$namespace": namespace, "$rollout": NAME, "$__rate_interval": "1m", "$__range": "10m"}

    def expand(text: str) -> str:
        return re.sub(r"\$\w+", lambda m: values[m.group(0)], text)

    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
        assert match is not None, variable
        found = prom.api(f"/api/v1/label/{match[2]}/values", {"match[]": expand(match[1])})
        assert expand(f"${variable['name']}") in found, (variable["name"], found)
    empty = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        numbers = []
        for target in panel["targets"]:
            samples = prom.query(expand(target["expr"]))
            if not samples:
                empty.append(f"{panel['title']}: {target['expr']}")
            numbers += [s.value for s in samples if not math.isnan(s.value)]
        if not numbers:
            empty.append(f"{panel['title']}: only NaN")
    assert empty == [], "panels without data:\n" + "\n".join(empty)
