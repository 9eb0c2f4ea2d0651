"""The smoke check after a load (the request's `health_check`): does the engine, holding the new
weights, still answer sensibly? Checksums prove the bytes are the published ones, not that they
are good: a diverged training step (NaN weights) or a wrong export loads cleanly and serves
garbage.

The verdicts are pure functions of what the engine answered, so each rule is table-tested; each
engine's `smoke` method (engines/) gets the answer its own way and hands it to one of them.
`run_check` bounds a probe by the request's timeout: an engine too slow to answer fails.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass

from ckpt_agent.common.errors import LoadError
from ckpt_api.manifest import ReferenceRecord
from ckpt_api.vocabulary import HealthCheckOutcome

# What an OpenAI-compatible server (and SGLang's finish_reason.type) says when a generation
# ended on its own ("stop": an end token or stop string) or on its token budget ("length").
FINISHED = ("stop", "length")
PREFIX = "smoke check: "
# An engine call's own limit, past the check's timeout: the check's bound (run_check) is the
# one that ends a slow answer, so it reads "no answer within Ns" whichever engine it was.
CALL_GRACE_S = 1.0


@dataclass(frozen=True)
class Verdict:
    passed: bool | None  # None: the engine has nothing to check (skipped)
    message: str


@dataclass(frozen=True)
class CheckResult:
    verdict: Verdict
    seconds: float


def outcome_of(verdict: Verdict) -> HealthCheckOutcome:
    """The verdict as the ckpt_agent_health_checks_total{result} label."""
    if verdict.passed is None:
        return HealthCheckOutcome.SKIPPED
    return HealthCheckOutcome.PASSED if verdict.passed else HealthCheckOutcome.FAILED


def passed(message: str) -> Verdict:
    return Verdict(True, PREFIX + message)


def failed(message: str) -> Verdict:
    return Verdict(False, PREFIX + message)


def skipped(why: str) -> Verdict:
    return Verdict(None, PREFIX + "skipped: " + why)


def _number(value: float) -> str:
    return "NaN" if math.isnan(value) else f"{value:.6g}"


def check_outputs(outputs: Sequence[float], reference: ReferenceRecord | None) -> Verdict:
    """The reference model's forward pass: every output finite and, when the version's manifest
    publishes a reference, each within its atol of it."""
    if not outputs:
        return failed("the forward pass returned no outputs")
    bad = [i for i, v in enumerate(outputs) if not math.isfinite(v)]
    if bad:
        more = f" ({len(bad)} of {len(outputs)} outputs are not finite)" if len(bad) > 1 else ""
        return failed(f"output {bad[0]} is {_number(outputs[bad[0]])}{more}")
    if reference is None:
        return passed(f"{len(outputs)} outputs, all finite (the manifest publishes no reference)")
    if len(outputs) != len(reference.outputs):
        return failed(f"{len(outputs)} outputs, the published reference has {len(reference.outputs)}")
    diffs = [abs(v - r) for v, r in zip(outputs, reference.outputs, strict=True)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    if diffs[worst] > reference.atol:
        return failed(
            f"output {worst} is {_number(outputs[worst])}, the published reference "
            f"{_number(reference.outputs[worst])} (off by {diffs[worst]:.3g}, atol {reference.atol:g})"
        )
    return passed(
        f"{len(outputs)} outputs, finite and within atol {reference.atol:g} of the published "
        f"reference (largest difference {diffs[worst]:.3g})"
    )


def check_generation(text: object, finish_reason: object, seconds: float) -> Verdict:
    """A short generation: some text, and the engine says it finished."""
    took = f"in {seconds:.1f}s"
    if not isinstance(text, str):
        return failed(f"generation returned no text ({text!r:.80}) {took}")
    if not text.strip():
        return failed(f"generation returned empty text {took}")
    if finish_reason not in FINISHED:
        return failed(f"generation did not finish (finish reason {finish_reason!r:.80}) {took}")
    return passed(f"generated {len(text)} characters {took} (finish reason {finish_reason})")


def completion_choice(reply: object) -> tuple[object, object]:
    """(text, finish reason) of an OpenAI-compatible completions reply's first choice (vLLM's
    and FastDeploy's CompletionResponse); (None, None) for anything else."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return None, None
    return choices[0].get("text"), choices[0].get("finish_reason")


async def run_check(probe: Awaitable[Verdict], timeout_s: float) -> CheckResult:
    """`probe` bounded by `timeout_s`; an engine error or no answer in time is a failed check."""
    started = time.monotonic()
    try:
        verdict = await asyncio.wait_for(probe, timeout_s)
    except TimeoutError:
        verdict = failed(f"no answer within {timeout_s:g}s")
    except LoadError as exc:
        verdict = failed(exc.message)
    return CheckResult(verdict, time.monotonic() - started)
