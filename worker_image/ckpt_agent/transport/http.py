"""`http://` / `https://` sources, e.g. `ckpt-rollout serve` or any static file server.

Uses `http.client` from worker threads rather than aiohttp: a response's `readinto` lands bytes
straight in the caller's buffer via `recv_into`, one copy and no per-chunk allocation, which is
several times faster than iterating aiohttp's stream at these sizes.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import ssl
from collections.abc import Callable
from urllib.parse import quote, urlsplit

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.transport.abort import LOAD_ABORT, SOURCE, LoadAbort
from ckpt_agent.transport.base import ByteStream, EmptyStream
from ckpt_agent.transport.guard import guard
from ckpt_api.manifest import MANIFEST_NAME
from ckpt_api.source_policy import SourcePolicy

_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


class _HttpStream:
    def __init__(
        self,
        conn: http.client.HTTPConnection,
        resp: http.client.HTTPResponse,
        name: str,
        aborted: Callable[[], LoadError | None],
    ) -> None:
        self._conn = conn
        self._resp = resp
        self._name = name
        self._aborted = aborted

    def readinto(self, buf: memoryview) -> None:
        done, want = 0, buf.nbytes
        while done < want:
            try:
                n = self._resp.readinto(buf[done:])
            except http.client.IncompleteRead:
                n = 0
            except (OSError, http.client.HTTPException) as exc:
                raise self._aborted() or LoadError(
                    Reason.SOURCE_UNREACHABLE, f"reading {self._name}: {exc}"
                ) from None
            if n == 0:
                # An aborted load's socket was shut down under the read: say why, not "closed".
                raise self._aborted() or LoadError(
                    Reason.TRUNCATED_SHARD, f"{self._name}: the source closed the stream early"
                )
            done += n

    def close(self) -> None:
        self._conn.close()


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """Connects to the URL's host (a pod IP) but verifies the certificate for `server_name`."""

    def __init__(
        self, host: str, port: int | None, *, timeout: float, context: ssl.SSLContext, server_name: str
    ) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._tls = context
        self._server_name = server_name

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._tls.wrap_socket(self.sock, server_hostname=self._server_name)


