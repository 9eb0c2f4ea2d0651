"""The smoke check's verdicts (ckpt_agent.pipeline.smoke): what each engine answer passes, fails or skips,
and the message that says why; a probe too slow, or one that errors, fails."""

from __future__ import annotations

import asyncio
import math

import pytest

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.pipeline.smoke import (
    Verdict,
    check_generation,
    check_outputs,
    completion_choice,
    outcome_of,
    run_check,
    skipped,
)
from ckpt_api.manifest import ReferenceRecord
from ckpt_api.vocabulary import HealthCheckOutcome

NAN, INF = math.nan, math.inf
REF = ReferenceRecord(outputs=[0.5, -1.0, 2.0], atol=0.01)


@pytest.mark.parametrize(
    ("outputs", "reference", "passed", "message"),
    [
        (
            [0.5, -1.0, 2.0],
            None,
            True,
            "smoke check: 3 outputs, all finite (the manifest publishes no reference)",
        ),
        ([0.5, -1.0, 2.0], REF, True, "within atol 0.01 of the published reference (largest difference 0)"),
        ([0.505, -1.0, 1.995], REF, True, "largest difference 0.005"),
        ([0.5, -1.0, NAN], REF, False, "smoke check: output 2 is NaN"),
        ([NAN, INF, 1.0], None, False, "smoke check: output 0 is NaN (2 of 3 outputs are not finite)"),
        ([0.5, -INF, 2.0], REF, False, "smoke check: output 1 is -inf"),
        ([], REF, False, "smoke check: the forward pass returned no outputs"),
        ([0.5, -1.0], REF, False, "smoke check: 2 outputs, the published reference has 3"),
        (
            [0.5, -1.0, 2.5],
            REF,
            False,
            "smoke check: output 2 is 2.5, the published reference 2 (off by 0.5, atol 0.01)",
        ),
        ([0.52, -1.0, 2.0], REF, False, "output 0 is 0.52"),
    ],
    ids=[
        "finite-no-reference",
        "equal-to-reference",
        "within-atol",
        "nan",
        "nan-and-inf-counted",
        "negative-inf",
        "no-outputs",
        "wrong-length",
        "wrong-export",
        "just-past-atol",
    ],
)
def test_forward_pass_verdicts(
    outputs: list[float], reference: ReferenceRecord | None, passed: bool, message: str
) -> None:
    verdict = check_outputs(outputs, reference)
    assert verdict.passed is passed
    assert message in verdict.message, verdict.message


@pytest.mark.parametrize(
    ("text", "finish", "passed", "message"),
    [
        (" Paris.", "stop", True, "smoke check: generated 7 characters in 0.4s (finish reason stop)"),
        (" Paris. It is", "length", True, "finish reason length"),
        ("", "length", False, "smoke check: generation returned empty text in 0.4s"),
        ("  \n", "stop", False, "generation returned empty text"),
        (None, None, False, "smoke check: generation returned no text (None) in 0.4s"),
        (42, "stop", False, "generation returned no text (42)"),
        (" Paris", "abort", False, "smoke check: generation did not finish (finish reason 'abort') in 0.4s"),
        (" Paris", None, False, "did not finish (finish reason None)"),
    ],
    ids=["stop", "length", "empty", "blank", "no-text", "not-a-string", "aborted", "no-finish-reason"],
)
def test_generation_verdicts(text: object, finish: object, passed: bool, message: str) -> None:
    verdict = check_generation(text, finish, 0.4)
    assert verdict.passed is passed
    assert message in verdict.message, verdict.message


@pytest.mark.parametrize(
    ("reply", "choice"),
    [
        ({"choices": [{"index": 0, "text": " Paris", "finish_reason": "stop"}]}, (" Paris", "stop")),
        ({"choices": [{"text": "a"}, {"text": "b"}]}, ("a", None)),
        ({"choices": []}, (None, None)),
        ({"choices": "nope"}, (None, None)),
        ({"error": {"message": "bad"}}, (None, None)),
        ([1, 2], (None, None)),
        (None, (None, None)),
    ],
    ids=["openai", "first-choice", "no-choices", "choices-not-a-list", "error-envelope", "a-list", "none"],
)
def test_completion_replies(reply: object, choice: tuple[object, object]) -> None:
    assert completion_choice(reply) == choice


@pytest.mark.parametrize(
    ("verdict", "outcome"),
    [
        (Verdict(True, ""), HealthCheckOutcome.PASSED),
        (Verdict(False, ""), HealthCheckOutcome.FAILED),
        (skipped("no model"), HealthCheckOutcome.SKIPPED),
    ],
)
def test_outcome_labels(verdict: Verdict, outcome: HealthCheckOutcome) -> None:
    assert outcome_of(verdict) is outcome


def test_a_skip_says_why() -> None:
    verdict = skipped("a checkpoint-shaped paddle model has no forward pass to probe")
    assert verdict == Verdict(
        None, "smoke check: skipped: a checkpoint-shaped paddle model has no forward pass to probe"
    )


async def test_a_probe_that_does_not_answer_in_time_fails() -> None:
    never = asyncio.Event()

    async def hung() -> Verdict:
        await never.wait()
        raise AssertionError("the event is never set")

    result = await run_check(hung(), 0.05)
    assert result.verdict == Verdict(False, "smoke check: no answer within 0.05s")
    assert result.seconds >= 0.05


async def test_a_probe_whose_engine_errors_fails_with_its_message() -> None:
    async def refused() -> Verdict:
        raise LoadError(Reason.ENGINE_ERROR, "vLLM /v1/completions answered HTTP 503: paused")

    result = await run_check(refused(), 5)
    assert result.verdict == Verdict(False, "smoke check: vLLM /v1/completions answered HTTP 503: paused")


async def test_a_probe_that_answers_is_timed() -> None:
    async def fine() -> Verdict:
        return check_outputs([1.0], None)

    result = await run_check(fine(), 5)
    assert result.verdict.passed is True
    assert 0 <= result.seconds < 5
