"""Loading from a peer: the manifest from the original source, tensor bytes from the peer.

`PeerTransport` combines the two behind the ordinary `Transport` interface so the load pipeline
is unchanged; every failure on the peer's side comes out as `PeerError`, which tells the agent
to fall back to the original source for the whole load.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from dataclasses import dataclass

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.transport import ByteStream, Transport
from ckpt_agent.transport.abort import PEER
from ckpt_agent.transport.guard import SOURCE_POLICY, check_source
from ckpt_api.agent_api import check_peer_uri
from ckpt_api.tls import ReloadingContext

RELAY_PATH = "/v1/relay"
# How long a load waits for its peer to begin relaying the version (it may be called at the same
# moment), and how often it looks: soon at first (a chain's hops add up), then backing off (each
# look may cost the peer a TLS handshake).
PEER_START_WAIT_S = 10.0
_PEER_START_POLL_S = (0.01, 0.25)
# A peer that sends nothing this long is dropped (the load resumes from the source): shorter than
# a source's 30 s, since the source remains to fall back to.
PEER_STALL_S = 10.0


class PeerError(LoadError):
    """The peer failed (unreachable, refused, short or wrong bytes): fall back to the source."""


@dataclass(frozen=True)
class PeerTLS:
    """How this agent checks the peers it reads. With ``ca`` (--peer-ca-file), a peer must serve
    https with a certificate chaining to it for ``server_name`` (the agents' name in this
    agent's namespace; peers are in the same one), and plain-http peers are refused; without,
    an https peer is checked against the system's CAs for its own host."""

    ca: ReloadingContext | None = None
    server_name: str | None = None


# The agent's, set for each load's task like the source policy (transport.guard.SOURCE_POLICY).
PEER_TLS: ContextVar[PeerTLS] = ContextVar("PEER_TLS", default=PeerTLS())  # noqa: B039 - frozen


def open_peer_transport(uri: str, bearer: str | None) -> Transport:
    """Bytes of a peer agent: http(s) under `/v1/relay`, mooncake through `/v1/mooncake`.
    `bearer`: this agent's own relay credential (see `agent.relay_credential`). A peer is an
    address a request names, so the source policy judges it like a source: its URI here, every
    address it resolves to at connect time."""
    check_peer_uri(uri)
    check_source(uri)
    policy = SOURCE_POLICY.get()
    if uri.startswith("mooncake://"):
        from ckpt_agent.transport.mooncake.client import MooncakeTransport

        return MooncakeTransport(
            uri, bearer=bearer, files_path=RELAY_PATH, timeout=PEER_STALL_S, policy=policy
        )
    from ckpt_agent.transport.http import HttpTransport

    tls = PEER_TLS.get()
    if tls.ca is not None and not uri.startswith("https://"):
        # Never read unverified: bytes and the relay credential would cross the wire in clear.
        raise ValueError("is plain http, and this agent reads peers only over verified TLS (--peer-ca-file)")
    context = tls.ca.current() if tls.ca is not None else None
    return HttpTransport(
        uri.rstrip("/") + RELAY_PATH,
        bearer=bearer,
        tls=context,
        server_name=tls.server_name,
        timeout=PEER_STALL_S,
        policy=policy,
        checked_as=uri,
        abort_scope=PEER,
    )


class _PeerStream:
    def __init__(self, stream: ByteStream, peer: str) -> None:
        self._stream = stream
        self._peer = peer

    def readinto(self, buf: memoryview) -> None:
        try:
            self._stream.readinto(buf)
        except LoadError as exc:
            raise _peer_error(exc, self._peer) from None

    def close(self) -> None:
        self._stream.close()


def _peer_error(exc: LoadError, peer: str) -> PeerError:
    return PeerError(exc.reason, f"peer {peer}: {exc.message}", tensor=exc.tensor)


class PeerTransport:
    # A peer picks the bytes it serves (`transport.base.is_untrusted`): its fallback to the
    # source reads through `source`, which says for itself.
    untrusted_bytes = True

    def __init__(self, source: Transport, peer: Transport) -> None:
        self.uri = source.uri
        self.peer_uri = peer.uri
        self._source = source
        self._peer = peer
        self._relaying: set[str] = set()

    @property
    def source(self) -> Transport:
        """The original source: where a load goes on once the peer failed."""
        return self._source

    def fetch_manifest(self, version: str, max_bytes: int) -> bytes:
        return self._source.fetch_manifest(version, max_bytes)

    def _await_relaying(self, version: str) -> None:
        """Pipelined relay calls a wave's members at once: a peer of the same wave may not have
        begun its own load when this one first reads. Wait for it (bounded), then read."""
        if version in self._relaying:
            return
        deadline = time.monotonic() + PEER_START_WAIT_S
        pause, longest = _PEER_START_POLL_S
        while True:
            try:
                self._peer.fetch_manifest(version, DEFAULT_MAX_MANIFEST_BYTES)
                break
            except LoadError as exc:
                if exc.reason != Reason.VERSION_NOT_FOUND:
                    raise _peer_error(exc, self.peer_uri) from None
                if time.monotonic() > deadline:
                    raise PeerError(
                        Reason.SOURCE_UNREACHABLE,
                        f"peer {self.peer_uri} did not relay {version} within {PEER_START_WAIT_S:g}s",
                    ) from None
            time.sleep(pause)
            pause = min(pause * 2, longest)
        self._relaying.add(version)

    def open_range(self, version: str, file: str, start: int, end: int) -> ByteStream:
        self._await_relaying(version)
        try:
            stream = self._peer.open_range(version, file, start, end)
        except LoadError as exc:
            raise _peer_error(exc, self.peer_uri) from None
        return _PeerStream(stream, self.peer_uri)

    def close(self) -> None:
        try:
            self._peer.close()
        finally:
            self._source.close()


def is_peer_fault(exc: LoadError) -> bool:
    """A failure the original source would not have: worth retrying the load from it. Checksum
    mismatches count: with a peer, the manifest is the source's and only bytes come from the peer."""
    return isinstance(exc, PeerError) or exc.reason == Reason.CHECKSUM_MISMATCH
