"""spec.strategy.analysis, pure parts: Prometheus instant-query replies, successConditions, the
query placeholders, the spec's validation of both; and the client's answer when Prometheus
cannot be reached."""

from __future__ import annotations

import asyncio
import math
import socket
from typing import Any

import pytest
from pydantic import ValidationError

from ckpt_api.spec import Analysis
from ckpt_rollout.domain.analysis import judge, parse_condition, parse_reply, render
from ckpt_rollout.domain.plan import Measurement
from ckpt_rollout.domain.world import QueryAnswer
from ckpt_rollout.io.promquery import measure


def vector(*values: str) -> dict[str, Any]:
    result = [{"metric": {"pod": f"p{i}"}, "value": [1_800_000_000.5, v]} for i, v in enumerate(values)]
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


@pytest.mark.parametrize(
    ("status", "body", "answer"),
    [
        (200, vector("0.25"), QueryAnswer(values=(0.25,))),
        (200, vector("1", "2", "3"), QueryAnswer(values=(1.0, 2.0, 3.0))),
        (200, vector(), QueryAnswer()),
        (200, vector("+Inf"), QueryAnswer(values=(math.inf,))),
        (
            200,
            {"status": "success", "data": {"resultType": "scalar", "result": [1.5, "7"]}},
            QueryAnswer((7.0,)),
        ),
        (
            400,
            {"status": "error", "errorType": "bad_data", "error": 'parse error: unexpected "}"'},
            QueryAnswer(
                error="Prometheus refused the query (bad_data, HTTP 400); the operator's log has its message"
            ),
        ),
        (503, {"status": "error"}, QueryAnswer(error="Prometheus refused the query (HTTP 503)")),
        (502, None, QueryAnswer(error="HTTP 502: not a Prometheus API reply")),
        (200, ["not", "an", "object"], QueryAnswer(error="HTTP 200: not a Prometheus API reply")),
        (
            200,
            {"status": "success", "data": {"resultType": "matrix", "result": []}},
            QueryAnswer(error="a range vector: the query must be an instant one (drop the [range])"),
        ),
        (
            200,
            {"status": "success", "data": {"resultType": "string", "result": [1.0, "hello"]}},
            QueryAnswer(error="a string result, not a number"),
        ),
        (
            200,
            {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}}]}},
            QueryAnswer(error="malformed vector in the reply"),
        ),
        (
            200,
            {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "x"]}]}},
            QueryAnswer(error="malformed vector in the reply"),
        ),
        (200, {"status": "success"}, QueryAnswer(error="a None result, not a number")),
    ],
    ids=[
        "one-sample",
        "several-samples",
        "empty-vector",
        "infinity",
        "scalar",
        "refused-query",
        "error-without-text",
        "not-json",
        "not-an-object",
        "range-vector",
        "string",
        "sample-without-value",
        "value-not-a-number",
        "no-data-field",
    ],
)
def test_replies(status: int, body: Any, answer: QueryAnswer) -> None:
    assert parse_reply(status, body) == answer


def test_a_replys_own_words_never_reach_the_status() -> None:
    """The CR author reads status; what a reply says (an internal page, a token in an error) is
    not theirs to read: only Prometheus's own error kinds are named, the text goes to the log."""
    body = {"status": "error", "errorType": "<title>admin</title>", "error": "db password: hunter2"}
    assert parse_reply(500, body) == QueryAnswer(
        error="Prometheus refused the query (HTTP 500); the operator's log has its message"
    )
    assert parse_reply(302, None) == QueryAnswer(
        error="HTTP 302: a redirect, which the operator does not follow"
    )


def test_nan_samples_parse_as_nan() -> None:
    (value,) = parse_reply(200, vector("NaN")).values
    assert math.isnan(value)


@pytest.mark.parametrize(
    ("condition", "parsed"),
    [
        ("result < 0.5", ("<", 0.5)),
        ("result<=2", ("<=", 2.0)),
        ("result >  -1e3", (">", -1000.0)),
        ("result >= .25", (">=", 0.25)),
        ("result == 0", ("==", 0.0)),
        ("result != 1.", ("!=", 1.0)),
    ],
)
def test_conditions(condition: str, parsed: tuple[str, float]) -> None:
    assert parse_condition(condition) == parsed


