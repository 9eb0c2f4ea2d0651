"""The chart's monitoring objects: the agents' PodMonitor (and its agreement with
examples/worker-podmonitor.yaml), the PrometheusRule switch, the Grafana dashboard ConfigMap.
The alerts' behaviour is test_chart_alerts.py; the dashboard's queries run against a real
Prometheus in e2e/tests/test_prometheus.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from chart_render import CHART, ROOT, Helm, Obj

from ckpt_rollout.chartgen.chart_values import DEFAULT_AGENT_JOB

EXAMPLES = ROOT / "examples"
DASHBOARD = CHART / "dashboards" / "ckpt-rollout.json"
ALL_ON = {
    "metrics": {
        "agentPodMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True, "labels": {"release": "prom"}},
        "dashboard": {"enabled": True},
    }
}


def _example(name: str, kind: str) -> Obj:
    (found,) = [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d and d["kind"] == kind]
    return dict(found)


def _pod_monitors(helm: Helm, values: Obj) -> dict[str, Obj]:
    return {o["metadata"]["name"]: o for o in helm.template(values).of_kind("PodMonitor")}


def test_monitoring_objects_are_opt_in(helm: Helm) -> None:
    off = helm.template()
    assert off.of_kind("PrometheusRule") == []
    assert off.of_kind("PodMonitor") == []
    assert off.of_kind("ConfigMap") == []
    on = helm.template(ALL_ON)
    assert on.one("PrometheusRule")["metadata"]["labels"]["release"] == "prom"
    assert on.one("PodMonitor", "rel-ckpt-rollout-agents", "ops")
    assert on.one("ConfigMap", "rel-ckpt-rollout-dashboard", "ops")


@pytest.mark.parametrize(
    ("namespaces", "expected"),
    [([], ["ops"]), (["rl-a", "rl-b"], ["rl-a", "rl-b"])],
    ids=["release", "listed"],
)
def test_agent_pod_monitor_watches_the_worker_namespaces(
    helm: Helm, namespaces: list[str], expected: list[str]
) -> None:
    values = {"metrics": {"agentPodMonitor": {"enabled": True, "namespaces": namespaces}}}
    monitor = helm.template(values).one("PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": expected}


def test_agent_pod_monitor_is_the_example_for_a_namespace(helm: Helm) -> None:
    """The example is what the chart renders for the example Deployment's namespace, with the
    example's 15 s interval: one PodMonitor, two ways to install it."""
    values = {"metrics": {"agentPodMonitor": {"enabled": True, "interval": "15s"}}}
    chart = helm.template(values).one("PodMonitor")["spec"]
    example = _example("worker-podmonitor.yaml", "PodMonitor")["spec"]
    chart.pop("namespaceSelector")  # the example lives in the workers' namespace
    assert chart == example


def test_agent_pod_monitor_scrapes_the_example_workers_metrics_port(helm: Helm) -> None:
    monitor = helm.template(ALL_ON).one("PodMonitor")
    pod = _example("worker-deployment.yaml", "Deployment")["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in ports
    assert endpoint["relabelings"] == [{"targetLabel": "job", "replacement": DEFAULT_AGENT_JOB}]


def test_the_agent_job_is_one_value_for_monitor_rules_and_dashboard(helm: Helm) -> None:
    values = {
        "metrics": {
            "agentPodMonitor": {"enabled": True},
            "prometheusRule": {"enabled": True, "agentJob": "gpu-agents"},
            "dashboard": {"enabled": True},
        }
    }
    rendered = helm.template(values)
    (endpoint,) = rendered.one("PodMonitor")["spec"]["podMetricsEndpoints"]
    assert endpoint["relabelings"][0]["replacement"] == "gpu-agents"
    rules = [r for g in rendered.one("PrometheusRule")["spec"]["groups"] for r in g["rules"]]
    assert 'up{job="gpu-agents"}' in next(
        r["expr"] for r in rules if r["alert"] == "CheckpointAgentUnreachable"
    )
    exprs = _exprs(json.loads(rendered.one("ConfigMap")["data"]["ckpt-rollout.json"]))
    assert not [e for e in exprs if DEFAULT_AGENT_JOB in e]
    assert (
        len([e for e in exprs if 'job="gpu-agents"' in e])
        == len([e for e in _exprs(_dashboard()) if f'job="{DEFAULT_AGENT_JOB}"' in e])
        > 0
    )


def test_operator_monitors_keep_the_crs_namespace_label(helm: Helm) -> None:
    """Per-CR series carry the CR's namespace; without honorLabels Prometheus would rename it
    exported_namespace and give `namespace` the operator pod's."""
    values = {
        "metrics": {
            "service": {"enabled": True},
            "serviceMonitor": {"enabled": True},
            "podMonitor": {"enabled": True},
        }
    }
    rendered = helm.template(values)
    assert [e["honorLabels"] for e in rendered.one("ServiceMonitor")["spec"]["endpoints"]] == [True]
    assert [e["honorLabels"] for e in rendered.one("PodMonitor")["spec"]["podMetricsEndpoints"]] == [True]


def test_dashboard_configmap_is_for_the_grafana_sidecar(helm: Helm) -> None:
    values = {
        "metrics": {
            "dashboard": {
                "enabled": True,
                "namespace": "monitoring",
                "annotations": {"k8s-sidecar-target-directory": "ml"},
            }
        }
    }
    config_map = helm.template(values).one("ConfigMap")
    assert config_map["metadata"]["namespace"] == "monitoring"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "ml"}
    assert json.loads(config_map["data"]["ckpt-rollout.json"]) == _dashboard()


def _dashboard() -> Obj:
    loaded: Obj = json.loads(DASHBOARD.read_text())
    return loaded


def _exprs(dashboard: Obj) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_dashboard_is_well_formed() -> None:
    dashboard = _dashboard()
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        pos = panel["gridPos"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert all(t["expr"].strip() for t in panel["targets"]), panel["title"]
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    variables = {v["name"] for v in dashboard["templating"]["list"]}
    assert variables == {"datasource", "namespace", "rollout"}
    used = " ".join(_exprs(dashboard))
    assert "$namespace" in used
    assert "$rollout" in used


def test_chart_package_ships_the_dashboard() -> None:
    ignored = (CHART / ".helmignore").read_text().split()
    assert not any(Path("dashboards/ckpt-rollout.json").match(p.rstrip("/")) for p in ignored)
