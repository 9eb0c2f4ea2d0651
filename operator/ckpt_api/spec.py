"""CheckpointRollout spec. Every rule here is mirrored in the CRD (schema or CEL) so the
apiserver rejects at ``kubectl apply`` what these models reject in Python."""

from enum import StrEnum
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator

from ckpt_api.base import ApiModel, config_with_rules
from ckpt_api.constants import (
    DEFAULT_AGENT_PORT,
    DIGEST_PATTERN,
    MAX_WAVES,
    SOURCE_SCHEMES,
    SOURCE_URI_PATTERN,
    VERSION_PATTERN,
)
from ckpt_api.versions import parse_percent, validate_version

IntOrString = int | str
# Bounded so the apiserver's CEL cost estimate for the wave rules stays small.
WaveTarget = Annotated[IntOrString, Field(json_schema_extra={"maxLength": 4})]

# CEL for the apiserver; the Python validators below state the same rules.
_WAVE_ITEMS_RULE = (
    "self.all(w, type(w) == int ? w >= 1 : (type(w) == string && w.matches('^(100|[1-9][0-9]?)%$')))"
)
_WAVES_INTS_RULE = (
    "self.filter(w, type(w) == int).isSorted() && "
    "self.filter(w, type(w) == int).all(a, self.filter(b, type(b) == int && b == a).size() == 1)"
)
_WAVES_PERCENTS_RULE = (
    "self.filter(w, type(w) == string).map(w, int(w.substring(0, w.size() - 1))).isSorted() && "
    "self.filter(w, type(w) == string).all(a, self.filter(b, b == a).size() == 1)"
)
_WAVES_ORDER_RULE = (
    "self.filter(w, type(w) == string).all(s, self.indexOf(s) >= self.filter(w, type(w) == int).size())"
)
_SELECTOR_RULE = (
    "(has(self.matchLabels) && size(self.matchLabels) > 0) || "
    "(has(self.matchExpressions) && size(self.matchExpressions) > 0)"
)
_MAX_FAILURES_RULE = (
    "type(self) == int ? self >= 0 : (type(self) == string && self.matches('^(100|[1-9]?[0-9])%$'))"
)


def _cel(rule: str, message: str, reason: str = "FieldValueInvalid") -> dict[str, str]:
    return {"rule": rule, "message": message, "reason": reason}


class SelectorOperator(StrEnum):
    IN = "In"
    NOT_IN = "NotIn"
    EXISTS = "Exists"
    DOES_NOT_EXIST = "DoesNotExist"


class SelectorRequirement(ApiModel):
    key: Annotated[str, Field(min_length=1, max_length=317)]
    operator: SelectorOperator
    values: list[str] | None = None

    @model_validator(mode="after")
    def _values_match_operator(self) -> "SelectorRequirement":
        needs_values = self.operator in (SelectorOperator.IN, SelectorOperator.NOT_IN)
        if needs_values and not self.values:
            raise ValueError(f"selector operator {self.operator.value} needs non-empty values")
        if not needs_values and self.values:
            raise ValueError(f"selector operator {self.operator.value} takes no values")
        return self


class LabelSelector(ApiModel):
    """metav1.LabelSelector; must select something, or a rollout would target nothing (or all)."""

    model_config = config_with_rules(
        _cel(_SELECTOR_RULE, "selector must have matchLabels or matchExpressions", "FieldValueRequired")
    )

    match_labels: dict[str, str] | None = None
    match_expressions: list[SelectorRequirement] | None = None

    @model_validator(mode="after")
    def _non_empty(self) -> "LabelSelector":
        if not self.match_labels and not self.match_expressions:
            raise ValueError("selector must have matchLabels or matchExpressions")
        return self


class Source(ApiModel):
    uri: Annotated[
        str,
        Field(
            pattern=SOURCE_URI_PATTERN,
            max_length=2048,
            description="Where agents pull from: mooncake://host:port, http(s)://..., file:///path",
        ),
    ]
    manifest_digest: Annotated[
        str | None,
        Field(pattern=DIGEST_PATTERN, description="Optional pin: sha256 of the version's manifest.json"),
    ] = None

    @field_validator("uri", mode="before")
    @classmethod
    def _scheme(cls, value: Any) -> Any:
        if isinstance(value, str):
            scheme, sep, rest = value.partition("://")
            if not sep or scheme not in SOURCE_SCHEMES:
                raise ValueError(
                    f"source uri {value!r} must start with one of "
                    + ", ".join(f"{s}://" for s in SOURCE_SCHEMES)
                )
            if not rest:
                raise ValueError(f"source uri {value!r} has no host or path")
        return value

    @field_validator("manifest_digest", mode="before")
    @classmethod
    def _digest(cls, value: Any) -> Any:
        if isinstance(value, str) and not value.startswith("sha256:"):
            raise ValueError("manifestDigest must be 'sha256:' followed by 64 lowercase hex digits")
        return value


class AgentEndpoint(ApiModel):
    port: Annotated[int, Field(ge=1, le=65535)] = DEFAULT_AGENT_PORT


class FailureAction(StrEnum):
    ROLLBACK = "Rollback"
    HALT = "Halt"


