"""The operator's HTTP/1.1 connections to agents: one request at a time on each, kept open
between a worker's update_weights and its pulls, bounded in number and in idle time.

Failures are told apart by what they prove, because the caller's safety rests on it:
`ConnectFailed` (nothing was sent: calling again is safe), `CertificateFailed` (the agent's
certificate is wrong: calling again will not help) and `AnswerLost` (sent, maybe received, no
answer: only the agent's status can say whether it acted).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import cast

from ckpt_rollout.io.http_wire import Answer, AnswerReader, BadAnswer, host_header, request_bytes

# An idle connection is reused only this long: well inside the agent's own idle timeout (30 s by
# default), so the agent does not close it while a request is on its way.
IDLE_REUSE_S = 10.0
# Idle connections kept at most (the oldest are closed first): one per worker between its call
# and its first pull, for the largest wave the operator runs at once.
MAX_IDLE = 8192


class ConnectFailed(Exception):
    """No connection: the request was never sent. ``timed_out``: the whole deadline went on
    trying (a pod IP that drops packets), so trying again at once would only wait as long."""

    def __init__(self, reason: str, *, timed_out: bool = False) -> None:
        super().__init__(reason)
        self.timed_out = timed_out


class CertificateFailed(Exception):
    """The TLS handshake refused the agent's certificate."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AnswerLost(Exception):
    """The request went out (maybe only in part) and no whole answer came back."""


@dataclass(frozen=True)
class Endpoint:
    ip: str
    port: int
    tls: ssl.SSLContext | None = None
    server_hostname: str | None = None  # the name the certificate must carry (TLS only)


class _Connection(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader: AnswerReader | None = None
        self.done: asyncio.Future[Answer] | None = None
        self.lost = False
        self.idle_since = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are no asyncio.Transport subclasses; both have what is used here.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.reader is None or self.done is None or self.done.done():
            self.close()  # bytes nobody asked for: the connection's framing is off
            return
        try:
            extra = self.reader.feed(data)
            if extra:
                raise BadAnswer("bytes past the end of the answer")
        except BadAnswer as exc:
            self.done.set_exception(AnswerLost(str(exc)))
            self.close()
            return
        if self.reader.answer is not None:
            self.done.set_result(self.reader.answer)

    def eof_received(self) -> bool | None:
        self._ended()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended(exc)

    def _ended(self, exc: Exception | None = None) -> None:
        self.lost = True  # the agent closed its side: nothing more can be asked on it
        if self.reader is None or self.done is None or self.done.done():
            return
        try:
            self.reader.closed()
        except BadAnswer as bad:
            why = f"{bad}: {exc}" if exc else str(bad)
            self.done.set_exception(AnswerLost(why))
            return
        assert self.reader.answer is not None
        self.done.set_result(self.reader.answer)

    async def exchange(self, request: bytes, method: str, deadline: float) -> Answer:
        """Raises AnswerLost, also when no whole answer is in by ``deadline`` (loop time)."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self.reader = AnswerReader(method)
        done: asyncio.Future[Answer] = loop.create_future()
        self.done = done
        # A bare timer, not asyncio.timeout: two exchanges a worker, and its bookkeeping showed.
        timer = loop.call_at(deadline, self._expire, done)
        self.transport.write(request)
        try:
            return await done
        finally:
            timer.cancel()
            self.reader = None
            self.done = None

    def _expire(self, done: asyncio.Future[Answer]) -> None:
        if not done.done():
            done.set_exception(AnswerLost("TimeoutError: no answer in time"))

    @property
    def reusable(self) -> bool:
        return not self.lost and self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class AgentHttp:
    """Requests to agents, at most ``max_connections`` at a time."""

    def __init__(self, max_connections: int = 256) -> None:
        self._slots = asyncio.Semaphore(max_connections)
        self._idle: OrderedDict[Endpoint, _Connection] = OrderedDict()

    async def request(
        self,
        endpoint: Endpoint,
        method: str,
        path: str,
        headers: dict[str, str],
        body: bytes | None,
        timeout_s: float,
    ) -> Answer:
        """Raises ConnectFailed, CertificateFailed or AnswerLost (see the module doc). The timeout
        bounds the whole exchange, connecting included."""
        wire = request_bytes(method, host_header(endpoint.ip, endpoint.port), path, headers, body)
        async with self._slots:
            deadline = asyncio.get_running_loop().time() + timeout_s
            reused = self._take_idle(endpoint)
            if reused is not None:
                try:
                    return await self._exchange(endpoint, reused, wire, method, deadline)
                except AnswerLost:
                    # An idle connection the agent closed just as we wrote: only a request
                    # that changes nothing may be sent again on a fresh one.
                    if method != "GET" or not reused.lost:
                        raise
            connection = await self._connect(endpoint, deadline)
            return await self._exchange(endpoint, connection, wire, method, deadline)

    async def _exchange(
        self, endpoint: Endpoint, connection: _Connection, wire: bytes, method: str, deadline: float
    ) -> Answer:
        try:
            answer = await connection.exchange(wire, method, deadline)
        except AnswerLost:
            connection.close()
            raise
        if answer.keep_alive and connection.reusable:
            self._keep_idle(endpoint, connection)
        else:
            connection.close()
        return answer

    async def _connect(self, endpoint: Endpoint, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(deadline):
                _, connection = await loop.create_connection(
                    _Connection,
                    endpoint.ip,
                    endpoint.port,
                    ssl=endpoint.tls,
                    server_hostname=endpoint.server_hostname if endpoint.tls else None,
                )
        except ssl.SSLCertVerificationError as exc:
            raise CertificateFailed(str(exc)) from None
        except TimeoutError:
            raise ConnectFailed("TimeoutError: no connection in time", timed_out=True) from None
        except ssl.SSLError as exc:
            # Connected, and the handshake failed otherwise: no request went out.
            raise ConnectFailed(f"TLS handshake failed: {exc}") from None
        except OSError as exc:
            raise ConnectFailed(f"{exc.strerror or exc}") from None
        return connection

    def _take_idle(self, endpoint: Endpoint) -> _Connection | None:
        connection = self._idle.pop(endpoint, None)
        if connection is None:
            return None
        if connection.reusable and time.monotonic() - connection.idle_since < IDLE_REUSE_S:
            return connection
        connection.close()
        return None

    def _keep_idle(self, endpoint: Endpoint, connection: _Connection) -> None:
        previous = self._idle.pop(endpoint, None)
        if previous is not None:
            previous.close()
        connection.idle_since = time.monotonic()
        self._idle[endpoint] = connection
        now = connection.idle_since
        # Oldest first: drop those past reuse, and any beyond the bound.
        while self._idle:
            oldest = next(iter(self._idle.values()))
            if len(self._idle) <= MAX_IDLE and now - oldest.idle_since < IDLE_REUSE_S:
                break
            self._idle.popitem(last=False)[1].close()

    def close(self) -> None:
        while self._idle:
            self._idle.popitem()[1].close()
