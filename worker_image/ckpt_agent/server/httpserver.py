"""Run an aiohttp app on host:port (port 0 picks a free one), over TLS when given a context,
until stopped or signalled."""

from __future__ import annotations

import asyncio
import signal
import ssl
from collections.abc import Callable

from aiohttp import web


class AppServer:
    def __init__(
        self, app: web.Application, host: str, port: int, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        self.host = host
        self.port = port
        self._ssl = ssl_context

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True, ssl_context=self._ssl)
        await site.start()
        self.port = int(self._runner.addresses[0][1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{'https' if self._ssl else 'http'}://{host}:{self.port}"

    async def stop(self) -> None:
        await self._runner.cleanup()


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
