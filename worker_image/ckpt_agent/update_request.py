"""`POST /v1/update_weights` bodies: strict parsing with field-level errors (400, never 500)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ckpt_agent.errors import Reason, RequestError
from ckpt_agent.manifest import is_valid_digest
from ckpt_agent.relay.peer import check_peer_uri
from ckpt_agent.transport import check_uri
from ckpt_api.versions import validate_version

# DNS-1123 subdomain: what Kubernetes accepts for namespace and object names.
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


@dataclass(frozen=True)
class SourceSpec:
    uri: str
    manifest_digest: str | None = None
    # A peer agent to pull tensor bytes from (http://ip:port or mooncake://ip:port); the
    # manifest still comes from `uri`, and every byte is verified against it.
    peer: str | None = None


@dataclass(frozen=True)
class RolloutRef:
    """The CheckpointRollout a request serves; the agent reports into its status."""

    namespace: str
    name: str
    uid: str
    wave: int
    # False: do not write status.workers.<pod>; the operator pulls /v1/status instead (big
    # waves: N agents patching one CR serialize in the apiserver). The pod's WeightsReady
    # condition is written either way.
    report: bool = True


@dataclass(frozen=True)
class UpdateRequest:
    version: str
    verify_checksum: bool
    source: SourceSpec | None
    rollout: RolloutRef | None


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _object(value: object, field: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise RequestError(f"{field} must be an object, got {_type_name(value)}", field=field)
    return value


def _string(obj: dict[str, object], key: str, field: str, *, required: bool = True) -> str | None:
    value = obj.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise RequestError(f"{field} must be a non-empty string, got {_type_name(value)}", field=field)
    return value


def parse_rollout(value: object) -> RolloutRef | None:
    if value is None:
        return None
    obj = _object(value, "rollout")
    namespace = _string(obj, "namespace", "rollout.namespace")
    name = _string(obj, "name", "rollout.name")
    uid = _string(obj, "uid", "rollout.uid")
    assert namespace is not None
    assert name is not None
    assert uid is not None
    for field, text in (("rollout.namespace", namespace), ("rollout.name", name)):
        if not _K8S_NAME.match(text):
            raise RequestError(f"{field} {text!r} is not a valid Kubernetes name", field=field)
    wave = obj.get("wave")
    if not isinstance(wave, int) or isinstance(wave, bool) or wave < 0:
        raise RequestError(
            f"rollout.wave must be a non-negative integer, got {_type_name(wave)}", field="rollout.wave"
        )
    report = obj.get("report", True)
    if not isinstance(report, bool):
        raise RequestError(
            f"rollout.report must be a boolean, got {_type_name(report)}", field="rollout.report"
        )
    return RolloutRef(namespace, name, uid, wave, report)


def parse_source(value: object) -> SourceSpec | None:
    if value is None:
        return None
    obj = _object(value, "source")
    uri = _string(obj, "uri", "source.uri")
    assert uri is not None
    try:
        check_uri(uri)
    except ValueError as exc:
        raise RequestError(f"source.uri: {exc}", field="source.uri") from None
    digest = _string(obj, "manifestDigest", "source.manifestDigest", required=False)
    if digest is not None and not is_valid_digest(digest):
        raise RequestError(
            "source.manifestDigest must look like sha256:<64 hex>", field="source.manifestDigest"
        )
    peer = _string(obj, "peer", "source.peer", required=False)
    if peer is not None:
        try:
            check_peer_uri(peer)
        except ValueError as exc:
            raise RequestError(f"source.peer: {exc}", field="source.peer") from None
    return SourceSpec(uri, digest, peer)


def parse_update_request(body: object) -> UpdateRequest:
    """Validate a decoded JSON body. Unknown keys are ignored (FastDeploy clients send
    `rsync_config`); known keys must have exactly the documented types."""
    obj = _object(body, "body")
    rollout = parse_rollout(obj.get("rollout"))
    source = parse_source(obj.get("source"))
    verify = obj.get("verify_checksum", False)
    if not isinstance(verify, bool):
        raise RequestError(
            f"verify_checksum must be a boolean, got {_type_name(verify)}", field="verify_checksum"
        )
    version = obj.get("version")
    if not isinstance(version, str):
        raise RequestError(f"version must be a string, got {_type_name(version)}", field="version")
    try:
        validate_version(version)
    except ValueError as exc:
        raise RequestError(str(exc), field="version", reason=Reason.INVALID_VERSION) from None
    return UpdateRequest(version, verify, source, rollout)
