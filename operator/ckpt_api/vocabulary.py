"""Every word the operator, the agent, the CLI and the harness write or compare: phases, states,
reasons, condition types, event reasons, metric label values, annotations, labels and the
leader Lease's name. Defined here once, importable without kopf, aiohttp or a Kubernetes
client; nowhere else in the product is one of these values typed as a literal
(tests/test_vocabulary.py scans for them).

Closed sets are StrEnums, so a member *is* its wire string (``Phase.FAILED == "Failed"``) and
can be written to JSON, compared with what the apiserver returns, or used as a metric label
as is. Several sets share a word ("Failed" is a phase, a worker phase, a wave phase and a
condition type): use the member of the set the field belongs to.
"""

from enum import StrEnum

from ckpt_api.constants import GROUP

# -- CheckpointRollout status ------------------------------------------------------------------


class Phase(StrEnum):
    """status.phase."""

    PENDING = "Pending"
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"


TERMINAL_PHASES = frozenset({Phase.SUCCEEDED, Phase.FAILED, Phase.ROLLED_BACK})
# Terminal phases in which the target version is not live.
FAILED_PHASES = frozenset({Phase.FAILED, Phase.ROLLED_BACK})


class WorkerPhase(StrEnum):
    """status.workers.<pod>.phase."""

    PENDING = "Pending"
    LOADING = "Loading"
    UPDATED = "Updated"
    FAILED = "Failed"


class WavePhase(StrEnum):
    """status.waves[].phase and status.rollback.phase."""

    RUNNING = "Running"
    # A spec wave's workers settled; spec.strategy.analysis is measuring it before it completes.
    ANALYZING = "Analyzing"
    COMPLETED = "Completed"
    FAILED = "Failed"


class AnalysisPhase(StrEnum):
    """status.waves[].analysis.phase."""

    RUNNING = "Running"
    PASSED = "Passed"
    FAILED = "Failed"
    SKIPPED = "Skipped"  # ended by the skip-analysis annotation


class WaveKind(StrEnum):
    """status.waves[].kind."""

    SPEC = "Spec"  # one of spec.strategy.waves
    CATCH_UP = "CatchUp"  # pods a superseded rollout had already updated
    DRIFT = "Drift"  # pods that appeared after the rollout covered the fleet


class ConditionStatus(StrEnum):
    """metav1.Condition status (every Kubernetes condition: ours, pods', nodes', CRDs')."""

    TRUE = "True"
    FALSE = "False"
    UNKNOWN = "Unknown"


class ConditionType(StrEnum):
    """status.conditions[].type, in the order they are listed. Deployment/Argo
    (Progressing, Complete, Failed, Paused) plus kstatus (Ready, Reconciling, Stalled), so
    `kubectl wait`, Argo CD and Flux health checks all work."""

    PROGRESSING = "Progressing"
    COMPLETE = "Complete"
    FAILED = "Failed"
    PAUSED = "Paused"
    READY = "Ready"
    RECONCILING = "Reconciling"
    STALLED = "Stalled"


class RolloutReason(StrEnum):
    """Reasons the operator gives its conditions (and the rollback's reason). A failure caused
    by a worker carries that worker's WorkerReason instead."""

    NO_WORKERS = "NoWorkers"
    SELECTOR_CONFLICT = "SelectorConflict"
    ROLLOUT_STARTED = "RolloutStarted"
    WAVE_STARTED = "WaveStarted"
    ROLLOUT_PAUSED = "RolloutPaused"
    ROLLOUT_RESUMED = "RolloutResumed"
    ROLLOUT_COMPLETED = "RolloutCompleted"
    ROLLING_BACK = "RollingBack"
    ROLLED_BACK = "RolledBack"
    ROLLBACK_FAILED = "RollbackFailed"
    PROGRESS_DEADLINE_EXCEEDED = "ProgressDeadlineExceeded"
    ABORTED = "Aborted"
    WORKER_FAILED = "WorkerFailed"  # a worker failed without saying why
    # spec.versionFrom names a ConfigMap or key that is not there, or a value that is no version.
    VERSION_SOURCE_INVALID = "VersionSourceInvalid"
    VERSION_SOURCE_RESOLVED = "VersionSourceResolved"  # readable again after VersionSourceInvalid
    INVALID_SPEC = "InvalidSpec"  # the spec fails the models (stored before a rule existed)
    SPEC_ACCEPTED = "SpecAccepted"  # valid again after InvalidSpec
    INVALID_SOURCE = "InvalidSource"  # the operator's source policy refuses spec.source.uri
    SOURCE_ALLOWED = "SourceAllowed"  # allowed again after InvalidSource
    ANALYZING = "Analyzing"
    ANALYSIS_FAILED = "AnalysisFailed"


