"""`mooncake://host:port` sources: bytes move through the Mooncake transfer engine.

`host:port` is the server's HTTP control endpoint (`ckpt-rollout serve --mooncake ...`, or a
relaying agent): one `GET /v1/mooncake/<version>` returns the manifest and where each shard
sits in the server's registered memory (see `ckpt_agent.transport.mooncake.descriptor`). Reads are
batched `batch_transfer_sync_read` calls from the server's memory into a registered bounce
buffer, copied from there into the caller's buffer.

Never into the caller's buffer directly: the engine serves every registered region to anyone
who reaches its port, reads and writes alike, with no credential (Mooncake has none), so
registered memory is writable by any pod on the network. The loader hashes and applies the
caller's buffer: kept unregistered, the bytes it checked are the bytes it applies. A write
into the bounce buffer mid-read only makes the tensor fail its checksum.

The descriptor's `session` (where the engine connects) must name the URI's own host and pass the
source policy like the URI did: a server cannot send this agent's engine elsewhere.

A version's non-weight files (config, tokenizer, index: small, read once) are not in the
descriptor; they come over plain HTTP from the same endpoint, where both a source
(`/<version>/<file>`) and a relaying agent (`/v1/relay/<version>/<file>`) serve them.
"""

from __future__ import annotations

import bisect
import contextlib
import http.client
import ipaddress
import socket
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from urllib.parse import quote, urlsplit

import numpy as np

from ckpt_agent.common.errors import LoadError, Reason
from ckpt_agent.formats.manifest import DEFAULT_MAX_MANIFEST_BYTES
from ckpt_agent.transport.base import ByteStream, EmptyStream
from ckpt_agent.transport.guard import guard
from ckpt_agent.transport.http import HttpTransport
from ckpt_agent.transport.mooncake import runtime
from ckpt_agent.transport.mooncake.descriptor import (
    Descriptor,
    ExportedFile,
    InvalidDescriptor,
    parse_descriptor,
)
from ckpt_api.source_policy import SourcePolicy, SourceRefused

DESCRIPTOR_PATH = "/v1/mooncake"
# Two halves of 16 MiB: two of the engine's 8 MiB slices (MC_TCP_SLICE_SIZE) in flight at once.
BOUNCE_BYTES = 32 << 20
# Per-shard extents of a relayed version make the descriptor larger than the manifest.
_DESCRIPTOR_SLACK = 2


def _same_host(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a) == ipaddress.ip_address(b)
    except ValueError:
        return a == b


class _MooncakeStream:
    # See reader._read_tensor: one batched transfer per tensor, not per chunk.
    prefers_whole_tensors = True

    def __init__(
        self,
        engine: runtime.MooncakeEngine,
        session: str,
        shard: ExportedFile,
        name: str,
        start: int,
        end: int,
        wait_ready: Callable[[int, int], None] | None = None,
    ) -> None:
        # `wait_ready(lo, hi)`: returns once a peer still loading has verified bytes [lo, hi).
        self._wait_ready = wait_ready
        self._engine = engine
        self._session = session
        self._extents = shard.extents
        self._offsets = [e.file_offset for e in shard.extents]
        self._name = name
        self._pos = start
        self._end = end
        self._bounce: _Bounce | None = None
        self._pool: ThreadPoolExecutor | None = None

    def _plan(self, pos: int, nbytes: int) -> list[tuple[int, int, int]]:
        """(offset in the read, remote address, length) for the covered parts of [pos, pos+nbytes)."""
        pieces = []
        i = max(bisect.bisect_right(self._offsets, pos) - 1, 0)
        end = pos + nbytes
        while i < len(self._extents) and self._extents[i].file_offset < end:
            ext = self._extents[i]
            lo, hi = max(pos, ext.file_offset), min(end, ext.file_end)
            if lo < hi:
                pieces.append((lo - pos, ext.addr + lo - ext.file_offset, hi - lo))
            i += 1
        return pieces

    def _transfer(self, local: int, pos: int, nbytes: int, dest: memoryview) -> None:
        pieces = self._plan(pos, nbytes)
        covered = sum(p[2] for p in pieces)
        if covered < nbytes:
            # Bytes between tensors (header, padding) are not published: not tensor data.
            dest[:nbytes] = bytes(nbytes)
        if not pieces:
            return
        rc = self._engine.read(
            self._session, [local + p[0] for p in pieces], [p[1] for p in pieces], [p[2] for p in pieces]
        )
        if rc < 0:
            raise LoadError(
                Reason.SOURCE_UNREACHABLE,
                f"mooncake read of {self._name} bytes {pos}-{pos + nbytes} from {self._session} "
                f"failed (rc={rc})",
            )

    def readinto(self, buf: memoryview) -> None:
        self.readinto_landed(buf, None)

    def readinto_landed(self, buf: memoryview, landed: Callable[[memoryview], None] | None) -> None:
        """`readinto`, calling `landed(part)` for each part of `buf` in order once it is copied in,
        while the engine transfers the next: a caller hashing there hides the hash behind the
        transfer, over memory that is its own by then."""
        want = buf.nbytes
        if self._pos + want > self._end:
            raise ValueError("read past the end of the requested range")
        if want == 0:
            return
        if self._wait_ready is not None:
            self._wait_ready(self._pos, self._pos + want)
        bounce = self._bounce_buffer()
        if want <= bounce.half:
            bounce.fill(0, self._pos, want)
            bounce.copy_out(0, buf)
            if landed is not None:
                landed(buf)
        else:
            self._read_pipelined(bounce, buf, landed)
        self._pos += want

    def _read_pipelined(
        self, bounce: _Bounce, buf: memoryview, landed: Callable[[memoryview], None] | None
    ) -> None:
        """Two halves: the engine fills one while this thread copies the other out, so the copy
        hides behind the transfer (both release the GIL)."""
        pool = self._pool or ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-mooncake")
        self._pool = pool
        step = bounce.half
        landing: tuple[int, int, Future[None]] | None = None
        try:
            for k, off in enumerate(range(0, buf.nbytes, step)):
                n = min(step, buf.nbytes - off)
                filling = (k % 2, off, pool.submit(bounce.fill, k % 2, self._pos + off, n))
                if landing is not None:
                    self._copy_landed(bounce, buf, landing, landed)
                landing = filling
            if landing is not None:
                self._copy_landed(bounce, buf, landing, landed)
                landing = None
        finally:
            if landing is not None:
                # A failure left a transfer in flight: the bounce buffer is not free until it ends.
                with contextlib.suppress(BaseException):
                    landing[2].result()

    @staticmethod
    def _copy_landed(
        bounce: _Bounce,
        buf: memoryview,
        landing: tuple[int, int, Future[None]],
        landed: Callable[[memoryview], None] | None,
    ) -> None:
        half, off, future = landing
        future.result()
        part = buf[off : off + min(bounce.half, buf.nbytes - off)]
        bounce.copy_out(half, part)
        if landed is not None:
            landed(part)

    def _bounce_buffer(self) -> _Bounce:
        if self._bounce is None:
            self._bounce = _Bounce(self._engine, self._transfer)
        return self._bounce

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if self._bounce is not None:
            self._bounce.release()
            self._bounce = None


