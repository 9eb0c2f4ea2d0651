"""The agent's HTTP contract: request and response bodies of `/v1/*`, shared by the agent (which
validates and answers with them) and the operator (which builds requests and reads answers).

Wire names are FastDeploy's snake_case, except inside `source` (camelCase, as in the CR's spec).
Requests are strict: JSON types must match exactly (no "true" for true, no 1.0 for 1), and the
nested objects refuse unknown keys, so a misspelt `manifestDigest` is an error instead of a
silently unpinned load. Responses ignore unknown keys: an operator must keep reading the status
of an agent one release ahead of it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, JsonValue

from ckpt_api.constants import DIGEST_PATTERN, SOURCE_SCHEMES, SOURCE_URI_PATTERN, VERSION_PATTERN
from ckpt_api.versions import validate_version
from ckpt_api.vocabulary import AgentState, WorkerPhase, WorkerReason

# DNS-1123 subdomain: what Kubernetes accepts for namespace and object names.
K8S_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
PEER_SCHEMES = ("http", "https", "mooncake")
# Documents check_peer_uri for schema readers; check_peer_uri is what decides.
PEER_URI_PATTERN = r"^(http|https|mooncake)://[^\s/?#]+:[0-9]+/?$"


def check_peer_uri(uri: str) -> str:
    """A peer agent is addressed as scheme://host:port and nothing more (the relay paths are the
    agent's own). Raises ValueError saying what is wrong."""
    parts = urlsplit(uri)
    if parts.scheme not in PEER_SCHEMES or not parts.hostname or parts.port is None:
        raise ValueError(f"a peer is http://host:port or mooncake://host:port, got {uri!r}")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ValueError(f"a peer URI has no path or query: {uri!r}")
    return uri


def _version(value: Any) -> Any:
    # Non-strings are left to the strict str check, so they fail as type errors, not as
    # InvalidVersion (which the agent reports to the CR as a failed update).
    return validate_version(value) if isinstance(value, str) else value


def _source_scheme(value: Any) -> Any:
    # Before the pattern: name the accepted schemes instead of quoting a regular expression.
    if isinstance(value, str):
        scheme, sep, rest = value.partition("://")
        if not sep or scheme not in SOURCE_SCHEMES:
            raise ValueError(
                f"source uri {value!r} must start with one of " + ", ".join(f"{s}://" for s in SOURCE_SCHEMES)
            )
        if not rest:
            raise ValueError(f"source uri {value!r} has no host or path")
    return value


def _peer(value: Any) -> Any:
    return check_peer_uri(value) if isinstance(value, str) else value


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, frozen=True, extra="forbid", validate_by_alias=True)

    def to_wire(self) -> dict[str, Any]:
        """The JSON object sent; unset optionals are left out rather than sent as null."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class _Response(BaseModel):
    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        validate_by_alias=True,
        validate_by_name=True,
        # Defaults are for old agents that lack a field; this agent always sends every field.
        json_schema_serialization_defaults_required=True,
    )

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


# Field before the validator: the other order drops the pattern from the JSON schema (the
# validator still runs first either way).
Version = Annotated[
    str,
    Field(
        pattern=VERSION_PATTERN,
        max_length=128,
        description="Checkpoint version, e.g. global_step_1200 (never '..', never '/')",
    ),
    BeforeValidator(_version),
]


class SourceRef(_Request):
    """Where to load from; the agent's `--source` when the request has none."""

    uri: Annotated[
        str,
        Field(
            pattern=SOURCE_URI_PATTERN,
            max_length=2048,
            description="mooncake://host:port, http(s)://host[:port][/prefix] or file:///path",
        ),
        BeforeValidator(_source_scheme),
    ]
    # Field() as the default, not in Annotated: the pydantic mypy plugin only sees aliases there.
    manifest_digest: str | None = Field(
        None,
        alias="manifestDigest",
        pattern=DIGEST_PATTERN,
        description="Pin: sha256 of the version's manifest.json; a different manifest fails the load",
    )
    peer: Annotated[
        str | None,
        Field(
            max_length=2048,
            description="A peer agent to pull tensor bytes from; the manifest still comes from uri "
            "and every byte is verified against it",
            json_schema_extra={"pattern": PEER_URI_PATTERN},
        ),
        BeforeValidator(_peer),
    ] = None
    relay_while_loading: bool | None = Field(
        None,
        alias="relayWhileLoading",
        description="Other agents read this load while it runs (pipelined relay): verify each tensor "
        "and serve it onward as soon as it matched (staged loads; others serve once complete)",
    )