class Strategy(ApiModel):
    model_config = config_with_rules(
        _cel(
            "!has(self.pauseAfterWave) || !has(self.waves) || "
            "self.pauseAfterWave.all(i, i < size(self.waves) - 1)",
            "pauseAfterWave indexes must name a wave before the last one",
        )
    )

    # Default: one canary, then everyone. A canary catches a bad checkpoint on one pod; more
    # default waves would slow the every-few-minutes RL cadence for little extra safety.
    waves: Annotated[
        list[WaveTarget],
        Field(
            min_length=1,
            max_length=MAX_WAVES,
            description=(
                "Cumulative targets per wave: pod counts (ints >= 1) first, then percents "
                "('1%'..'100%'), each strictly increasing. The last wave always covers every "
                "selected pod."
            ),
            json_schema_extra={
                "x-kubernetes-validations": [
                    _cel(_WAVE_ITEMS_RULE, "each wave is an int >= 1 or a percent '1%'..'100%'"),
                    _cel(_WAVES_INTS_RULE, "wave counts must be strictly increasing"),
                    _cel(_WAVES_PERCENTS_RULE, "wave percents must be strictly increasing"),
                    _cel(_WAVES_ORDER_RULE, "wave counts must come before wave percents"),
                ]
            },
        ),
    ] = [1, "100%"]
    pause_after_wave: Annotated[
        list[Annotated[int, Field(ge=0, le=MAX_WAVES - 1)]],
        Field(
            max_length=MAX_WAVES,
            description="0-based wave indexes after which the rollout pauses for promote",
        ),
    ] = []
    pause_duration_seconds: Annotated[
        int,
        Field(
            ge=0,
            description="How long a pauseAfterWave pause lasts; 0 waits for promote",
        ),
    ] = 0
    peer_relay: Annotated[
        bool, Field(description="Workers of later waves pull from already-updated peers")
    ] = True
    max_concurrency: Annotated[
        int, Field(ge=1, le=1024, description="Agents called at once within a wave")
    ] = 64

    @field_validator("waves")
    @classmethod
    def _waves(cls, waves: list[WaveTarget]) -> list[WaveTarget]:
        counts: list[int] = []
        percents: list[int] = []
        for i, wave in enumerate(waves):
            if isinstance(wave, bool):
                raise ValueError(f"wave {i} is a boolean; use an int >= 1 or a percent")
            if isinstance(wave, int):
                if wave < 1:
                    raise ValueError(f"wave {i} is {wave}; pod counts must be >= 1")
                if percents:
                    raise ValueError(f"wave {i} ({wave}) is a count after a percent; counts come first")
                if counts and wave <= counts[-1]:
                    raise ValueError(f"wave counts must be strictly increasing: {counts[-1]} then {wave}")
                counts.append(wave)
            else:
                try:
                    pct = parse_percent(wave)
                except ValueError as exc:
                    raise ValueError(f"wave {i}: {exc}") from None
                if percents and pct <= percents[-1]:
                    raise ValueError(
                        f"wave percents must be strictly increasing: {percents[-1]}% then {pct}%"
                    )
                percents.append(pct)
        return waves

    @field_validator("pause_after_wave")
    @classmethod
    def _unique_pauses(cls, pauses: list[int]) -> list[int]:
        if len(set(pauses)) != len(pauses):
            raise ValueError("pauseAfterWave lists a wave twice")
        return pauses

    @model_validator(mode="after")
    def _pauses_inside_waves(self) -> "Strategy":
        last = len(self.waves) - 1
        for index in self.pause_after_wave:
            if index >= last:
                raise ValueError(
                    f"pauseAfterWave {index} must name a wave before the last one (0..{last - 1})"
                )
        return self


class FailurePolicy(ApiModel):
    max_failures: Annotated[
        IntOrString,
        Field(
            description="Failed workers tolerated per rollout: an int >= 0 or a percent of pods",
            json_schema_extra={
                "maxLength": 4,
                "x-kubernetes-validations": [
                    _cel(_MAX_FAILURES_RULE, "maxFailures is an int >= 0 or a percent '0%'..'100%'")
                ],
            },
        ),
    ] = 0
    on_failure: FailureAction = FailureAction.ROLLBACK

    @field_validator("max_failures")
    @classmethod
    def _max_failures(cls, value: IntOrString) -> IntOrString:
        if isinstance(value, bool):
            raise ValueError("maxFailures is a boolean; use an int >= 0 or a percent")
        if isinstance(value, int):
            if value < 0:
                raise ValueError(f"maxFailures is {value}; it must be >= 0")
            return value
        parse_percent(value, allow_zero=True)
        return value


class Timeouts(ApiModel):
    model_config = config_with_rules(
        _cel(
            "self.progressDeadlineSeconds >= self.workerSeconds",
            "progressDeadlineSeconds must be >= workerSeconds",
        )
    )

    worker_seconds: Annotated[int, Field(ge=1, le=86400, description="Limit for one worker's load")] = 600
    progress_deadline_seconds: Annotated[
        int,
        Field(ge=1, le=604800, description="Limit for the whole rollout, paused time excluded"),
    ] = 1800

    @model_validator(mode="after")
    def _deadline_covers_worker(self) -> "Timeouts":
        if self.progress_deadline_seconds < self.worker_seconds:
            raise ValueError(
                f"progressDeadlineSeconds ({self.progress_deadline_seconds}) must be >= "
                f"workerSeconds ({self.worker_seconds})"
            )
        return self


class CheckpointRolloutSpec(ApiModel):
    version: Annotated[
        str,
        Field(
            pattern=VERSION_PATTERN,
            max_length=128,
            description="Checkpoint version to roll out, e.g. global_step_1200",
            json_schema_extra={
                "x-kubernetes-validations": [_cel("!self.contains('..')", "version must not contain '..'")]
            },
        ),
    ]
    verify_checksum: Annotated[
        bool, Field(description="Verify every tensor's xxh3-128 before applying (FastDeploy semantics)")
    ] = False
    source: Source
    selector: LabelSelector
    agent: AgentEndpoint = AgentEndpoint()
    strategy: Strategy = Strategy()
    failure_policy: FailurePolicy = FailurePolicy()
    timeouts: Timeouts = Timeouts()
    paused: Annotated[bool, Field(description="Stop starting new waves until set back to false")] = False

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        return validate_version(value)
