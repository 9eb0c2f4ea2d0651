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


DEFAULT_HEALTH_CHECK_PROMPT = "The capital of France is"


class HealthCheck(ApiModel):
    """The smoke check each agent runs after applying a version and before its pod is Ready
    again: on failure it puts the previous version back and reports HealthCheckFailed. On by
    default: checksums prove the bytes are the published ones, not that they are good (a NaN
    step, a wrong export); the cost is one forward pass or `maxTokens` generated tokens."""

    enabled: Annotated[bool, Field(description="Run the smoke check after every wave's load")] = True
    prompt: Annotated[
        str,
        Field(
            min_length=1,
            max_length=4096,
            description="LLM engines: the prompt of the short generation (the paddle reference "
            "model runs its fixed input instead)",
        ),
    ] = DEFAULT_HEALTH_CHECK_PROMPT
    max_tokens: Annotated[
        int, Field(ge=1, le=256, description="LLM engines: tokens the generation may produce")
    ] = 8
    timeout_seconds: Annotated[
        int, Field(ge=1, le=600, description="Limit for the check; slower counts as a failure")
    ] = 30


# successCondition's one form, so the operator never evaluates an expression language: the
# measured value against a number.
SUCCESS_CONDITION_PATTERN = r"^result *(<=|>=|==|!=|<|>) *-?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$"
ANALYSIS_QUERY_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
PROMETHEUS_ADDRESS_PATTERN = r"^https?://[^\s/?#]+(/[^\s?#]*)?$"


class AnalysisQuery(ApiModel):
    name: Annotated[
        str,
        Field(
            pattern=ANALYSIS_QUERY_NAME_PATTERN,
            max_length=63,
            description="Names the query in status, events and messages (a DNS label)",
        ),
    ]
    query: Annotated[
        str,
        Field(
            min_length=1,
            max_length=4096,
            # No braces here: the description is in the chart's CRD template too.
            description="PromQL instant query; the placeholders namespace, rollout, version and wave "
            "(the wave's index in status.waves), each inside double curly braces, are replaced "
            "before it is sent",
        ),
    ]
    success_condition: Annotated[
        str,
        Field(
            pattern=SUCCESS_CONDITION_PATTERN,
            max_length=64,
            description="'result <op> <number>', op one of < <= > >= == !=; every sample of the "
            "result must meet it, and no data or NaN fails",
        ),
    ]


class Analysis(ApiModel):
    """Prometheus queries measured for a while after each spec wave's workers settled, before
    the wave completes (Argo Rollouts' analysis with a Prometheus provider). Failed measurements
    beyond failureLimit fail the wave, and the failure policy runs."""

    prometheus_address: Annotated[
        str | None,
        Field(
            pattern=PROMETHEUS_ADDRESS_PATTERN,
            max_length=2048,
            description="Prometheus base URL (http(s)://host:port[/path]); unset: the operator's "
            "--prometheus-url (chart value analysis.prometheusUrl)",
        ),
    ] = None
    interval_seconds: Annotated[int, Field(ge=1, le=3600, description="Between measurements")] = 10
    duration_seconds: Annotated[
        int,
        Field(
            ge=0,
            le=86400,
            description="How long a wave is analyzed; it passes once this has elapsed with at least "
            "max(1, duration / interval) measurements taken",
        ),
    ] = 60
    failure_limit: Annotated[
        int, Field(ge=0, le=1000, description="Failed measurements tolerated; one more fails the wave")
    ] = 0
    queries: Annotated[
        list[AnalysisQuery],
        Field(
            min_length=1,
            max_length=16,
            json_schema_extra={
                "x-kubernetes-validations": [
                    _cel(
                        "self.all(a, self.filter(b, b.name == a.name).size() == 1)",
                        "analysis queries must have distinct names",
                    )
                ]
            },
        ),
    ]

    @field_validator("queries")
    @classmethod
    def _unique_names(cls, queries: list[AnalysisQuery]) -> list[AnalysisQuery]:
        names = [q.name for q in queries]
        if len(set(names)) != len(names):
            raise ValueError("analysis queries must have distinct names")
        return queries


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
        bool,
        Field(
            description="Workers pull tensor bytes from peers: already-updated pods, and members of "
            "their own wave that serve each tensor's bytes onward as they land (pipelined chains; "
            "every reader verifies every tensor)"
        ),
    ] = True
    relay_fanout: Annotated[
        int,
        Field(
            ge=1,
            le=16,
            description="Loads one agent feeds at a time in peer relay (1: chains, each link "
            "carrying each byte once; the source feeds one chain per wave besides)",
        ),
    ] = 1
    max_concurrency: Annotated[
        int, Field(ge=1, le=1024, description="Agents called at once within a wave")
    ] = 64
    health_check: HealthCheck = HealthCheck()
    analysis: Annotated[
        Analysis | None, Field(description="Prometheus analysis after each spec wave; unset: none")
    ] = None

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


class Checks(ApiModel):
    """Checks of a version's bytes beyond their checksums, run by each agent before it applies
    anything (a failure leaves the previous weights serving)."""

    finite: Annotated[
        bool,
        Field(
            description="Refuse a version whose floating tensors hold NaN or Inf (NonFiniteTensor); "
            "one pass over the bytes as they land (FastDeploy pulling by itself cannot run it)"
        ),
    ] = False


# LeaderWorkerSet's own pod labels and annotation (sigs.k8s.io/lws): the default grouping.
LWS_GROUP_KEY_LABEL = "leaderworkerset.sigs.k8s.io/group-key"
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_SIZE_ANNOTATION = "leaderworkerset.sigs.k8s.io/size"
# A label key: an optional DNS-subdomain prefix and "/", then a name.
_LABEL_KEY_PATTERN = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