class _Bounce:
    """Registered memory reads land in, in two halves; nothing read from it is trusted before it
    is copied out into the caller's (unregistered) buffer and hashed there."""

    def __init__(self, engine: runtime.MooncakeEngine, transfer: Callable[[int, int, int, memoryview], None]):
        self.half = BOUNCE_BYTES // 2
        self._engine = engine
        self._transfer = transfer
        self._array = np.empty(BOUNCE_BYTES, dtype=np.uint8)
        self._addr = int(self._array.ctypes.data)
        engine.register(self._addr, self._array.nbytes)

    def fill(self, half: int, pos: int, nbytes: int) -> None:
        lo = half * self.half
        self._transfer(self._addr + lo, pos, nbytes, self._array.data[lo : lo + nbytes])

    def copy_out(self, half: int, dest: memoryview) -> None:
        lo = half * self.half
        np.copyto(np.frombuffer(dest, dtype=np.uint8), self._array[lo : lo + dest.nbytes])

    def release(self) -> None:
        self._engine.unregister(self._addr)


class MooncakeTransport:
    # What the server's engine serves anyone can write (see the module docstring): the pipeline
    # checks every byte against the manifest's sha256 (`transport.base.is_untrusted`).
    untrusted_bytes = True

    def __init__(
        self,
        uri: str,
        *,
        bearer: str | None = None,
        timeout: float = 30.0,
        files_path: str = "",
        policy: SourcePolicy | None = None,
    ) -> None:
        """`files_path`: where the endpoint serves a version's files over HTTP ("" for a
        source, the relay prefix for a peer agent). `policy`: the agent's source policy, which
        judges a peer as it does a source."""
        parts = urlsplit(uri)
        if parts.scheme != "mooncake" or not parts.hostname or parts.port is None:
            raise ValueError(f"not a mooncake://host:port URI: {uri!r}")
        runtime.check_available()
        self.uri = uri
        self._host = parts.hostname
        self._port = parts.port
        host = f"[{self._host}]" if ":" in self._host else self._host
        self._files = HttpTransport(
            f"http://{host}:{self._port}{files_path}",
            timeout=timeout,
            bearer=bearer,
            policy=policy,
            checked_as=uri,
        )
        self._policy = policy
        self._headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        self._timeout = timeout
        self._descriptors: dict[str, Descriptor] = {}
        # A peer agent's copy may be a load still running (pipelined relay), until it says not.
        self._peer = bool(files_path)
        self._complete: set[str] = set()

    def _descriptor(self, version: str, max_manifest_bytes: int) -> Descriptor:
        cached = self._descriptors.get(version)
        if cached is not None:
            return cached
        conn = http.client.HTTPConnection(self._host, self._port, timeout=self._timeout)
        if self._policy is not None:
            guard(conn, self.uri, self._policy)
        try:
            conn.request("GET", f"{DESCRIPTOR_PATH}/{quote(version)}", headers=self._headers)
            resp = conn.getresponse()
            cap = max_manifest_bytes * _DESCRIPTOR_SLACK + (1 << 20)
            body = resp.read(cap + 1)
        except (OSError, http.client.HTTPException) as exc:
            raise LoadError(Reason.SOURCE_UNREACHABLE, f"{self.uri}: {exc}") from None
        finally:
            conn.close()
        if resp.status == 404:
            # The body is not echoed: a source may be any host, and its replies are not ours to show.
            raise LoadError(Reason.VERSION_NOT_FOUND, f"version {version} not found at {self.uri}")
        if resp.status != 200:
            raise LoadError(Reason.SOURCE_UNREACHABLE, f"{self.uri} answered HTTP {resp.status}")
        if len(body) > cap:
            raise LoadError(
                Reason.MANIFEST_TOO_LARGE, f"the mooncake descriptor of {version} exceeds {cap} bytes"
            )
        try:
            descriptor = parse_descriptor(body)
        except InvalidDescriptor as exc:
            raise LoadError(Reason.SOURCE_UNREACHABLE, f"{self.uri} sent a bad descriptor: {exc}") from None
        self._check_session(descriptor.session)
        self._descriptors[version] = descriptor
        return descriptor

    def _check_session(self, session: str) -> None:
        """The engine connects to the descriptor's `session`: only the URI's own host, at an
        address the source policy allows for the URI (the ports are the engine's own choice,
        so a rule's port cannot apply to them)."""
        host, _, port = session.rpartition(":")
        host = host.removeprefix("[").removesuffix("]").lower()
        if not _same_host(host, self._host):
            raise LoadError(
                Reason.SOURCE_UNREACHABLE,
                f"{self.uri} named {session!r} as where to read its bytes; this agent reads a "
                f"Mooncake server only at its own host {self._host}",
            )
        if self._policy is None:
            return
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except OSError as exc:
            raise LoadError(Reason.SOURCE_UNREACHABLE, f"{self.uri}: {session}: {exc}") from None
        for *_, sockaddr in infos:
            try:
                self._policy.check_address(self.uri, ipaddress.ip_address(sockaddr[0]))
            except SourceRefused as exc:
                raise LoadError(
                    Reason.SOURCE_UNREACHABLE, f"{self.uri}: its data connection {session}: {exc}"
                ) from None

    def fetch_manifest(self, version: str, max_bytes: int) -> bytes:
        raw = self._descriptor(version, max_bytes).manifest
        if len(raw) > max_bytes:
            raise LoadError(
                Reason.MANIFEST_TOO_LARGE, f"manifest of {version} exceeds the {max_bytes}-byte cap"
            )
        return raw

    def _engine(self, protocol: runtime.Protocol) -> runtime.MooncakeEngine:
        try:
            return runtime.engine_for(protocol)
        except runtime.MooncakeUnavailable as exc:
            raise LoadError(Reason.SOURCE_UNREACHABLE, str(exc)) from None

    def open_range(self, version: str, file: str, start: int, end: int) -> ByteStream:
        if start == end:
            return EmptyStream()
        descriptor = self._descriptor(version, DEFAULT_MAX_MANIFEST_BYTES)
        shard = descriptor.files.get(file)
        if shard is None:
            # Not a registered shard: an extra file, or a shard the source could not map (its
            # HTTP side then answers 404, TruncatedShard, as a missing shard should).
            return self._files.open_range(version, file, start, end)
        if shard.size < end:
            raise LoadError(
                Reason.TRUNCATED_SHARD, f"shard {file} at {self.uri} is {shard.size} bytes, need {end}"
            )
        engine = self._engine(descriptor.protocol)
        waits = self._peer and version not in self._complete
        return _MooncakeStream(
            engine,
            descriptor.session,
            shard,
            file,
            start,
            end,
            wait_ready=(lambda lo, hi: self._wait_ready(version, file, lo, hi)) if waits else None,
        )

    def _wait_ready(self, version: str, file: str, start: int, end: int) -> None:
        """A peer that relays while it loads registered memory it is still filling: read a
        tensor only once it says it verified it, within this transport's timeout."""
        if version in self._complete:
            return
        deadline = time.monotonic() + self._timeout
        while True:
            ready, complete = self._files.ready(version, file, start, end)
            if complete:
                self._complete.add(version)
            if ready:
                return
            if time.monotonic() > deadline:
                raise LoadError(
                    Reason.SOURCE_UNREACHABLE,
                    f"{self.uri} has not verified bytes {start}-{end} of {file} within {self._timeout:g}s",
                )

    def close(self) -> None:
        self._files.close()
