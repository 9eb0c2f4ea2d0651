"""One Mooncake TransferEngine per process and protocol, in P2P handshake mode.

P2P handshake mode ("P2PHANDSHAKE" as the metadata server) needs no etcd/HTTP metadata service:
a reader names its peer by `host:rpc_port` and the engines exchange segment descriptors
directly. The same engine both serves registered memory (sources, relaying agents) and reads
from peers. Protocol `rdma` is for production NICs; `tcp` runs anywhere (tests, CI).

The `mooncake` package is imported lazily and behind a guard: without it (or without the system
libraries its engine.so links, see scripts/install-system-deps.sh) everything else in the agent
works and a mooncake URI is refused with `MooncakeUnavailable`'s message.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

Protocol = Literal["tcp", "rdma"]
PROTOCOLS: tuple[Protocol, ...] = ("tcp", "rdma")

# Engine defaults applied before the engine is created (the caller's environment wins).
# MC_TCP_SLICE_SIZE: the TCP transport cuts transfers into 64 KiB slices by default, which
# measured 3-4x slower than 8 MiB slices on loopback here (per-slice overhead dominates).
# GLOG_minloglevel=1: the engine logs every connection at INFO on stderr.
_ENV_DEFAULTS = {"MC_TCP_SLICE_SIZE": str(8 << 20), "GLOG_minloglevel": "1"}

INSTALL_HINT = (
    "install the agent extra (mooncake-transfer-engine-non-cuda; mooncake-transfer-engine on CUDA) "
    "and its system libraries (scripts/install-system-deps.sh: libibverbs1 librdmacm1 libnuma1)"
)


class MooncakeUnavailable(RuntimeError):
    """The transfer engine cannot be used here (package or system library missing, init failed)."""


_import_lock = threading.Lock()
_engine_class: Any = None
_import_error: str | None = None


def _engine_cls() -> Any:
    global _engine_class, _import_error
    with _import_lock:
        if _engine_class is None and _import_error is None:
            for key, value in _ENV_DEFAULTS.items():
                os.environ.setdefault(key, value)
            try:
                from mooncake.engine import TransferEngine

                _engine_class = TransferEngine
            except ImportError as exc:  # the package, or a library engine.so links (libibverbs)
                _import_error = str(exc)
    if _engine_class is None:
        raise MooncakeUnavailable(
            f"the Mooncake transfer engine is not usable: {_import_error}; {INSTALL_HINT}"
        )
    return _engine_class


def check_available() -> None:
    _engine_cls()


def address_of(view: memoryview) -> int:
    """The address of a buffer's first byte (read-only buffers too)."""
    if view.nbytes == 0:
        return 0
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


# Bind-all addresses: not something a peer can connect to.
UNSPECIFIED_HOSTS = frozenset({"", "0.0.0.0", "::", "[::]"})


@dataclass
class _Settings:
    hostname: str = "127.0.0.1"
    device: str = ""


_settings = _Settings()


def configure(*, hostname: str | None = None, device: str | None = None) -> None:
    """Set the address peers reach this process's engines at (the pod IP) and the RDMA device
    list (empty: let the engine discover). Only engines created afterwards see it."""
    if hostname is not None:
        _settings.hostname = hostname
    if device is not None:
        _settings.device = device


class MooncakeEngine:
    def __init__(self, protocol: Protocol, hostname: str, device: str = "") -> None:
        if protocol not in PROTOCOLS:
            raise ValueError(f"mooncake protocol must be one of {PROTOCOLS}, got {protocol!r}")
        self._engine = _engine_cls()()
        rc = self._engine.initialize(hostname, "P2PHANDSHAKE", protocol, device)
        if rc != 0:
            raise MooncakeUnavailable(f"Mooncake engine init ({protocol} on {hostname}) failed with rc={rc}")
        self.protocol: Protocol = protocol
        self.session = f"{hostname}:{self._engine.get_rpc_port()}"
        self._lock = threading.Lock()
        # Registered regions, sorted by start address, with a use count (the same arena may be
        # registered by a load and by the relay that keeps it).
        self._starts: list[int] = []
        self._regions: dict[int, tuple[int, int]] = {}  # start -> (nbytes, uses)

    def register(self, addr: int, nbytes: int) -> None:
        with self._lock:
            known = self._regions.get(addr)
            if known is not None and known[0] == nbytes:
                self._regions[addr] = (nbytes, known[1] + 1)
                return
            rc = self._engine.register_memory(addr, nbytes)
            if rc != 0:
                raise MooncakeUnavailable(f"registering {nbytes} bytes with Mooncake failed (rc={rc})")
            bisect.insort(self._starts, addr)
            self._regions[addr] = (nbytes, 1)

    def unregister(self, addr: int) -> None:
        with self._lock:
            known = self._regions.get(addr)
            if known is None:
                return
            if known[1] > 1:
                self._regions[addr] = (known[0], known[1] - 1)
                return
            del self._regions[addr]
            self._starts.remove(addr)
            self._engine.unregister_memory(addr)

    def covers(self, addr: int, nbytes: int) -> bool:
        """Is [addr, addr+nbytes) inside one registered region?"""
        with self._lock:
            i = bisect.bisect_right(self._starts, addr) - 1
            if i < 0:
                return False
            start = self._starts[i]
            return addr + nbytes <= start + self._regions[start][0]

    def read(self, session: str, local: Sequence[int], remote: Sequence[int], lengths: Sequence[int]) -> int:
        """One batched synchronous read; returns the engine's status (negative on failure).
        The engine releases the GIL while it waits."""
        return int(self._engine.batch_transfer_sync_read(session, list(local), list(remote), list(lengths)))


_engines: dict[Protocol, MooncakeEngine] = {}
_engines_lock = threading.Lock()


def engine_for(protocol: Protocol) -> MooncakeEngine:
    """The process's engine for `protocol`, created on first use."""
    with _engines_lock:
        engine = _engines.get(protocol)
        if engine is None:
            engine = MooncakeEngine(protocol, _settings.hostname, _settings.device)
            _engines[protocol] = engine
        return engine