class ReplicaGroups(ApiModel):
    """Replicas served across several pods (a multi-node engine, e.g. a LeaderWorkerSet): the
    pods of one replica switch as one. Every member's agent stages the version first; only when
    all hold it is the leader's agent called, which updates the engine once for the whole
    replica. Waves, maxFailures and status then count replicas, not pods."""

    model_config = config_with_rules(
        _cel("self.groupLabel != self.leaderLabel", "groupLabel and leaderLabel must differ")
    )

    group_label: Annotated[
        str,
        Field(
            pattern=_LABEL_KEY_PATTERN,
            max_length=317,
            description="Pod label whose value names a pod's replica (LeaderWorkerSet's group-key)",
        ),
    ] = LWS_GROUP_KEY_LABEL
    leader_label: Annotated[
        str,
        Field(
            pattern=_LABEL_KEY_PATTERN,
            max_length=317,
            description="Pod label that marks a replica's leader (with leaderValue)",
        ),
    ] = LWS_WORKER_INDEX_LABEL
    leader_value: Annotated[
        str,
        Field(max_length=63, description="The leaderLabel value of the leader (LeaderWorkerSet's: 0)"),
    ] = "0"
    size: Annotated[
        int | None,
        Field(
            ge=1,
            le=1024,
            description=(
                "Pods per replica, the leader included; unset: each pod's "
                "leaderworkerset.sigs.k8s.io/size annotation. A replica with fewer Running "
                "members, or without its leader, is not switched until it is whole"
            ),
        ),
    ] = None

    @model_validator(mode="after")
    def _labels_differ(self) -> "ReplicaGroups":
        if self.group_label == self.leader_label:
            raise ValueError("groupLabel and leaderLabel must differ")
        return self


# Kubernetes' own rules for a ConfigMap's name (a DNS subdomain) and for its keys.
CONFIGMAP_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
CONFIGMAP_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"


class ConfigMapKeyRef(ApiModel):
    name: Annotated[
        str,
        Field(
            pattern=CONFIGMAP_NAME_PATTERN,
            max_length=253,
            description="ConfigMap in the rollout's namespace",
        ),
    ]
    key: Annotated[
        str,
        Field(
            pattern=CONFIGMAP_KEY_PATTERN,
            max_length=253,
            description="Key of the ConfigMap's data holding the version",
        ),
    ]


class VersionFrom(ApiModel):
    config_map_key_ref: ConfigMapKeyRef


# A digest pins one version's manifest: every version the trainer writes next would fail it.
_PINNED_VERSION_FROM = "source.manifestDigest pins one version's manifest; it cannot be used with versionFrom"


class DeclaredRolloutSpec(ApiModel):
    """The spec as the CR stores it (and the CRD's schema): the version given, or where to read
    it. CheckpointRolloutSpec is what a step works with, its version resolved."""

    model_config = config_with_rules(
        {
            **_cel(
                "has(self.version) != has(self.versionFrom)",
                "exactly one of version and versionFrom must be set",
                "FieldValueRequired",
            ),
            # The error names spec.version, what most manifests lack or got wrong.
            "fieldPath": ".version",
        },
        _cel(
            "!has(self.versionFrom) || !has(self.source.manifestDigest)",
            _PINNED_VERSION_FROM,
        ),
    )

    version: Annotated[
        str | None,
        Field(
            pattern=VERSION_PATTERN,
            max_length=128,
            description="Checkpoint version to roll out, e.g. global_step_1200 (or versionFrom)",
            json_schema_extra={
                "x-kubernetes-validations": [_cel("!self.contains('..')", "version must not contain '..'")]
            },
        ),
    ] = None
    version_from: Annotated[
        VersionFrom | None,
        Field(
            description=(
                "Instead of version: read it from a ConfigMap key in the rollout's namespace, which "
                "a trainer owns and GitOps never lists, so Git can own this CR without reverting "
                "the trainer. The operator watches the ConfigMap: a new value starts a rollout. A "
                "missing ConfigMap or key, or a value that is not a valid version, stalls the "
                "rollout (condition Stalled, reason VersionSourceInvalid) until it is fixed; "
                "surrounding whitespace in the value is ignored."
            )
        ),
    ] = None
    verify_checksum: Annotated[
        bool, Field(description="Verify every tensor's xxh3-128 before applying (FastDeploy semantics)")
    ] = False
    source: Source
    selector: LabelSelector
    agent: AgentEndpoint = AgentEndpoint()
    strategy: Strategy = Strategy()
    failure_policy: FailurePolicy = FailurePolicy()
    timeouts: Timeouts = Timeouts()
    checks: Checks = Checks()
    replica_groups: Annotated[
        ReplicaGroups | None,
        Field(
            description=(
                "Set (even to {}) when one replica is several pods (multi-node SGLang, vLLM or "
                "FastDeploy, usually a LeaderWorkerSet): its defaults are LeaderWorkerSet's labels"
            )
        ),
    ] = None
    paused: Annotated[bool, Field(description="Stop starting new waves until set back to false")] = False

    @field_validator("version", mode="before")
    @classmethod
    def _version(cls, value: Any) -> Any:
        return None if value is None else validate_version(value)

    @model_validator(mode="after")
    def _one_version(self) -> "DeclaredRolloutSpec":
        if (self.version is None) == (self.version_from is None):
            raise ValueError("exactly one of version and versionFrom must be set")
        if self.version_from is not None and self.source.manifest_digest is not None:
            raise ValueError(_PINNED_VERSION_FROM)
        return self


class CheckpointRolloutSpec(DeclaredRolloutSpec):
    """The spec one reconcile step works with: versionFrom resolved into version."""

    version: str
    version_from: None = None
