"""Invalid CheckpointRollout specs, each with why it is invalid.

One table serves two tests: the pydantic models must reject each case naming the problem, and
the real apiserver must reject each at create time (the CRD schema and CEL rules)."""

import copy
from dataclasses import dataclass
from typing import Any

_VALID_SPEC: dict[str, Any] = {
    "version": "global_step_1200",
    "source": {"uri": "http://ckpt-src.rl.svc:8080"},
    "selector": {"matchLabels": {"app": "rollout-worker"}},
}

# What the apiserver fills in for it (the defaults users can rely on).
_VALID_SPEC_DEFAULTS: dict[str, Any] = {
    "verifyChecksum": False,
    "agent": {"port": 8089},
    "strategy": {
        "waves": [1, "100%"],
        "pauseAfterWave": [],
        "pauseDurationSeconds": 0,
        "peerRelay": True,
        "relayFanout": 1,
        "maxConcurrency": 64,
        "healthCheck": {
            "enabled": True,
            "prompt": "The capital of France is",
            "maxTokens": 8,
            "timeoutSeconds": 30,
        },
    },
    "failurePolicy": {"maxFailures": 0, "onFailure": "Rollback"},
    "timeouts": {"workerSeconds": 600, "progressDeadlineSeconds": 1800},
    "checks": {"finite": False},
    "paused": False,
}


def valid_spec() -> dict[str, Any]:
    """A minimal valid spec, a fresh copy each call (tests change what they get)."""
    return copy.deepcopy(_VALID_SPEC)


def valid_spec_defaults() -> dict[str, Any]:
    """What the apiserver fills in for valid_spec(), a fresh copy each call."""
    return copy.deepcopy(_VALID_SPEC_DEFAULTS)


@dataclass(frozen=True)
class InvalidSpec:
    id: str
    spec: dict[str, Any]
    reason: str
    field: str  # dotted path under spec that the error must name
    match: str  # fragment the Python validation message must contain


def _with(path: str, value: Any) -> dict[str, Any]:
    """valid_spec() with ``path`` (dotted) set to ``value``; the sentinel _DELETE removes it."""
    spec = valid_spec()
    node = spec
    *parents, leaf = path.split(".")
    for key in parents:
        node = node.setdefault(key, {})
    if value is _DELETE:
        node.pop(leaf, None)
    else:
        node[leaf] = value
    return spec


_DELETE = object()