# -- one worker's load ---------------------------------------------------------------------------


class WorkerReason(StrEnum):
    """status.workers.<pod>.reason, the agent's /v1/status last_error.reason and the
    ckpt_agent_loads{reason} label. A call the agent refused carries its ErrorCode instead."""

    LOADING = "Loading"
    LOADED = "Loaded"
    # A replica's follower holds the version where its engine rank reads it, for its leader to
    # switch the replica (a staging call: UpdateWeightsRequest.stage).
    STAGED = "Staged"
    # Written by the agent: the load failed and (unless the weights were lost) the previous
    # version still serves.
    CHECKSUM_MISMATCH = "ChecksumMismatch"
    INCOMPATIBLE_CHECKPOINT = "IncompatibleCheckpoint"
    MANIFEST_DIGEST_MISMATCH = "ManifestDigestMismatch"
    SOURCE_UNREACHABLE = "SourceUnreachable"
    VERSION_NOT_FOUND = "VersionNotFound"
    TRUNCATED_SHARD = "TruncatedShard"
    MANIFEST_TOO_LARGE = "ManifestTooLarge"
    INVALID_VERSION = "InvalidVersion"
    INVALID_MANIFEST = "InvalidManifest"
    # checks.finite: a floating tensor holds NaN or Inf (its checksum may well match).
    NON_FINITE_TENSOR = "NonFiniteTensor"
    # strategy.healthCheck: the loaded version failed its smoke check after apply; the agent put
    # the previous version back (unless the weights were lost).
    HEALTH_CHECK_FAILED = "HealthCheckFailed"
    ENGINE_ERROR = "EngineError"
    INVALID_SOURCE = "InvalidSource"  # the source policy refuses the version's source
    STAGING_FULL = "StagingFull"  # the staging directory's filesystem has no room for the version
    CANCELLED = "Cancelled"
    # Written by the operator: it could not learn the outcome (the worker may or may not have
    # loaded the version), or the agent named no reason.
    WORKER_TIMEOUT = "WorkerTimeout"
    # A replica's follower could not stage the version: its leader was never called.
    MEMBER_FAILED = "MemberFailed"
    AGENT_UNREACHABLE = "AgentUnreachable"
    LOAD_FAILED = "LoadFailed"


class HealthCheckOutcome(StrEnum):
    """The agent's ckpt_agent_health_checks_total{result}: how a load's smoke check ended."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"  # the engine holds nothing to probe (a checkpoint-shaped paddle model)


class AgentState(StrEnum):
    """The agent's /v1/status `state`."""

    IDLE = "idle"
    LOADING = "loading"
    FAILED = "failed"  # the last load failed (the previous weights serve unless weights_lost)


class ErrorCode(StrEnum):
    """`error` of a 4xx/5xx body from the agent, the relay or `ckpt-rollout serve`."""

    INVALID_REQUEST = "InvalidRequest"
    INVALID_VERSION = "InvalidVersion"
    INVALID_PATH = "InvalidPath"
    INVALID_SOURCE = "InvalidSource"  # 403: the agent's --allowed-sources refuses the source
    LOAD_IN_PROGRESS = "LoadInProgress"
    UNAUTHORIZED = "Unauthorized"
    # 503: the agent could not check the caller's token (its TokenReview failed: the apiserver
    # is away); nothing was done, so the caller may simply try again.
    AUTH_UNAVAILABLE = "AuthUnavailable"
    FORBIDDEN = "Forbidden"
    NOT_FOUND = "NotFound"
    NOT_RELAYABLE = "NotRelayable"
    NOT_SUPPORTED = "NotSupported"
    ENGINE_UNAVAILABLE = "EngineUnavailable"


class WeightsReadyReason(StrEnum):
    """Reasons of the pod condition WEIGHTS_READY_CONDITION."""

    LOADING = "Loading"
    LOADED = "Loaded"
    AWAITING_ROLLOUT = "AwaitingRollout"  # serving boot weights no rollout has confirmed
    STAGED = "Staged"  # a replica's follower holds a version its replica has not switched to yet
    WEIGHTS_LOST = "WeightsLost"  # a streamed apply failed and could not be undone


