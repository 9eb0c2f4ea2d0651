"""The checkpoint version manifest as the agent reads it.

The format, its model, compatibility rules, validation, encoding and digest are
`ckpt_api.manifest`'s; what the agent adds is its own: the size it reads at most and the error a
load fails with when a manifest is unusable (or for another version).
"""

from __future__ import annotations

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_api.manifest import ManifestDocument, ManifestError, parse_document, shown

# 100k tensors with long names fit in a few tens of MiB; anything bigger is a broken or hostile source.
DEFAULT_MAX_MANIFEST_BYTES = 64 << 20


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
