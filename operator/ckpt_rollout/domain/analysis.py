"""spec.strategy.analysis, the pure parts: a query's placeholders, what a Prometheus instant-query
reply holds, and whether an answer meets its successCondition. The HTTP call is promquery's."""

import math
import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

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
_MAX_ERROR = 300  # of Prometheus's error text, in a status message


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


def parse_reply(status: int, body: Any) -> QueryAnswer:
    """The values of a /api/v1/query reply (a vector's samples, or a scalar), or its error."""
    if not isinstance(body, dict):
        return QueryAnswer(error=f"HTTP {status}: not a Prometheus API reply")
    if body.get("status") != "success":
        kind = body.get("errorType") or f"HTTP {status}"
        return QueryAnswer(error=f"{kind}: {str(body.get('error') or 'no error given')[:_MAX_ERROR]}")
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