K8sName = Annotated[str, Field(pattern=K8S_NAME_PATTERN)]


class RolloutRef(_Request):
    """The CheckpointRollout a request serves: the agent reports its outcome there."""

    namespace: K8sName
    name: K8sName
    uid: Annotated[str, Field(min_length=1)]
    wave: Annotated[int, Field(ge=0)]
    report: Annotated[
        bool,
        Field(
            description="false: do not write status.workers.<pod>; the operator pulls /v1/status "
            "instead (N agents patching one CR serialize in the apiserver). The pod's WeightsReady "
            "condition is written either way."
        ),
    ] = True


class LoadChecks(_Request):
    """Checks of the bytes beyond their checksums, run after each tensor is read and before
    anything is applied."""

    finite: Annotated[
        bool,
        Field(
            description="Refuse the load (NonFiniteTensor) if any floating tensor holds NaN or Inf; "
            "checked on the raw bits, BF16 and FP8 included"
        ),
    ] = False


class HealthCheckRequest(_Request):
    """The smoke check to run after the apply, before the engine serves again (the CR's
    strategy.healthCheck); a failure restores the previous version (HealthCheckFailed)."""

    prompt: Annotated[str, Field(min_length=1, max_length=4096, description="LLM engines' prompt")]
    max_tokens: Annotated[int, Field(ge=1, le=256, description="LLM engines' token budget")]
    timeout_seconds: Annotated[int, Field(ge=1, le=600, description="Limit for the check")]


class UpdateWeightsRequest(_Request):
    """`POST /v1/update_weights`."""

    # Unknown top-level keys are ignored, not refused: FastDeploy's clients send theirs
    # (`rsync_config`) to every engine, and the agent stands in for one.
    model_config = ConfigDict(extra="ignore")

    version: Version
    verify_checksum: Annotated[bool, Field(description="Verify every tensor's xxh3-128 before applying")] = (
        False
    )
    source: SourceRef | None = None
    rollout: RolloutRef | None = None
    # Absent: no extra checks (FastDeploy's own clients never send it).
    checks: LoadChecks | None = None
    # Absent: no smoke check after the apply (FastDeploy's own clients never send it).
    health_check: HealthCheckRequest | None = None
    # Absent: only the agent's floor on bytes per second (--min-load-rate) bounds the load.
    deadline_seconds: Annotated[
        int | None,
        Field(
            ge=1,
            le=86400,
            description="Fail the load (SourceUnreachable, previous weights serving) if its bytes are "
            "not all in by then; applying them and the smoke check are not counted",
        ),
    ] = None
    # Absent: keep nothing beyond what the engine keeps by itself.
    retain: Annotated[
        list[Version] | None,
        Field(
            max_length=4,
            description="Versions a follower of a multi-node replica (engine member) keeps staged "
            "beside this one: what its replica's leader may restore while it switches",
        ),
    ] = None
    # Absent: an ordinary load (what every caller but the operator's replica gangs sends).
    stage: Annotated[
        bool | None,
        Field(
            description="true: a multi-node replica's follower (engine member) stages the version for "
            "its leader: reported as Staged, the pod NotReady until a call without stage confirms "
            "it (the replica has switched, or gone back)",
        ),
    ] = None


class CancelLoadRequest(_Request):
    """`POST /v1/cancel_load`: stop the running load (an empty body: whichever it is)."""

    version: Annotated[
        Version | None, Field(description="Cancel only a load of this version (409 if another runs)")
    ] = None


class LoadCancelled(_Response):
    """200 of `/v1/cancel_load`: the load stopped (Cancelled; the previous weights serve)."""

    version: Annotated[str, Field(description="The version whose load was cancelled")]
    ended: Annotated[
        bool, Field(description="The load had ended when this answer was sent (false: still stopping)")
    ]
    live_version: Annotated[str | None, Field(description="The version serving now")]


class UpdateAccepted(_Response):
    """200: the version is live already (noop); 202: the load started, poll `/v1/status`."""

    accepted: bool
    version: str
    noop: Annotated[bool, Field(description="Sent (true) only when nothing was loaded")] = False

    model_config = ConfigDict(json_schema_serialization_defaults_required=False)

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_defaults=True)


