"""Failure reasons the agent reports, and the exceptions that carry them."""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    """CamelCase reasons written to `/v1/status`, the CR worker entry and metrics."""

    LOADED = "Loaded"
    CHECKSUM_MISMATCH = "ChecksumMismatch"
    INCOMPATIBLE_CHECKPOINT = "IncompatibleCheckpoint"
    MANIFEST_DIGEST_MISMATCH = "ManifestDigestMismatch"
    SOURCE_UNREACHABLE = "SourceUnreachable"
    VERSION_NOT_FOUND = "VersionNotFound"
    TRUNCATED_SHARD = "TruncatedShard"
    MANIFEST_TOO_LARGE = "ManifestTooLarge"
    INVALID_VERSION = "InvalidVersion"
    INVALID_MANIFEST = "InvalidManifest"
    ENGINE_ERROR = "EngineError"
    CANCELLED = "Cancelled"


class LoadError(Exception):
    """A load failed for a reason worth reporting; the previous weights are still live unless
    `weights_lost` is set (a streamed apply that could not be undone)."""

    def __init__(
        self, reason: Reason, message: str, *, tensor: str | None = None, weights_lost: bool = False
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.tensor = tensor
        self.weights_lost = weights_lost


class RequestError(Exception):
    """A request the agent refuses before doing anything: answered with a 4xx and a reason."""

    def __init__(
        self, message: str, *, field: str | None = None, reason: str = "InvalidRequest", status: int = 400
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.reason = reason
        self.status = status

    def to_json(self) -> dict[str, object]:
        body: dict[str, object] = {"error": self.reason, "message": self.message}
        if self.field is not None:
            body["field"] = self.field
        return body
