"""Opening the transport of a load: the source alone, or the source's manifest with a peer's bytes;
and registering destination memory with transports that want it (RDMA)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from ckpt_agent.errors import LoadError, Reason
from ckpt_agent.mooncake.runtime import MooncakeUnavailable
from ckpt_agent.relay.peer import PeerError, PeerTransport, open_peer_transport
from ckpt_agent.transport import RegistersBuffers, Transport, open_transport


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


@contextmanager
def registered(transport: Transport, version: str, regions: Sequence[memoryview]) -> Iterator[None]:
    """Register `regions` as read destinations for the block, when the transport wants that."""
    undo: list[Callable[[], None]] = []
    try:
        if isinstance(transport, RegistersBuffers):
            for region in regions:
                undo.append(transport.register_buffer(version, region))
        yield
    finally:
        for fn in reversed(undo):
            fn()
