"""Which Prometheus a CR's analysis may make the operator dial (the operator's own, or what
--allowed-prometheus lists), and what the operator does with the reply: a redirect is not
followed and the reply's words stay out of the status. The HTTP parts against real servers on
127.0.0.1."""

from __future__ import annotations

import argparse

import pytest
from aiohttp import web

from ckpt_api.source_policy import parse_rule
from ckpt_rollout.controller.config import prometheus_rules
from ckpt_rollout.domain.analysis import allowed_prometheus, prometheus_refusal
from ckpt_rollout.domain.plan import Measurement
from ckpt_rollout.io.promquery import measure

OWN = "http://prometheus-operated.monitoring:9090"


@pytest.mark.parametrize(
    ("address", "rules", "allowed"),
    [
        (OWN, (), True),
        (OWN + "/", (), True),
        ("http://prometheus-operated.monitoring:9091", (), False),  # another port of the same name
        ("https://prometheus-operated.monitoring:9090", (), False),
        ("http://169.254.169.254", (), False),
        ("http://kube-apiserver.default:443", (), False),
        ("http://thanos.monitoring:10902/prom", ("http://thanos.monitoring/prom",), True),
        ("http://thanos.monitoring:10902/promx", ("http://thanos.monitoring/prom",), False),
        ("http://thanos.monitoring:10902/prom/../admin", ("http://thanos.monitoring/prom",), False),
        ("http://a.prom.internal:9090", ("http://*.prom.internal:9090",), True),
        ("http://10.1.2.3:9090", ("http://10.0.0.0/8",), True),
        # A name is matched as a name: no CIDR rule lets one in, whatever it resolves to.
        ("http://prom.evil.example:9090", ("http://10.0.0.0/8",), False),
        # Listing addresses replaces the default: the operator's own must be listed too.
        (OWN, ("http://thanos.monitoring",), False),
    ],
)
def test_which_addresses_may_be_queried(address: str, rules: tuple[str, ...], allowed: bool) -> None:
    allow = allowed_prometheus(OWN, tuple(parse_rule(r) for r in rules))
    assert (prometheus_refusal(address, allow) is None) is allowed


def test_without_an_operator_prometheus_nothing_a_cr_names_is_queried() -> None:
    refused = prometheus_refusal(OWN, allowed_prometheus(None, ()))
    assert refused is not None
    assert "--allowed-prometheus" in refused


def test_the_flag_takes_http_rules_only() -> None:
    assert prometheus_rules("http://a:9090, https://*.b") == (
        parse_rule("http://a:9090"),
        parse_rule("https://*.b"),
    )
    assert prometheus_rules("") == ()
    with pytest.raises(argparse.ArgumentTypeError, match="http or https"):
        prometheus_rules("file:///etc")
    with pytest.raises(argparse.ArgumentTypeError, match="names no host"):
        prometheus_rules("http://")


async def test_a_redirect_is_an_answer_and_a_replys_words_stay_out_of_status() -> None:
    internal_hits: list[str] = []

    async def internal(request: web.Request) -> web.Response:
        internal_hits.append(request.path)
        return web.json_response({"status": "success", "data": {"resultType": "scalar", "result": [1, "0"]}})

    async def redirect(request: web.Request) -> web.Response:
        raise web.HTTPFound("/internal")

    async def refusing(request: web.Request) -> web.Response:
        body = {"status": "error", "errorType": "internal", "error": "SECRET internal page body"}
        return web.json_response(body, status=500)

    answers = {}
    for name, handler in (("redirect", redirect), ("refusing", refusing)):
        app = web.Application()
        app.router.add_get("/api/v1/query", handler)
        app.router.add_get("/internal", internal)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        address = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            (answers[name],) = await measure(Measurement("v2/0/0", address, (("q", "up"),), 5.0))
        finally:
            await runner.cleanup()
    assert internal_hits == []
    assert answers["redirect"].error == "HTTP 302: a redirect, which the operator does not follow"
    assert answers["refusing"].error == (
        "Prometheus refused the query (internal, HTTP 500); the operator's log has its message"
    )