@pytest.mark.parametrize(
    ("answer", "condition", "judged"),
    [
        (QueryAnswer((0.1,)), "result < 0.5", (0.1, True, "returned 0.1, which meets result < 0.5")),
        (QueryAnswer((0.5,)), "result < 0.5", (0.5, False, "returned 0.5, which misses result < 0.5")),
        (QueryAnswer((0.5,)), "result <= 0.5", (0.5, True, "returned 0.5, which meets result <= 0.5")),
        (QueryAnswer((3.0,)), "result > 3", (3.0, False, "returned 3, which misses result > 3")),
        (QueryAnswer((3.0,)), "result >= 3", (3.0, True, "returned 3, which meets result >= 3")),
        (QueryAnswer((1.0,)), "result == 1", (1.0, True, "returned 1, which meets result == 1")),
        (QueryAnswer((1.0,)), "result != 1", (1.0, False, "returned 1, which misses result != 1")),
        (
            QueryAnswer((1.0, 2.0)),
            "result > 0",
            (1.0, True, "returned 1, which meets result > 0 (and so do all 2 samples)"),
        ),
        (QueryAnswer((1.0, -2.0, 3.0)), "result > 0", (-2.0, False, "returned -2, which misses result > 0")),
        (QueryAnswer(()), "result > 0", (None, False, "returned no data for result > 0")),
        (QueryAnswer((1.0, math.nan)), "result > 0", (None, False, "returned NaN for result > 0")),
        # Infinities pass or fail as numbers do; JSON has none, so the status keeps no value.
        (QueryAnswer((math.inf,)), "result < 1", (None, False, "returned inf, which misses result < 1")),
        (QueryAnswer((-math.inf,)), "result < 1", (None, True, "returned -inf, which meets result < 1")),
        (QueryAnswer(error="unreachable"), "result > 0", (None, False, "failed: unreachable")),
    ],
)
def test_judging(answer: QueryAnswer, condition: str, judged: tuple[float | None, bool, str]) -> None:
    result = judge("q", answer, condition)
    assert (result.name, result.value, result.passed, result.message) == ("q", *judged)


def test_placeholders_are_filled_and_promqls_own_braces_stay() -> None:
    values = {"namespace": "rl", "rollout": "fleet", "version": "v2", "wave": "1"}
    query = 'sum(x{namespace="{{namespace}}",r="{{rollout}}",v="{{version}}",w="{{wave}}"}) > {{other}}'
    assert render(query, values) == 'sum(x{namespace="rl",r="fleet",v="v2",w="1"}) > {{other}}'


def _analysis(**changes: Any) -> dict[str, Any]:
    query = {"name": "errors", "query": "vector(1)", "successCondition": "result < 0.5"}
    return {"queries": [query], **changes}


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"queries": [{"name": "e", "query": "up", "successCondition": "result < x"}]}, "successCondition"),
        ({"queries": [{"name": "e", "query": "up", "successCondition": "value < 1"}]}, "successCondition"),
        ({"queries": [{"name": "e", "query": "up", "successCondition": "result =< 1"}]}, "successCondition"),
        (
            {"queries": [{"name": "e", "query": "up", "successCondition": "result < 1 or 1"}]},
            "successCondition",
        ),
        ({"queries": [{"name": "E_1", "query": "up", "successCondition": "result < 1"}]}, "name"),
        ({"queries": [{"name": "e", "query": "", "successCondition": "result < 1"}]}, "query"),
        ({"queries": []}, "queries"),
        ({"queries": [_analysis()["queries"][0]] * 2}, "distinct names"),
        ({"prometheusAddress": "prometheus:9090"}, "prometheusAddress"),
        ({"prometheusAddress": "http://prom:9090/?q=1"}, "prometheusAddress"),
        ({"intervalSeconds": 0}, "intervalSeconds"),
        ({"durationSeconds": -1}, "durationSeconds"),
        ({"failureLimit": -1}, "failureLimit"),
    ],
)
def test_the_spec_refuses_a_bad_analysis_naming_the_field(changes: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        Analysis.model_validate(_analysis(**changes))


def test_a_valid_analysis_and_its_defaults() -> None:
    parsed = Analysis.model_validate(_analysis(prometheusAddress="https://prom.monitoring:9090/prom"))
    assert (parsed.interval_seconds, parsed.duration_seconds, parsed.failure_limit) == (10, 60, 0)
    assert parsed.prometheus_address == "https://prom.monitoring:9090/prom"


def test_an_unreachable_prometheus_is_a_failed_query_not_an_exception() -> None:
    # A port the kernel gave us and we closed: nothing listens there now.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    address = f"http://127.0.0.1:{port}"
    answers = asyncio.run(measure(Measurement("v2/0/0", address, (("a", "up"), ("b", "vector(1)")), 2.0)))
    assert len(answers) == 2
    for answer in answers:
        assert answer.values == ()
        assert answer.error is not None
        assert answer.error.startswith(f"Prometheus at {address} unreachable: ")


def test_a_condition_outside_the_one_form_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"successCondition 'result ~ 1' is not 'result <op> <number>'"):
        parse_condition("result ~ 1")


def test_a_long_error_is_cut_to_what_the_status_holds() -> None:
    assert len(judge("q", QueryAnswer(error="x" * 5000), "result > 0").message) == 1024
