"""spec.strategy.analysis, the pure parts: a query's placeholders, what a Prometheus instant-query
reply holds, and whether an answer meets its successCondition. The HTTP call is promquery's."""

import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from ckpt_api.source_policy import SourceRule, parse_rule
from ckpt_api.spec import SUCCESS_CONDITION_PATTERN
from ckpt_api.status import AnalysisResult
from ckpt_rollout.domain.world import QueryAnswer

_COMPARE: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
    "==": operator.eq,
    "!=": operator.ne,
}
_CONDITION = re.compile(SUCCESS_CONDITION_PATTERN)
_PLACEHOLDER = re.compile(r"\{\{(namespace|rollout|version|wave)\}\}")
_DEFAULT_PORTS = {"http": 80, "https": 443}
# Prometheus's own error kinds: only these are named in status; anything else a reply says stays
# out of it (the CR author reads status, and a reply is not theirs to read).
_ERROR_TYPES = frozenset(
    {"bad_data", "timeout", "canceled", "execution", "internal", "unavailable", "not_found", "not_acceptable"}
)


def render(query: str, values: Mapping[str, str]) -> str:
    """``query`` with {{namespace}}, {{rollout}}, {{version}} and {{wave}} replaced; any other
    braces are PromQL's own (e.g. a label matcher) and stay."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], query)


def parse_condition(condition: str) -> tuple[str, float]:
    """("<=", 0.5) for "result <= 0.5". The spec's pattern admits nothing else."""
    match = _CONDITION.fullmatch(condition.strip())
    if match is None:
        raise ValueError(f"successCondition {condition!r} is not 'result <op> <number>'")
    op = match.group(1)
    return op, float(condition.strip()[len("result") :].strip()[len(op) :])


def allowed_prometheus(prometheus_url: str | None, rules: tuple[SourceRule, ...]) -> tuple[SourceRule, ...]:
    """The addresses a CR's prometheusAddress may name: `rules` (--allowed-prometheus), else the
    operator's own Prometheus (its scheme, host, port and path) and nothing else."""
    if rules or not prometheus_url:
        return rules
    parts = urlsplit(prometheus_url)
    rule = parse_rule(prometheus_url.rstrip("/"))
    port = parts.port or _DEFAULT_PORTS[parts.scheme]
    return (SourceRule(rule.scheme, rule.host, rule.network, port, rule.path),)


def prometheus_refusal(address: str, allowed: tuple[SourceRule, ...]) -> str | None:
    """Why the operator will not query ``address`` (None: it may). A name is matched as a name
    only (a CIDR rule allows addresses written as such), so no name resolves its way in."""
    parts = urlsplit(address)
    try:
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme)
    except ValueError:
        return f"prometheusAddress {address} has an invalid port"
    host = (parts.hostname or "").lower()
    path = parts.path or "/"
    if any(
        r.scheme == parts.scheme and r.port in (None, port) and r.allows_host(host)
        for r in allowed
        if r.allows_path(path)
    ):
        return None
    if not allowed:
        return (
            f"prometheusAddress {address} is not one the operator may query: it queries only its own "
            "--prometheus-url, and none is set (or allow addresses with --allowed-prometheus)"
        )
    return (
        f"prometheusAddress {address} is not one the operator may query "
        f"({', '.join(str(r) for r in allowed)}; --allowed-prometheus adds others)"
    )


def parse_reply(status: int, body: Any) -> QueryAnswer:
    """The values of a /api/v1/query reply (a vector's samples, or a scalar), or its error in
    words of our own: the reply's text never reaches status (its `error` is the operator's log's)."""
    if status in range(300, 400):
        return QueryAnswer(error=f"HTTP {status}: a redirect, which the operator does not follow")
    if not isinstance(body, dict):
        return QueryAnswer(error=f"HTTP {status}: not a Prometheus API reply")
    if body.get("status") != "success":
        kind = body.get("errorType")
        named = f"{kind}, " if kind in _ERROR_TYPES else ""
        logged = "; the operator's log has its message" if body.get("error") else ""
        return QueryAnswer(error=f"Prometheus refused the query ({named}HTTP {status}){logged}")
    data = body.get("data")
    kind = data.get("resultType") if isinstance(data, dict) else None
    result = data.get("result") if isinstance(data, dict) else None
    try:
        if kind == "scalar":
            return QueryAnswer(values=(_number(result),))
        if kind == "vector" and isinstance(result, list):
            return QueryAnswer(values=tuple(_number(sample["value"]) for sample in result))
    except (KeyError, TypeError, ValueError, IndexError):
        return QueryAnswer(error=f"malformed {kind} in the reply")
    if kind == "matrix":
        return QueryAnswer(error="a range vector: the query must be an instant one (drop the [range])")
    return QueryAnswer(error=f"a {kind} result, not a number")


def _number(pair: Any) -> float:
    """A [timestamp, "value"] pair's value ("NaN" and "+Inf" included)."""
    return float(pair[1])


def judge(name: str, answer: QueryAnswer, condition: str) -> AnalysisResult:
    """Whether one query's answer passes: an error, no data or a NaN fails; several samples
    must all meet the condition. ``value`` is the sample that decided."""
    if answer.error is not None:
        return AnalysisResult(name=name, passed=False, message=f"failed: {answer.error}"[:1024])
    if not answer.values:
        return AnalysisResult(name=name, passed=False, message=f"returned no data for {condition}")
    op, threshold = parse_condition(condition)
    for value in answer.values:
        if math.isnan(value):
            return AnalysisResult(name=name, passed=False, message=f"returned NaN for {condition}")
        if not _COMPARE[op](value, threshold):
            message = f"returned {value:g}, which misses {condition}"
            return AnalysisResult(name=name, value=_json(value), passed=False, message=message)
    value = answer.values[0]
    samples = "" if len(answer.values) == 1 else f" (and so do all {len(answer.values)} samples)"
    message = f"returned {value:g}, which meets {condition}{samples}"
    return AnalysisResult(name=name, value=_json(value), passed=True, message=message)


def _json(value: float) -> float | None:
    """JSON (so the CR's status) has no infinities; the message still says "inf"."""
    return value if math.isfinite(value) else None