# -- events ----------------------------------------------------------------------------------------


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


class EventReason(StrEnum):
    """Reasons of the Events the operator posts on a CheckpointRollout."""

    ROLLOUT_STARTED = "RolloutStarted"
    SUPERSEDED = "Superseded"
    WAVE_STARTED = "WaveStarted"
    WAVE_COMPLETED = "WaveCompleted"
    PAUSED = "Paused"
    RESUMED = "Resumed"
    WORKER_FAILED = "WorkerFailed"
    # A worker the rollout waits on makes no progress (its agent cannot check the operator's
    # token, cannot be reached; its pod cannot start): the cause, once per pod and cause.
    WORKER_STALLED = "WorkerStalled"
    SELECTOR_CONFLICT = "SelectorConflict"
    DRIFT_CORRECTION = "DriftCorrection"
    ROLLOUT_COMPLETED = "RolloutCompleted"
    ROLLOUT_FAILED = "RolloutFailed"
    ROLLBACK_STARTED = "RollbackStarted"
    ROLLBACK_FAILED = "RollbackFailed"
    ROLLED_BACK = "RolledBack"
    RETRY_IGNORED = "RetryIgnored"
    VERSION_SOURCE_INVALID = "VersionSourceInvalid"
    INVALID_SPEC = "InvalidSpec"
    INVALID_SOURCE = "InvalidSource"
    ANALYSIS_STARTED = "AnalysisStarted"
    ANALYSIS_PASSED = "AnalysisPassed"
    ANALYSIS_FAILED = "AnalysisFailed"
    ANALYSIS_SKIPPED = "AnalysisSkipped"


# -- metric label values ---------------------------------------------------------------------------


class UpdateResult(StrEnum):
    """How the agent answered an update_weights call: ckpt_agent_update_requests{result} and
    the `updates` counters of /v1/status."""

    ACCEPTED = "accepted"
    NOOP = "noop"
    CONFLICT = "conflict"
    REJECTED = "rejected"


class LoadResult(StrEnum):
    """How a load ended: ckpt_agent_loads{result}, ckpt_agent_load_seconds{result} and the
    `updates` counters of /v1/status."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"


class WorkerResult(StrEnum):
    """ckpt_rollout_workers_total{result}: worker outcomes the operator saw."""

    UPDATED = "updated"
    FAILED = "failed"
    ROLLED_BACK = "rolled_back"


# -- names in object metadata ------------------------------------------------------------------

# On a CheckpointRollout, set by `ckpt-rollout promote|abort` (or by hand).
# promote: "<wave index (0-based) promoted past>@<version>"; a bare index counts only if set
# during the rollout it promotes.
PROMOTE_ANNOTATION = f"{GROUP}/promote"
ABORT_ANNOTATION = f"{GROUP}/abort"  # value: the version to abort
RETRY_ANNOTATION = f"{GROUP}/retry"  # value: a new token (e.g. a timestamp) per retry
# "<wave index (0-based)>@<version>": ends that wave's running analysis as Skipped (promote never does).
SKIP_ANALYSIS_ANNOTATION = f"{GROUP}/skip-analysis"

# kopf's bookkeeping on CheckpointRollouts, under our API group rather than kopf.zalando.org.
FINALIZER = f"{GROUP}/finalizer"
KOPF_ANNOTATION_PREFIX = GROUP
KOPF_DIFFBASE_KEY = "last-handled-configuration"

# Pod condition the agent sets; usable as a readiness gate so a pod serving stale or
# half-loaded weights is never Ready.
WEIGHTS_READY_CONDITION = f"{GROUP}/WeightsReady"

# The coordination.k8s.io Lease operator replicas elect a leader on (the chart's RBAC grants
# get/update on this name only).
LEASE_NAME = "ckpt-rollout-operator"

# Recommended labels the chart puts on what it installs.
NAME_LABEL = "app.kubernetes.io/name"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"

# -- Kubernetes' own words we compare with ------------------------------------------------------


class PodPhase(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    UNKNOWN = "Unknown"


class KubeConditionType(StrEnum):
    """Built-in condition types: pods' and nodes' Ready, CRDs' Established."""

    READY = "Ready"
    ESTABLISHED = "Established"
