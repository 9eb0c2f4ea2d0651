"""The API models: defaults, and the invalid-spec table the apiserver test reuses."""

import pytest
from pydantic import ValidationError

from ckpt_api.manifest import is_valid_file_name
from ckpt_api.spec import CheckpointRolloutSpec, Strategy
from ckpt_api.versions import parse_percent, validate_version
from ckpt_e2e.testdata import INVALID_SPECS, InvalidSpec, valid_spec, valid_spec_defaults


def test_valid_spec_gets_the_documented_defaults() -> None:
    wire = CheckpointRolloutSpec.model_validate(valid_spec()).to_wire()
    assert wire == {**valid_spec(), **valid_spec_defaults()}


def test_the_invalid_table_is_big_enough_and_ids_are_unique() -> None:
    ids = [case.id for case in INVALID_SPECS]
    assert len(ids) >= 15
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("case", INVALID_SPECS, ids=lambda c: c.id)
def test_invalid_spec_is_rejected_naming_the_problem(case: InvalidSpec) -> None:
    with pytest.raises(ValidationError) as info:
        CheckpointRolloutSpec.model_validate(case.spec)
    message = str(info.value)
    assert case.match in message, f"{case.id}: {case.reason}; got: {message}"
    # The error is located at the offending field, not somewhere vague.
    locations = {".".join(str(p) for p in err["loc"]) for err in info.value.errors()}
    top = case.field.split(".")[0]
    assert any(loc.startswith(top) for loc in locations), locations


@pytest.mark.parametrize(
    "waves",
    [[1], ["100%"], [1, 5, "50%", "100%"], [2, 10], ["10%", "20%"], [1, "25%", "100%"]],
)
def test_accepted_wave_shapes(waves: list[int | str]) -> None:
    assert Strategy.model_validate({"waves": waves}).waves == waves


@pytest.mark.parametrize(
    ("version", "ok"),
    [
        ("global_step_1200", True),
        ("v1.2-rc_3", True),
        ("9", True),
        ("a" * 128, True),
        ("a" * 129, False),
        ("", False),
        (".hidden", False),
        ("a/b", False),
        ("a..b", False),
        ("a b", False),
        (12, False),
    ],
)
def test_validate_version(version: object, ok: bool) -> None:
    if ok:
        assert validate_version(version) == version
    else:
        with pytest.raises(ValueError, match="version"):
            validate_version(version)


def test_max_failures_accepts_zero_percent_and_ints() -> None:
    spec = {**valid_spec(), "failurePolicy": {"maxFailures": "0%", "onFailure": "Halt"}}
    assert CheckpointRolloutSpec.model_validate(spec).failure_policy.max_failures == "0%"
    spec = {**valid_spec(), "failurePolicy": {"maxFailures": 3}}
    assert CheckpointRolloutSpec.model_validate(spec).failure_policy.max_failures == 3


@pytest.mark.parametrize(
    ("check", "value"),
    [
        (validate_version, "v2"),
        (parse_percent, "25%"),
        (is_valid_file_name, "model-00001-of-00002.safetensors"),
    ],
)
def test_a_name_with_a_final_newline_is_refused_where_the_name_is_accepted(check: object, value: str) -> None:
    """Python's `$` also matches before a final newline: each pattern must match the whole text."""

    def accepted(text: str) -> bool:
        try:
            result = check(text)  # type: ignore[operator]
        except ValueError:
            return False
        return result is not False

    assert accepted(value)
    assert not accepted(value + "\n")