class HttpTransport:
    def __init__(
        self,
        uri: str,
        *,
        timeout: float = 30.0,
        bearer: str | None = None,
        policy: SourcePolicy | None = None,
        tls: ssl.SSLContext | None = None,
        server_name: str | None = None,
        checked_as: str | None = None,
        abort_scope: str = SOURCE,
    ) -> None:
        """`policy`: the addresses it may connect to (a source's or a peer's), judged for the
        URI `checked_as` (default `uri`; a peer's or a mooncake endpoint's own URI, not the
        HTTP path under it). `tls`: what an https server's certificate must chain to (default:
        the system's CAs); `server_name`: the name it must carry (default: the URL's host).
        Created by a load, its connections are woken when the load aborts `abort_scope`
        (transport.abort)."""
        parts = urlsplit(uri)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URI: {uri!r}")
        self.uri = uri
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._base = parts.path.rstrip("/")
        self._timeout = timeout
        # A peer's relay reads carry the reading agent's own relay credential.
        self._auth = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        self._policy = policy
        self._checked_as = checked_as or uri
        self._tls = tls
        self._server_name = server_name
        self._abort: LoadAbort | None = LOAD_ABORT.get()
        self._abort_scope = abort_scope

    def _aborted(self) -> LoadError | None:
        return None if self._abort is None else self._abort.error(self._abort_scope)

    def _connection(self) -> http.client.HTTPConnection:
        if not self._https:
            return http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        context = self._tls or ssl.create_default_context()
        return _NamedHTTPSConnection(
            self._host,
            self._port,
            timeout=self._timeout,
            context=context,
            server_name=self._server_name or self._host,
        )

    def _request(
        self, path: str, headers: dict[str, str]
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        conn = self._connection()
        if self._policy is not None:
            guard(conn, self._checked_as, self._policy)
        if self._abort is not None:
            self._abort.watch(conn, self._abort_scope)
        try:
            conn.request("GET", self._base + path, headers={**self._auth, **headers})
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise self._aborted() or LoadError(Reason.SOURCE_UNREACHABLE, f"{self.uri}: {exc}") from None
        aborted = self._aborted()
        if aborted is not None:
            # Aborted while connecting, before there was a socket to shut down.
            conn.close()
            raise aborted
        return conn, resp

    def fetch_manifest(self, version: str, max_bytes: int) -> bytes:
        conn, resp = self._request(f"/{quote(version)}/{MANIFEST_NAME}", {})
        try:
            if resp.status in (401, 403):
                raise LoadError(
                    Reason.SOURCE_UNREACHABLE, f"{self.uri} refused the manifest request (HTTP {resp.status})"
                )
            if resp.status == 404:
                raise LoadError(Reason.VERSION_NOT_FOUND, f"version {version} not found at {self.uri}")
            if resp.status != 200:
                raise LoadError(
                    Reason.SOURCE_UNREACHABLE, f"{self.uri} answered HTTP {resp.status} for the manifest"
                )
            length = resp.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                raise LoadError(
                    Reason.MANIFEST_TOO_LARGE, f"manifest of {version} is {length} bytes, cap {max_bytes}"
                )
            raw = resp.read(max_bytes + 1)
            aborted = self._aborted()
            if aborted is not None:
                raise aborted  # the read ended early because the load was aborted
            if len(raw) > max_bytes:
                raise LoadError(
                    Reason.MANIFEST_TOO_LARGE, f"manifest of {version} exceeds the {max_bytes}-byte cap"
                )
            return raw
        except (OSError, http.client.HTTPException) as exc:
            raise self._aborted() or LoadError(
                Reason.SOURCE_UNREACHABLE, f"reading manifest from {self.uri}: {exc}"
            ) from None
        finally:
            conn.close()

    def open_range(self, version: str, file: str, start: int, end: int) -> ByteStream:
        if start == end:
            return EmptyStream()
        conn, resp = self._request(f"/{quote(version)}/{quote(file)}", {"Range": f"bytes={start}-{end - 1}"})
        try:
            _check_range_response(resp, file, start, end)
        except BaseException:
            conn.close()
            raise
        # Big receive buffers matter for loopback and LAN throughput; the kernel caps the value.
        if conn.sock is not None:
            conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
        return _HttpStream(conn, resp, file, self._aborted)

    def ready(self, version: str, file: str, start: int, end: int) -> tuple[bool, bool]:
        """A relaying agent's `?ready=` answer for bytes [start, end) of `file`: (every tensor
        there verified, the whole copy complete); see relay.http."""
        path = f"/{quote(version)}/{quote(file)}?ready={start}-{end}"
        conn, resp = self._request(path, {})
        try:
            body = resp.read(4096)
        except (OSError, http.client.HTTPException) as exc:
            raise LoadError(Reason.SOURCE_UNREACHABLE, f"{self.uri}: {exc}") from None
        finally:
            conn.close()
        if resp.status != 200:
            raise LoadError(Reason.SOURCE_UNREACHABLE, f"{self.uri} answered HTTP {resp.status} for {file}")
        try:
            answer = json.loads(body)
            return bool(answer["ready"]), bool(answer["complete"])
        except (ValueError, KeyError, TypeError):
            raise LoadError(Reason.SOURCE_UNREACHABLE, f"{self.uri} sent a bad readiness answer") from None

    def close(self) -> None:
        pass


def _check_range_response(resp: http.client.HTTPResponse, file: str, start: int, end: int) -> None:
    if resp.status == 404:
        raise LoadError(Reason.TRUNCATED_SHARD, f"{file} is missing at the source (HTTP 404)")
    if resp.status == 416:
        raise LoadError(Reason.TRUNCATED_SHARD, f"shard {file} at the source is shorter than {end} bytes")
    if resp.status == 200:
        # A server that ignores Range sends the whole file; usable only for a range at offset 0.
        length = resp.length
        if start != 0:
            raise LoadError(Reason.SOURCE_UNREACHABLE, f"source ignored the Range request for {file}")
        if length is not None and length < end:
            raise LoadError(
                Reason.TRUNCATED_SHARD, f"shard {file} at the source is {length} bytes, need {end}"
            )
        return
    if resp.status != 206:
        raise LoadError(Reason.SOURCE_UNREACHABLE, f"source answered HTTP {resp.status} for {file}")
    match = _CONTENT_RANGE.fullmatch(resp.getheader("Content-Range") or "")
    if not match or int(match.group(1)) != start:
        raise LoadError(Reason.SOURCE_UNREACHABLE, f"source sent a bad Content-Range for {file}")
    if int(match.group(2)) + 1 < end:
        # Servers clamp a range to the file size: the shard is shorter than the manifest says.
        raise LoadError(Reason.TRUNCATED_SHARD, f"shard {file} at the source ends at byte {match.group(2)}")
