"""Opening the transport of a load: the source alone, or the source's manifest with a peer's bytes;
and pulling a version into a staging target."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol
from urllib.parse import urlsplit

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.pipeline.reader import LoadProgress, fetch_manifest_raw, plan_runs, read_runs
from ckpt_agent.pipeline.relay_copy import RelayCopy
from ckpt_agent.pipeline.relay_peer import PeerError, PeerTransport, is_peer_fault, open_peer_transport
from ckpt_agent.transport import Transport, is_untrusted, open_transport
from ckpt_agent.transport.mooncake.runtime import MooncakeUnavailable

if TYPE_CHECKING:
    from ckpt_agent.pipeline.load_job import LoadJob
    from ckpt_api.manifest import ManifestDocument, TensorRecord

log = logging.getLogger(__name__)


def open_load_transport(source_uri: str, peer: str | None, bearer: str | None) -> Transport:
    source = open_transport(source_uri)
    if peer is None:
        return source
    try:
        bytes_from = open_peer_transport(peer, bearer)
    except (ValueError, LoadError, MooncakeUnavailable) as exc:
        source.close()
        raise PeerError(Reason.SOURCE_UNREACHABLE, f"peer {peer}: {exc}") from None
    return PeerTransport(source, bytes_from)


class PullTarget(Protocol):
    """Where a staged load lands: host staging (paddle) or a staging directory (disk engines)."""

    def buffer(self, entry: TensorRecord) -> memoryview: ...


def pull_into(
    transport: Transport,
    job: LoadJob,
    manifest: ManifestDocument,
    target: PullTarget,
    progress: LoadProgress,
    *,
    chunk_bytes: int,
    parallelism: int,
    relay: RelayCopy | None = None,
) -> None:
    """Every tensor of `manifest` into `target`'s buffers, verified (and checked finite) when the
    job asks for it, or when `relay` serves them onward as they land (pipelined relay).

    A peer that fails part way (gone, stalled, wrong bytes) is dropped for the rest of the load:
    the tensors it delivered and that verified stay, the others come from the source."""
    verify = job.must_verify or relay is not None
    landed: set[tuple[str, str]] = set()  # TensorRecord.key
    lock = threading.Lock()

    def on_tensor(entry: TensorRecord, _buf: memoryview) -> None:
        with lock:
            landed.add(entry.key)
        if relay is not None:
            relay.mark_ready(entry)

    def read(reader: Transport, entries: Sequence[TensorRecord]) -> None:
        # Several streams only pay off when there is more than one chunk per stream.
        nbytes = sum(e.nbytes for e in entries)
        max_run = max(nbytes // max(parallelism, 1), chunk_bytes)
        read_runs(
            reader,
            job.version,
            plan_runs(manifest, max_run_bytes=max_run, only=entries),
            buffer_for=target.buffer,
            on_tensor=on_tensor,
            verify=verify,
            progress=progress,
            cancelled=job.cancel.is_set,
            chunk_bytes=chunk_bytes,
            parallelism=parallelism,
            check_finite=job.check_finite,
            on_landed=None if relay is None else relay.mark_landed,
        )

    try:
        read(transport, manifest.tensors)
    except LoadError as exc:
        if not isinstance(transport, PeerTransport) or exc.weights_lost or not is_peer_fault(exc):
            raise
        progress.fall_back(f"{exc.reason}: {exc.message}")
        log.warning(
            "peer %s failed loading %s (%s); the %d tensors it did not deliver come from the source",
            transport.peer_uri,
            job.version,
            exc.message,
            len(manifest.tensors) - len(landed),
        )
        read(transport.source, [e for e in manifest.tensors if e.key not in landed])
    if relay is not None:
        relay.finish()


async def open_version(
    job: LoadJob, max_manifest_bytes: int
) -> tuple[Transport, ManifestDocument, str, bytes]:
    """The job's transport (source, or peer with the source's manifest) and its version's
    manifest, digest-checked: (transport, manifest, digest, raw manifest bytes). The caller
    closes the transport."""
    if job.source_uri is None:
        raise LoadError(Reason.SOURCE_UNREACHABLE, "no source to load from")
    transport = await asyncio.to_thread(open_load_transport, job.source_uri, job.peer, job.bearer)
    try:
        manifest, digest, raw = await asyncio.to_thread(
            fetch_manifest_raw,
            transport,
            job.version,
            expected_digest=job.manifest_digest,
            max_bytes=max_manifest_bytes,
        )
        if is_untrusted(transport) and not manifest.strong_digests_complete:
            # Decided before any byte moves (and before the engine pauses), so a peer's
            # fallback costs nothing but the manifest.
            raise _no_strong_digest(transport, job.version)
    except BaseException:
        transport.close()
        raise
    return transport, manifest, digest, raw


def _no_strong_digest(transport: Transport, version: str) -> LoadError:
    published_before = (
        "lists no blake3 or sha256 for some tensors or files (published before either was added)"
    )
    if isinstance(transport, PeerTransport):
        return PeerError(
            Reason.CHECKSUM_MISMATCH,
            f"peer {transport.peer_uri} not used: the manifest of {version} {published_before}, and "
            "bytes from a peer are checked against a cryptographic digest only; loading from the source",
        )
    scheme = urlsplit(transport.uri).scheme
    return LoadError(
        Reason.INVALID_MANIFEST,
        f"the manifest of {version} {published_before}, and bytes read over {scheme}:// are checked "
        "against a cryptographic digest only (anyone who reaches the server's transfer engine can "
        "write the memory it serves); republish the version, or load it over http(s)",
    )


def checksum_verified(job: LoadJob, transport: Transport) -> bool:
    """What a load reports as `checksum_verified`: the bytes were checked, because the job asked
    (or implied it), or because the transport is untrusted and its bytes always are."""
    return job.must_verify or is_untrusted(transport)