class ErrorBody(_Response):
    """Every 4xx and 5xx the agent answers itself: `error` is a CamelCase reason code."""

    error: str
    message: str
    field: Annotated[
        str | None, Field(description="The request field at fault, dotted (source.uri); body for the whole")
    ] = None
    target: Annotated[str | None, Field(description="409 LoadInProgress: the version being loaded")] = None

    model_config = ConfigDict(json_schema_serialization_defaults_required=False)

    def to_wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


class PauseState(_Response):
    """`result` of `/v1/pause`, `/v1/resume` and `/v1/is_paused`: FastDeploy's `{"is_paused"}`
    (is_paused only, at FastDeploy c1b7c083da606ed7f3ac35c2f905dc904f1163b2), plus who holds the
    pause."""

    is_paused: bool
    paused_by: Annotated[list[str], Field(description="Holders of the pause: user, load")] = []


class LastError(_Response):
    version: str
    reason: str
    message: str


class UpdateCounts(_Response):
    accepted: int = 0
    noop: int = 0
    conflict: int = 0
    rejected: int = 0
    succeeded: int = 0
    failed: int = 0


class HealthCheckResult(_Response):
    """The smoke check of a load that applied its version."""

    passed: Annotated[bool | None, Field(description="null: the engine has nothing to check (skipped)")]
    message: str = ""
    seconds: float = 0.0


class LastLoad(_Response):
    version: str
    phase: Literal[WorkerPhase.UPDATED, WorkerPhase.FAILED]
    reason: str
    message: str = ""
    bytes: int = 0
    seconds: float = 0.0
    checksum_verified: bool = False
    finished_at: str = ""
    peer: str | None = None
    bytes_from_peer: int = 0
    bytes_from_source: int = 0
    fallback_reason: Annotated[str | None, Field(description="Why the load left its peer for the source")] = (
        None
    )
    health_check: Annotated[
        HealthCheckResult | None, Field(description="The smoke check after the apply; null: none ran")
    ] = None


class RelayState(_Response):
    version: str
    from_: str = Field(alias="from", description="What the relayed bytes are read from")
    complete: bool = Field(
        True,
        description="False while the load is still running (pipelined relay: tensors served once verified)",
    )


class AgentStatus(_Response):
    """`GET /v1/status`: what the agent serves and what it is doing."""

    version: Annotated[str | None, Field(description="The live version; null: the engine's boot weights")]
    state: AgentState
    target: Annotated[str | None, Field(description="The version being loaded")] = None
    bytes_done: int = 0
    bytes_total: int = 0
    last_error: LastError | None = None
    checksum_verified: bool = False
    manifest_digest: str | None = None
    source: str | None = None
    weights_lost: bool = False
    staged: Annotated[
        bool, Field(description="The live version was staged for a replica's leader and not confirmed yet")
    ] = False
    updates: UpdateCounts = UpdateCounts()
    last_load: LastLoad | None = None
    relay: RelayState | None = None
    paused_by: list[str] = []
    engine: dict[str, JsonValue] = {}
    report: dict[str, JsonValue] = {}


class InferResult(_Response):
    """`POST /v1/infer` (reference engine): outputs for the engine's fixed input."""

    version: str | None
    output: list[float]


class Health(_Response):
    ok: bool


# -- FastDeploy's control envelope -------------------------------------------------------------
# FastDeploy answers every V1 control call (pause, resume, is_paused, update_weights) with one
# envelope whose HTTP status equals its internal code (upstream commit
# c1b7c083da606ed7f3ac35c2f905dc904f1163b2, fastdeploy/engine/request.py,
# ControlResponse.to_api_json_response). The agent answers those calls the same way, so a
# FastDeploy client drives an agent as it drives FastDeploy; the FastDeploy adapter reads real
# FastDeploy servers through the same models. Its 400s for a wrong parameter type are not
# enveloped but `{"error", "message"}`: the shape of ErrorBody.

# RFC 7240: a request carrying `Prefer: respond-async` (or a `rollout`) is answered 202 at once
# and polled through /v1/status; any other update_weights is answered when its load has ended.
PREFER_HEADER = "Prefer"
RESPOND_ASYNC = "respond-async"
PREFERENCE_APPLIED_HEADER = "Preference-Applied"


