"""The chart's analysis.prometheusUrl: the operator's --prometheus-url, which spec.strategy.analysis
queries when a CheckpointRollout names no Prometheus; a URL the operator would refuse fails the
install instead."""

from __future__ import annotations

import argparse

import pytest
from chart_render import Helm
from test_chart_templates import _operator

from ckpt_rollout.controller.config import add_operator_arguments, config_from_args

URL = "http://prometheus-operated.monitoring.svc:9090"


def _parsed(args: list[str]) -> str | None:
    parser = argparse.ArgumentParser()
    add_operator_arguments(parser)
    return config_from_args(parser.parse_args(args)).tuning.prometheus_url


def test_the_url_reaches_the_operators_settings(helm: Helm) -> None:
    args = _operator(helm.template({"analysis": {"prometheusUrl": URL}}))["args"]
    assert f"--prometheus-url={URL}" in args
    assert _parsed(args) == URL


def test_no_url_no_flag_and_no_prometheus(helm: Helm) -> None:
    args = _operator(helm.template())["args"]
    assert not any(a.startswith("--prometheus-url") for a in args)
    assert _parsed(args) is None


@pytest.mark.parametrize("bad", ["prometheus:9090", "ftp://prom:21", "http://prom:9090/?x=1", "http://"])
def test_a_url_the_operator_would_refuse_fails_the_install(helm: Helm, bad: str) -> None:
    error = helm.template_error({"analysis": {"prometheusUrl": bad}})
    assert "prometheusUrl" in error, error
    with pytest.raises(SystemExit):
        _parsed([f"--prometheus-url={bad}"])


def _allowed(args: list[str]) -> tuple[str, ...]:
    parser = argparse.ArgumentParser()
    add_operator_arguments(parser)
    return tuple(str(r) for r in config_from_args(parser.parse_args(args)).tuning.prometheus_allowed)


def test_allowed_prometheus_reaches_the_operators_settings(helm: Helm) -> None:
    rules = ["http://thanos.monitoring:10902", "https://*.prom.internal"]
    args = _operator(helm.template({"analysis": {"allowedPrometheus": rules}}))["args"]
    assert f"--allowed-prometheus={','.join(rules)}" in args
    assert _allowed(args) == tuple(rules)
    # Unset: no flag, and the operator queries its own --prometheus-url only.
    assert not any(a.startswith("--allowed-prometheus") for a in _operator(helm.template())["args"])


def test_an_allowed_prometheus_the_operator_would_refuse_fails_the_install(helm: Helm) -> None:
    error = helm.template_error({"analysis": {"allowedPrometheus": ["file:///etc"]}})
    assert "allowedPrometheus" in error, error
