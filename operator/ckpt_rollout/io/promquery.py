"""Prometheus instant queries for spec.strategy.analysis: one measurement's queries at once,
each answer (values or why there are none) for the machine to judge. Never raises: an
unreachable or refusing Prometheus is a failed query, which the failureLimit counts.

Only addresses the operator allows get here (domain.analysis.prometheus_refusal), and a
redirect is an answer, not followed: it could lead anywhere. What a reply says in words goes to
the operator's log, never into the CR's status."""

import asyncio
import json
import logging

import aiohttp

from ckpt_rollout.domain.analysis import parse_reply
from ckpt_rollout.domain.plan import Measurement
from ckpt_rollout.domain.world import QueryAnswer

log = logging.getLogger(__name__)
_LOGGED_ERROR = 1000  # characters of a reply's error text in the log


async def measure(measurement: Measurement) -> tuple[QueryAnswer, ...]:
    timeout = aiohttp.ClientTimeout(total=measurement.timeout_s)
    # A session per measurement: one every intervalSeconds (>= 1 s), so nothing to keep open.
    async with aiohttp.ClientSession(timeout=timeout) as session:
        answers = await asyncio.gather(
            *(instant_query(session, measurement.address, promql) for _, promql in measurement.queries)
        )
    return tuple(answers)


async def instant_query(session: aiohttp.ClientSession, address: str, promql: str) -> QueryAnswer:
    url = f"{address.rstrip('/')}/api/v1/query"
    try:
        async with session.get(url, params={"query": promql}, allow_redirects=False) as resp:
            text = await resp.text()
            status = resp.status
    except TimeoutError:
        return QueryAnswer(error=f"Prometheus at {address} did not answer in time")
    except aiohttp.ClientError as exc:
        return QueryAnswer(error=f"Prometheus at {address} unreachable: {exc or type(exc).__name__}")
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    answer = parse_reply(status, body)
    if answer.error is not None and isinstance(body, dict) and body.get("error"):
        log.warning("Prometheus at %s refused %r: %s", address, promql, str(body["error"])[:_LOGGED_ERROR])
    return answer
