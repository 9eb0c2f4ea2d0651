"""The checkpoint version manifest as the agent reads it.

The format, its model, compatibility rules, validation and encoding are `ckpt_api.manifest`'s;
what the agent adds is its own: the size it reads at most, the error a load fails with when a
manifest is unusable (or for another version), and the digest the operator pins.
"""

from __future__ import annotations

import hashlib
import re

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_api.manifest import ManifestDocument, ManifestError, parse_document, shown

# 100k tensors with long names fit in a few tens of MiB; anything bigger is a broken or hostile source.
DEFAULT_MAX_MANIFEST_BYTES = 64 << 20

_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def manifest_digest(raw: bytes) -> str:
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def is_valid_digest(value: str) -> bool:
    return bool(_DIGEST.fullmatch(value))


def parse_manifest(raw: bytes, *, expected_version: str | None = None) -> ManifestDocument:
    """Parse and validate a manifest; raises LoadError(InvalidManifest) naming what is wrong."""
    try:
        manifest = parse_document(raw)
    except ManifestError as exc:
        message = str(exc)
        if not message.startswith("manifest is not valid JSON"):
            message = f"invalid manifest: {message}"
        raise LoadError(Reason.INVALID_MANIFEST, message) from None
    if expected_version is not None and manifest.version != expected_version:
        raise LoadError(
            Reason.INVALID_MANIFEST,
            f"invalid manifest: manifest is for version {shown(manifest.version, 128)}, "
            f"not {expected_version!r}",
        )
    return manifest
