"""Waking a load's blocked reads, so that a load can be stopped part way.

A read from a socket returns once its whole buffer is full (http.client fills a whole chunk), so
a source that trickles a byte a second never returns to the reader's cancel check between
chunks; its per-read timeout never fires either. The load's task sets a `LoadAbort`
(`LOAD_ABORT`, a context variable like the source policy, seen by the threads the load starts);
transports created under it watch their connections, and `abort` shuts those sockets down: the
blocked read wakes and raises the abort's error instead of its own.

Two scopes: a slow peer is dropped alone (`PEER`: the load goes on from the source), anything
else stops the whole load (every scope).
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import weakref
from contextvars import ContextVar

from ckpt_agent.common.errors import LoadError

SOURCE = "source"
PEER = "peer"
SCOPES = (SOURCE, PEER)


class LoadAbort:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[str, weakref.WeakSet[http.client.HTTPConnection]] = {
            scope: weakref.WeakSet() for scope in SCOPES
        }
        self._errors: dict[str, LoadError] = {}

    def watch(self, conn: http.client.HTTPConnection, scope: str) -> None:
        """Shut `conn` down when `scope` is aborted (at once if it was already)."""
        with self._lock:
            self._watched[scope].add(conn)
            aborted = scope in self._errors
        if aborted:
            _shut(conn)

    def error(self, scope: str) -> LoadError | None:
        """What a read of `scope` raises once aborted (None: not aborted)."""
        with self._lock:
            return self._errors.get(scope)

    def abort(self, error: LoadError, scope: str | None = None) -> None:
        """Stop the reads of `scope` (None: of every scope) with `error`; the first error of a
        scope is kept."""
        with self._lock:
            scopes = SCOPES if scope is None else (scope,)
            conns: list[http.client.HTTPConnection] = []
            for name in scopes:
                self._errors.setdefault(name, error)
                conns.extend(self._watched[name])
        for conn in conns:
            _shut(conn)


def _shut(conn: http.client.HTTPConnection) -> None:
    sock = conn.sock
    if sock is None:
        return
    # shutdown, not close: it wakes a recv blocked in another thread; the owner closes. OSError:
    # not connected (yet, or any more), nothing to wake.
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


# None: reads under no load (a restore of the previous version must never be woken by the abort of
# the load it undoes).
LOAD_ABORT: ContextVar[LoadAbort | None] = ContextVar("load_abort", default=None)
