"""CheckpointRollout status: what users, kubectl, kstatus and a restarted operator read."""

from typing import Annotated

from pydantic import ConfigDict, Field

from ckpt_api.base import ApiModel
from ckpt_api.vocabulary import AnalysisPhase, ConditionStatus, Phase, WaveKind, WavePhase, WorkerPhase


class Condition(ApiModel):
    """metav1.Condition."""

    type: Annotated[str, Field(min_length=1, max_length=316)]
    status: ConditionStatus
    reason: Annotated[str, Field(min_length=1, max_length=1024)]
    message: Annotated[str, Field(max_length=32768)] = ""
    last_transition_time: str
    observed_generation: Annotated[int | None, Field(ge=0)] = None


class WorkerStatus(ApiModel):
    """One pod's outcome, written by its agent (push) or by the operator (pull fallback)."""

    version: str | None = None
    phase: WorkerPhase = WorkerPhase.PENDING
    reason: str | None = None
    message: str | None = None
    checksum_verified: bool | None = None
    bytes: Annotated[int | None, Field(ge=0)] = None
    bytes_from_peers: Annotated[
        int | None, Field(ge=0, description="Of the bytes pulled, those from peers (the rest: the source)")
    ] = None
    seconds: Annotated[float | None, Field(ge=0)] = None
    last_transition_time: str | None = None
    live_version: Annotated[
        str | None,
        Field(description="What the pod serves now: after a failed load, still the previous version"),
    ] = None
    wave: Annotated[
        int | None,
        Field(ge=0, description="Index in status.waves of the call; one past the last: the rollback"),
    ] = None
    uid: Annotated[str | None, Field(description="UID of the CheckpointRollout that made the call")] = None
    manifest_digest: Annotated[
        str | None,
        Field(description="Digest (sha256:...) of the manifest the pod loaded, in an Updated entry"),
    ] = None
    pod_uid: Annotated[
        str | None,
        Field(
            alias="podUID",
            description="UID of the pod the agent runs in: an entry of an earlier pod of the same name "
            "is ignored",
        ),
    ] = None


class AnalysisResult(ApiModel):
    """One query's part of the last measurement."""

    name: str
    value: Annotated[float | None, Field(description="The sample that decided (None: no number)")] = None
    passed: bool
    message: Annotated[str, Field(max_length=1024)] = ""


class AnalysisStatus(ApiModel):
    """A wave's analysis: counts and the last measurement only (the history is in events and in
    Prometheus itself), so the status stays small and a restarted operator resumes the count."""

    phase: AnalysisPhase = AnalysisPhase.RUNNING
    started_at: str | None = None
    measured_at: Annotated[str | None, Field(description="When the last measurement was taken")] = None
    completed_at: str | None = None
    measurements: Annotated[int, Field(ge=0)] = 0
    failed_measurements: Annotated[int, Field(ge=0)] = 0
    results: list[AnalysisResult] = []
    message: Annotated[str | None, Field(max_length=1024)] = None


class WaveStatus(ApiModel):
    """Membership and progress of one wave: persisted so a restarted operator neither skips a
    wave nor calls a worker twice for the same version."""

    index: Annotated[int, Field(ge=0)]
    kind: WaveKind = WaveKind.SPEC
    spec_index: Annotated[int | None, Field(ge=0, description="Index in spec.strategy.waves")] = None
    target: Annotated[int, Field(ge=0, description="Cumulative pods updated after this wave")]
    pods: list[str] = []
    called: Annotated[list[str], Field(description="Pods already sent update_weights")] = []
    phase: WavePhase = WavePhase.RUNNING
    updated: Annotated[int, Field(ge=0, description="Pods updated, folded out of workers")] = 0
    failed: Annotated[int, Field(ge=0)] = 0
    gone: Annotated[int, Field(ge=0, description="Members that disappeared mid-wave")] = 0
    replaced: Annotated[
        list[str],
        Field(
            description="Members that went away before they loaded: a selected pod no wave had "
            "taken took each one's place in pods"
        ),
    ] = []
    bytes_from_source: Annotated[
        int | None, Field(ge=0, description="Bytes the updated members pulled from the source")
    ] = None
    bytes_from_peers: Annotated[
        int | None, Field(ge=0, description="Bytes the updated members pulled from peers (relay)")
    ] = None
    started_at: str | None = None
    completed_at: str | None = None
    analysis: Annotated[
        AnalysisStatus | None, Field(description="spec.strategy.analysis of this wave, once it began")
    ] = None


class RollbackStatus(ApiModel):
    """Returning updated workers to previousVersion after a failure or an abort."""

    version: str
    reason: str
    pods: list[str] = []
    called: list[str] = []
    phase: WavePhase = WavePhase.RUNNING
    started_at: str | None = None
    completed_at: str | None = None


class CheckpointRolloutStatus(ApiModel):
    # Tolerate fields a newer operator added, so an older reader still parses the status.
    model_config = ConfigDict(**{**ApiModel.model_config, "extra": "ignore"})

    phase: Phase | None = None
    observed_generation: int | None = None
    target_version: str | None = None
    stable_version: str | None = None
    previous_version: str | None = None
    manifest_digests: Annotated[
        dict[str, str],
        Field(
            description="Manifest digest of the versions a rollback may return to (stableVersion, "
            "previousVersion) and of the target, as spec.source.manifestDigest pinned it or the agents "
            "reported it; a rollback is pinned to its version's entry, unpinned when it has none"
        ),
    ] = {}
    current_wave: int | None = None
    total_waves: int | None = None
    replicas: int | None = None
    updated_replicas: int | None = None
    failed_replicas: int | None = None
    wave_progress: Annotated[
        str | None, Field(description='Spec waves completed of all, e.g. "2/3" (for kubectl get)')
    ] = None
    rolled_back_replicas: int | None = None
    conditions: list[Condition] = []
    workers: dict[str, WorkerStatus] = {}
    waves: list[WaveStatus] = []
    rollback: RollbackStatus | None = None
    retried: Annotated[
        str | None, Field(description="The retry annotation's value this rollout last acted on")
    ] = None
    promote_at_start: Annotated[
        str | None,
        Field(
            description="The promote annotation's value when this rollout started: a bare wave index "
            "still equal to it promoted an earlier rollout, and promotes nothing now"
        ),
    ] = None
    abort_at_start: Annotated[
        str | None,
        Field(
            description="The abort annotation's value when this rollout started: a bare version "
            "still equal to it aborted an earlier rollout of that version, and aborts nothing now"
        ),
    ] = None
    superseded_version: Annotated[
        str | None, Field(description="The in-flight version this rollout replaced")
    ] = None
    started_at: str | None = None
    completed_at: str | None = None
    paused_seconds: Annotated[float | None, Field(ge=0)] = None
    paused_at: str | None = None
    message: str | None = None
