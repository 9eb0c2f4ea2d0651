"""The agent's source policy (ckpt_api.source_policy) where sources are opened and connected to.

The policy is the agent's, set for each load's task (`SOURCE_POLICY`): a context variable, so
several agents in one process (the tests) each keep their own, and the worker threads a load
starts with asyncio.to_thread see it too. Connections check every address a host resolves to
before connecting, and connect to the very address checked (one resolution: a rebinding name
gets no second answer), so a name that resolves to a refused address is refused whatever the URI
said. Peers are judged the same way: a request names them as it names sources, and the relay
credential is presented to whatever they resolve to.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
from contextvars import ContextVar

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_api.source_policy import SourcePolicy, SourceRefused

# SourcePolicy is frozen: one shared default is safe.
SOURCE_POLICY: ContextVar[SourcePolicy] = ContextVar("source_policy", default=SourcePolicy())  # noqa: B039


def check_source(uri: str) -> None:
    """Raise LoadError(InvalidSource) unless the current policy allows ``uri`` as a source."""
    try:
        SOURCE_POLICY.get().check_uri(uri)
    except SourceRefused as exc:
        raise LoadError(Reason.INVALID_SOURCE, str(exc)) from None


def guard(conn: http.client.HTTPConnection, uri: str, policy: SourcePolicy) -> http.client.HTTPConnection:
    """``conn``, connecting only to addresses ``policy`` allows for ``uri``."""

    def create_connection(
        address: tuple[str, int], timeout: float | None = None, source_address: tuple[str, int] | None = None
    ) -> socket.socket:
        host, port = address
        refused: str | None = None
        failed: OSError | None = None
        for family, kind, proto, _, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
            try:
                policy.check_address(uri, ipaddress.ip_address(sockaddr[0]))
            except SourceRefused as exc:
                refused = str(exc)
                continue
            sock = socket.socket(family, kind, proto)
            try:
                if timeout is not None:
                    sock.settimeout(timeout)
                if source_address is not None:
                    sock.bind(source_address)
                sock.connect(sockaddr)
            except OSError as exc:
                sock.close()
                failed = exc
                continue
            return sock
        if failed is not None:
            raise failed
        raise LoadError(Reason.INVALID_SOURCE, refused or f"{uri}: {host} resolves to no address")

    conn._create_connection = create_connection  # type: ignore[attr-defined]
    return conn