INVALID_SPECS: list[InvalidSpec] = [
    InvalidSpec(
        "health-check-no-tokens",
        _with("strategy.healthCheck", {"maxTokens": 0}),
        "a generation of no tokens checks nothing",
        "strategy.healthCheck.maxTokens",
        "greater than or equal to 1",
    ),
    InvalidSpec(
        "health-check-empty-prompt",
        _with("strategy.healthCheck", {"prompt": ""}),
        "an empty prompt is not a generation an engine accepts",
        "strategy.healthCheck.prompt",
        "at least 1 character",
    ),
    InvalidSpec("version-missing", _with("version", _DELETE), "version is required", "version", "version"),
    InvalidSpec(
        "version-slash",
        _with("version", "step/1200"),
        "a '/' would escape the version directory",
        "version",
        "'/'",
    ),
    InvalidSpec(
        "version-dotdot",
        _with("version", "step..1200"),
        "'..' would escape the version directory",
        "version",
        "'..'",
    ),
    InvalidSpec(
        "version-too-long",
        _with("version", "v" * 129),
        "versions are at most 128 characters",
        "version",
        "128",
    ),
    InvalidSpec(
        "version-leading-dash",
        _with("version", "-step"),
        "versions start with a letter or digit",
        "version",
        "start with",
    ),
    InvalidSpec(
        "waves-empty",
        _with("strategy.waves", []),
        "a rollout needs at least one wave",
        "strategy.waves",
        "at least 1",
    ),
    InvalidSpec(
        "waves-decreasing",
        _with("strategy.waves", [3, 2]),
        "cumulative wave counts must grow",
        "strategy.waves",
        "strictly increasing",
    ),
    InvalidSpec(
        "waves-percent-repeat",
        _with("strategy.waves", [1, "50%", "50%"]),
        "a repeated percent is an empty wave",
        "strategy.waves",
        "strictly increasing",
    ),
    InvalidSpec(
        "waves-zero",
        _with("strategy.waves", [0, "100%"]),
        "a wave of zero pods does nothing",
        "strategy.waves",
        ">= 1",
    ),
    InvalidSpec(
        "waves-percent-over-100",
        _with("strategy.waves", [1, "150%"]),
        "percents are 1..100",
        "strategy.waves",
        "percentage",
    ),
    InvalidSpec(
        "waves-percent-malformed",
        _with("strategy.waves", ["half"]),
        "a wave is an int or a percent",
        "strategy.waves",
        "percentage",
    ),
    InvalidSpec(
        "waves-count-after-percent",
        _with("strategy.waves", ["50%", 3]),
        "counts come before percents",
        "strategy.waves",
        "counts come first",
    ),
    InvalidSpec(
        "max-failures-negative",
        _with("failurePolicy.maxFailures", -1),
        "a failure budget cannot be negative",
        "failurePolicy.maxFailures",
        ">= 0",
    ),
    InvalidSpec(
        "max-failures-percent-malformed",
        _with("failurePolicy.maxFailures", "10 percent"),
        "maxFailures is an int or a percent",
        "failurePolicy.maxFailures",
        "percentage",
    ),
    InvalidSpec(
        "on-failure-unknown",
        _with("failurePolicy.onFailure", "Retry"),
        "onFailure is Rollback or Halt",
        "failurePolicy.onFailure",
        "Rollback",
    ),
    InvalidSpec(
        "timeout-zero",
        _with("timeouts.workerSeconds", 0),
        "timeouts must be positive",
        "timeouts.workerSeconds",
        "greater than or equal to 1",
    ),
    InvalidSpec(
        "deadline-below-worker-timeout",
        _with("timeouts", {"workerSeconds": 900, "progressDeadlineSeconds": 600}),
        "the rollout deadline must leave room for one worker",
        "timeouts",
        "progressDeadlineSeconds",
    ),
    InvalidSpec(
        "source-scheme",
        _with("source.uri", "s3://bucket/ckpt"),
        "unsupported source scheme",
        "source.uri",
        "must start with",
    ),
    InvalidSpec("source-missing", _with("source", _DELETE), "agents need a source", "source", "source"),
    InvalidSpec(
        "digest-not-sha256",
        _with("source.manifestDigest", "md5:abc"),
        "manifestDigest pins a sha256",
        "source.manifestDigest",
        "sha256:",
    ),
    InvalidSpec(
        "digest-short",
        _with("source.manifestDigest", "sha256:abc"),
        "a sha256 digest has 64 hex digits",
        "source.manifestDigest",
        "pattern",
    ),
    InvalidSpec(
        "selector-missing",
        _with("selector", _DELETE),
        "without a selector the rollout targets nothing",
        "selector",
        "selector",
    ),
    InvalidSpec(
        "selector-empty",
        _with("selector", {}),
        "an empty selector would match every pod",
        "selector",
        "matchLabels or matchExpressions",
    ),
    InvalidSpec("agent-port-range", _with("agent.port", 70000), "ports are 1..65535", "agent.port", "65535"),
    InvalidSpec(
        "pause-after-last-wave",
        _with("strategy", {"waves": [1, "100%"], "pauseAfterWave": [1]}),
        "pausing after the last wave has nothing to hold back",
        "strategy",
        "before the last",
    ),
    InvalidSpec(
        "verify-checksum-not-bool",
        _with("verifyChecksum", "maybe"),
        "verifyChecksum is a boolean",
        "verifyChecksum",
        "boolean",
    ),
    InvalidSpec(
        "analysis-condition-not-a-comparison",
        _with(
            "strategy.analysis",
            {
                "queries": [
                    {"name": "errors", "query": "vector(1)", "successCondition": "result < 0.5 || true"}
                ]
            },
        ),
        "a successCondition is 'result <op> <number>', never an expression",
        "strategy.analysis.queries[0].successCondition",
        "should match pattern",
    ),
    InvalidSpec(
        "analysis-query-names-repeated",
        _with(
            "strategy.analysis",
            {
                "queries": [
                    {"name": "errors", "query": "vector(1)", "successCondition": "result < 0.5"},
                    {"name": "errors", "query": "vector(1)", "successCondition": "result < 0.5"},
                ]
            },
        ),
        "status and messages name queries by name",
        "strategy.analysis.queries",
        "distinct names",
    ),
    InvalidSpec(
        "analysis-address-without-scheme",
        _with(
            "strategy.analysis",
            {
                "prometheusAddress": "prometheus:9090",
                "queries": [{"name": "errors", "query": "vector(1)", "successCondition": "result < 0.5"}],
            },
        ),
        "the Prometheus address is an http(s) URL",
        "strategy.analysis.prometheusAddress",
        "should match pattern",
    ),
    InvalidSpec(
        "replica-groups-one-label",
        _with("replicaGroups", {"groupLabel": "role", "leaderLabel": "role"}),
        "one label cannot both name a pod's replica and mark its leader",
        "replicaGroups",
        "must differ",
    ),
    InvalidSpec(
        "replica-groups-size-zero",
        _with("replicaGroups", {"size": 0}),
        "a replica has at least its leader",
        "replicaGroups.size",
        "greater than or equal to 1",
    ),
    InvalidSpec(
        "replica-groups-label-not-a-key",
        _with("replicaGroups", {"groupLabel": "group key"}),
        "the grouping label is a Kubernetes label key",
        "replicaGroups.groupLabel",
        "should match pattern",
    ),
]
