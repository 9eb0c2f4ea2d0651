"""The transport interface: how the agent pulls a version's manifest and tensor bytes.

Deliberately small and blocking: loads run in worker threads that read straight into
preallocated buffers (`readinto`), which is what keeps copies and allocations off the hot path,
and what RDMA-style transports (Mooncake `transfer_sync_read` into registered memory) offer.
A transport for a new scheme implements `Transport` and registers a factory with
`ckpt_agent.transport.register_transport`.
"""

from __future__ import annotations

from typing import Protocol


class ByteStream(Protocol):
    """Sequential reader over one byte range of one shard.

    Optional class attributes tell the reader how to drive it: `prefers_whole_tensors` (one
    `readinto` per tensor: the transport splits it itself, e.g. Mooncake) and `overlaps_hashing`
    (reads may run in a helper thread, ahead of the hashing, e.g. local files; not set for HTTP:
    with the sender on the same cores, loopback measured slower that way).
    """

    def readinto(self, buf: memoryview) -> None:
        """Fill `buf` completely with the next bytes of the range.

        Raises LoadError(TruncatedShard) if the range ends early, LoadError(SourceUnreachable)
        on I/O failure.
        """

    def close(self) -> None: ...


class Transport(Protocol):
    """Optional class attribute: `untrusted_bytes` (see `is_untrusted`)."""

    uri: str

    def fetch_manifest(self, version: str, max_bytes: int) -> bytes:
        """Raw manifest bytes (the digest is computed over exactly these).

        Raises LoadError with VersionNotFound, ManifestTooLarge or SourceUnreachable.
        """

    def open_range(self, version: str, file: str, start: int, end: int) -> ByteStream:
        """A stream over bytes [start, end) of `file` in `version`."""

    def close(self) -> None: ...


def is_untrusted(transport: object) -> bool:
    """Whether the bytes `transport` reads may be other than the publisher's, whoever wrote the
    manifest: a peer picks the bytes it serves (`PeerTransport`), and a Mooncake server's
    registered memory takes writes from anyone who reaches its engine, which has no credential
    (`MooncakeTransport`). The load pipeline checks such bytes against the manifest's sha256
    whatever the request's verify_checksum says, and refuses a manifest that lacks one."""
    return bool(getattr(transport, "untrusted_bytes", False))


class EmptyStream:
    def readinto(self, buf: memoryview) -> None:
        if buf.nbytes:
            raise ValueError("EmptyStream has no bytes")

    def close(self) -> None:
        pass