# Defined with the envelope rather than in ckpt_api.vocabulary: these are FastDeploy's words, and
# "error" is also the key of every ErrorBody, which the vocabulary scan would flag everywhere.
class ControlStatus(StrEnum):
    """The envelope's `status`: "success" exactly when the HTTP status is 200."""

    SUCCESS = "success"
    ERROR = "error"


class RankResult(_Response):
    """One engine rank's outcome of a synchronous update_weights. FastDeploy sends one per
    tensor-parallel rank, `{sync_cost, update_cost, total_cost, version, rank}` (seconds; the
    version that rank loaded); the agent sends one, rank 0, plus `bytes` and
    `checksum_verified`. Fields are optional so that a FastDeploy rank that omits one still
    parses (the agent's FastDeploy adapter then refuses a rank without the version it asked for)."""

    version: Annotated[str | None, Field(description="The version this rank now serves")] = None
    rank: int | None = None
    sync_cost: Annotated[
        float | None, Field(description="Seconds fetching (and verifying) the version before the apply")
    ] = None
    update_cost: Annotated[float | None, Field(description="Seconds the apply held the engine paused")] = None
    total_cost: Annotated[float | None, Field(description="Seconds for the whole load")] = None
    bytes: Annotated[int | None, Field(description="Agent only: tensor bytes loaded")] = None
    checksum_verified: Annotated[
        bool | None, Field(description="Agent only: every tensor's xxh3-128 was checked")
    ] = None


class LoadFailure(_Response):
    """`result` of a synchronous update_weights whose load failed (FastDeploy sends null)."""

    reason: Annotated[str, Field(description="A WorkerReason, or LoadInProgress")]
    version: Annotated[
        str | None,
        Field(description="The version live now; null: the engine's boot weights, or none (weights_lost)"),
    ]
    weights_lost: Annotated[
        bool, Field(description="No consistent version serves: the pod's WeightsReady is False")
    ] = False


class ControlReply(_Response):
    """FastDeploy's envelope; each call's subclass adds its `result`."""

    request_id: str
    status: ControlStatus
    error_message: Annotated[str | None, Field(description='"Success" on success; what failed otherwise')]

    @property
    def succeeded(self) -> bool:
        return self.status is ControlStatus.SUCCESS


class PauseReply(ControlReply):
    """`POST /v1/pause`, `POST /v1/resume`, `GET /v1/is_paused`: FastDeploy clients read
    `result.is_paused`. Re-entrant: pausing a paused engine (or resuming a running one) is a
    success that changes nothing."""

    result: PauseState | None = None


class UpdateWeightsReply(ControlReply):
    """A synchronous `POST /v1/update_weights` (no `rollout`, no `Prefer: respond-async`),
    answered when the load has ended: 200 with one RankResult per rank, or an error code with
    a LoadFailure (null when no load ran: another was running, or the wait timed out)."""

    result: list[RankResult] | LoadFailure | None = None


# The HTTP status of a synchronous update_weights whose load failed, by its reason: 4xx when the
# version cannot be loaded as asked (not found, not what the pin names, not this model's shape),
# 502 when the source or the engine failed, 503 when the agent is shutting down. A load that
# left no consistent weights is 500, whatever its reason. Anything unlisted is 500.
LOAD_FAILURE_STATUS: dict[str, int] = {
    WorkerReason.VERSION_NOT_FOUND: 404,
    WorkerReason.MANIFEST_DIGEST_MISMATCH: 409,
    WorkerReason.INCOMPATIBLE_CHECKPOINT: 422,
    WorkerReason.INVALID_MANIFEST: 422,
    WorkerReason.MANIFEST_TOO_LARGE: 422,
    WorkerReason.CHECKSUM_MISMATCH: 502,
    WorkerReason.TRUNCATED_SHARD: 502,
    WorkerReason.SOURCE_UNREACHABLE: 502,
    WorkerReason.ENGINE_ERROR: 502,
    WorkerReason.CANCELLED: 503,
}
WEIGHTS_LOST_STATUS = 500
# The load outlasted the synchronous wait (FastDeploy's own server gives up after 600 s); it
# goes on, and /v1/status tells how it ends.
SYNC_TIMEOUT_STATUS = 504
