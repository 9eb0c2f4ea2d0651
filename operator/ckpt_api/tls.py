"""TLS between the operator, agents and peers: the name agents' serving certificates carry, and
SSL contexts that follow their files as cert-manager or the kubelet rotate them.

Pod IPs change with every pod, so a certificate cannot name them: every agent of a namespace
serves a certificate for one stable DNS name, and callers connect to the pod IP while verifying
that name (TLS SNI and hostname check), never the IP.
"""

from __future__ import annotations

import os
import ssl
import threading
from collections.abc import Callable
from pathlib import Path

MIN_TLS_VERSION = ssl.TLSVersion.TLSv1_2
# The Secrets of agent TLS as the chart names them for release `ckpt-rollout` (agentTLS.secretName
# in each worker namespace; <fullname>-agent-ca in the operator's) and `tls-secrets` prints them.
AGENT_TLS_SECRET = "ckpt-rollout-agent-tls"  # noqa: S105 - the name of a Secret, not a secret
AGENT_CA_SECRET = "ckpt-rollout-agent-ca"  # noqa: S105 - the name of a Secret, not a secret


def agent_server_name(namespace: str) -> str:
    """The DNS name in the serving certificate of every agent of ``namespace`` (the chart's
    cert-manager Certificate and generated certificate use it; callers verify against it)."""
    return f"ckpt-rollout-agent.{namespace}.svc"


class TLSFileError(ValueError):
    """A certificate, key or CA file that cannot be read or used; says which and why."""


def _stamp(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...]:
    # A Secret volume swaps its files in with a symlink rename: stat follows it, so a rotation
    # changes mtime (and usually size) of what the path names.
    try:
        return tuple((s.st_ino, s.st_mtime_ns, s.st_size) for s in (os.stat(p) for p in paths))
    except OSError as exc:
        raise TLSFileError(f"cannot read {exc.filename}: {exc.strerror}") from None


class ReloadingContext:
    """An SSLContext rebuilt from its files when they change. Until a rebuild succeeds (a
    rotation caught half-written: the new certificate with the old key), the last good context
    stays in use."""

    def __init__(self, paths: tuple[Path, ...], build: Callable[[], ssl.SSLContext]) -> None:
        self._paths = paths
        self.build = build
        self._lock = threading.Lock()
        self._stamp = _stamp(paths)
        self._context = build()  # the first build's error is the caller's: bad files stop a start
        self.reloads = 0

    def current(self) -> ssl.SSLContext:
        with self._lock:
            try:
                stamp = _stamp(self._paths)
            except TLSFileError:
                return self._context
            if stamp != self._stamp:
                try:
                    self._context = self.build()
                except (OSError, ssl.SSLError, TLSFileError):
                    return self._context  # stamp kept: the next handshake tries again
                self._stamp = stamp
                self.reloads += 1
            return self._context


def server_context(cert_file: Path, key_file: Path) -> ReloadingContext:
    """The agent's serving context (TLS 1.2 or later), following rotations of its files: new
    connections get the new certificate, open ones keep theirs."""

    def build() -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = MIN_TLS_VERSION
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as exc:
            raise TLSFileError(f"cannot load certificate {cert_file} with key {key_file}: {exc}") from None
        return ctx

    return ReloadingContext((cert_file, key_file), build)


def listening_context(cert_file: Path, key_file: Path) -> tuple[ssl.SSLContext, ReloadingContext]:
    """The context a server listens with, and the files it follows: each new connection's
    handshake switches to the files' current context (``sni_callback`` runs once per
    handshake, whether or not the client sends SNI)."""
    files = server_context(cert_file, key_file)

    def switch(sock: ssl.SSLObject | ssl.SSLSocket, _name: str | None, _ctx: ssl.SSLContext) -> None:
        sock.context = files.current()

    # OpenSSL wants a certificate on the listening context itself before the callback runs.
    listening = files.build()  # a context of its own, never one current() hands out
    listening.sni_callback = switch
    return listening, files


def ca_context(ca_file: Path) -> ReloadingContext:
    """A client context trusting only ``ca_file`` (TLS 1.2 or later, hostname checked),
    re-read when the file changes (a CA rotation distributes the new bundle first)."""

    def build() -> ssl.SSLContext:
        try:
            ctx = ssl.create_default_context(cafile=str(ca_file))
        except (OSError, ssl.SSLError) as exc:
            raise TLSFileError(f"cannot load CA bundle {ca_file}: {exc}") from None
        ctx.minimum_version = MIN_TLS_VERSION
        return ctx

    return ReloadingContext((ca_file,), build)
