"""Run an aiohttp app on host:port (port 0 picks a free one), over TLS when given a context,
until stopped or signalled."""

from __future__ import annotations

import asyncio
import signal
import ssl
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

# Past the cap a connection gets this and is closed: callers treat 503 + Retry-After as "ask
# again", where a reset would read as an unreachable agent.
_BUSY_REPLY = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nConnection: close\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 22\r\n\r\ntoo many connections\r\n"
)


@dataclass(frozen=True)
class ConnectionLimits:
    """What one client may hold of the server before authenticating.

    `idle_timeout_s`: a connection has this long, from its opening or from its last response, to
    deliver a complete request head; bytes trickled in do not extend it (aiohttp's keep-alive
    timer runs from the connection's opening and is reset only by a response), so it is the
    header-read timeout and the keep-alive timeout both, and also bounds a TLS handshake. Above
    the 15 s an aiohttp client keeps a pooled connection, so the operator and peers never reuse
    one the agent is closing. `max_connections`: open connections past this are answered 503
    and closed, so file descriptors stay bounded whoever connects."""

    idle_timeout_s: float = 30.0
    max_connections: int = 256


class _Refused(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(_BUSY_REPLY)
        transport.close()


class _Counted(asyncio.Protocol):
    """aiohttp's protocol, counted from connection_made (calls to it run one at a time, so the
    count is exact; a TLS connection counts once its handshake is done) to connection_lost."""

    def __init__(self, inner: asyncio.Protocol, live: set[_Counted], limit: int) -> None:
        self._inner = inner
        self._live = live
        self._limit = limit
        self._refused: _Refused | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if len(self._live) >= self._limit:
            self._refused = _Refused()
            self._refused.connection_made(transport)
            return
        self._live.add(self)
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._refused is None:
            self._live.discard(self)
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused is None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self._refused is not None else self._inner.eof_received()

    def pause_writing(self) -> None:
        if self._refused is None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._refused is None:
            self._inner.resume_writing()


class AppServer:
    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
        limits: ConnectionLimits = ConnectionLimits(),
    ) -> None:
        self._runner = web.AppRunner(
            app, access_log=None, handle_signals=False, keepalive_timeout=limits.idle_timeout_s
        )
        self.host = host
        self.port = port
        self._ssl = ssl_context
        self._limits = limits
        self._live: set[_Counted] = set()
        self._listener: asyncio.Server | None = None

    async def start(self) -> None:
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        limit = self._limits.max_connections
        self._listener = await asyncio.get_running_loop().create_server(
            lambda: _Counted(server(), self._live, limit),
            self.host,
            self.port,
            ssl=self._ssl,
            reuse_address=True,
            ssl_handshake_timeout=self._limits.idle_timeout_s if self._ssl else None,
        )
        self.port = int(self._listener.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self._ssl else 'http'}://{host}:{self.port}"

    @property
    def open_connections(self) -> int:
        return len(self._live)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        # Closes the connections still open (aiohttp's graceful shutdown), then the app.
        await self._runner.cleanup()
        self._listener = None


async def serve_until_signalled(
    server: AppServer, banner: str, announce: Callable[[str], None] | None = None
) -> None:
    """Start, print `banner` + the URL (scripts parse it to find a port-0 server), or hand it to
    ``announce`` (JSON logs: a log record like every other line), wait for SIGINT/SIGTERM, then
    shut down cleanly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    try:
        if announce is None:
            print(f"{banner} {server.url}", flush=True)
        else:
            announce(f"{banner} {server.url}")
        await stop.wait()
    finally:
        await server.stop()
