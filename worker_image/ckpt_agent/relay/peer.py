"""Loading from a peer: the manifest from the original source, tensor bytes from the peer.

`PeerTransport` combines the two behind the ordinary `Transport` interface so the load pipeline
is unchanged; every failure on the peer's side comes out as `PeerError`, which tells the agent
to fall back to the original source for the whole load.
"""

from __future__ import annotations

from collections.abc import Callable

from ckpt_agent.errors import LoadError, Reason
from ckpt_agent.transport import ByteStream, Transport
from ckpt_agent.transport.base import RegistersBuffers
from ckpt_api.agent_api import check_peer_uri

RELAY_PATH = "/v1/relay"


class PeerError(LoadError):
    """The peer failed (unreachable, refused, short or wrong bytes): fall back to the source."""


def open_peer_transport(uri: str, bearer: str | None) -> Transport:
    """Bytes of a peer agent: http under `/v1/relay`, mooncake through `/v1/mooncake`. The
    update request's bearer token is forwarded: every agent accepts the operator's token."""
    check_peer_uri(uri)
    if uri.startswith("mooncake://"):
        from ckpt_agent.transport.mooncake import MooncakeTransport

        return MooncakeTransport(uri, bearer=bearer, files_path=RELAY_PATH)
    from ckpt_agent.transport.http import HttpTransport

    return HttpTransport(uri.rstrip("/") + RELAY_PATH, bearer=bearer)


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
    def __init__(self, source: Transport, peer: Transport) -> None:
        self.uri = source.uri
        self.peer_uri = peer.uri
        self._source = source
        self._peer = peer

    def fetch_manifest(self, version: str, max_bytes: int) -> bytes:
        return self._source.fetch_manifest(version, max_bytes)

    def open_range(self, version: str, file: str, start: int, end: int) -> ByteStream:
        try:
            stream = self._peer.open_range(version, file, start, end)
        except LoadError as exc:
            raise _peer_error(exc, self.peer_uri) from None
        return _PeerStream(stream, self.peer_uri)

    def register_buffer(self, version: str, buf: memoryview) -> Callable[[], None]:
        if isinstance(self._peer, RegistersBuffers):
            try:
                return self._peer.register_buffer(version, buf)
            except LoadError as exc:
                raise _peer_error(exc, self.peer_uri) from None
        return lambda: None

    def close(self) -> None:
        try:
            self._peer.close()
        finally:
            self._source.close()


def is_peer_fault(exc: LoadError) -> bool:
    """A failure the original source would not have: worth retrying the load from it. Checksum
    mismatches count: with a peer, the manifest is the source's and only bytes come from the peer."""
    return isinstance(exc, PeerError) or exc.reason == Reason.CHECKSUM_MISMATCH
