"""Child processes that cannot outlive the harness, and bounded waits.

Every child gets its own session (process group), so stopping it also stops whatever it
spawned, and a parent-death signal, so a SIGKILLed pytest does not leave an apiserver behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

_PR_SET_PDEATHSIG = 1


class WaitTimeout(AssertionError):
    """A bounded wait ran out; the message says what was awaited and what was last seen."""


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `predicate` until it returns a truthy value (returned) or `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        last = predicate()
        if last:
            return last
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def _load_prctl() -> Callable[..., int] | None:
    # Resolved once in the parent: dlopen after fork() in a threaded process can deadlock.
    try:
        return ctypes.CDLL(None, use_errno=True).prctl  # type: ignore[no-any-return]
    except (OSError, AttributeError):  # not Linux: normal teardown still applies
        return None


_PRCTL = _load_prctl()


def _die_with_parent() -> None:
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def spawn(
    argv: Sequence[str | os.PathLike[str]],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start `argv` in its own process group, stdout+stderr appended to `log_path`.

    The parent-death signal fires when the *thread* that spawned the child exits, so spawn
    only from threads that live as long as the child should.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [str(a) for a in argv],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # prctl has no Popen equivalent
        )


def all_threads_stopped(pid: int) -> bool:
    """Whether every thread of `pid` is in the stopped state (T). kill(SIGSTOP) returns before
    the group stop completes: each thread stops on its way back to user space."""
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
        states = [(t / "stat").read_text().rpartition(")")[2].split()[0] for t in tasks]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return bool(states) and all(state == "T" for state in states)


def stop(proc: subprocess.Popen[bytes], grace: float = 5.0) -> int:
    """SIGTERM the child's process group, SIGKILL it after `grace` seconds; return the exit code."""
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
    # Grandchildren may linger after the leader exited; the group id is still the leader's pid.
    _signal_group(proc.pid, signal.SIGKILL)
    return proc.returncode


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class PortReservation:
    """Ports kept bound (never listening) with SO_REUSEADDR, for children that cannot bind port 0
    and report it (etcd, kube-apiserver, the operator's probe ports).

    While held, the kernel gives these ports to no one else (no bind to port 0, no outgoing
    connection's local port, no explicit bind without SO_REUSEADDR), yet a child that binds them
    with SO_REUSEADDR, as Go's, asyncio's and http.server's listeners all do, still can; and a
    connection to a held port nobody listens on is refused. Hold it as long as the children may
    need the ports (a restart binds them again); `release` or the context's end frees them.
    """

    def __init__(self, count: int, host: str = "127.0.0.1") -> None:
        self._socks: list[socket.socket] = []
        try:
            for _ in range(count):
                s = socket.socket()
                self._socks.append(s)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, 0))
        except BaseException:
            self.release()
            raise
        self.ports: list[int] = [int(s.getsockname()[1]) for s in self._socks]

    def release(self) -> None:
        for s in self._socks:
            s.close()
        self._socks.clear()

    def __enter__(self) -> PortReservation:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


# What serve_until_signalled prints once a server listens: "<banner> on http://host:port".
_ANNOUNCED_URL = re.compile(r" on (https?://[^\s/]+)$")


def spawn_server(
    argv: Sequence[str | os.PathLike[str]],
    log_path: Path,
    what: str,
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    timeout: float = 60.0,
) -> tuple[subprocess.Popen[bytes], str]:
    """`spawn` a server told to bind port 0 (`--port 0`); return it with the URL it announces.

    No port is picked beforehand, so none can be taken meanwhile. Fails with the log's tail if
    the child exits before announcing, and stops the child if the wait fails.
    """
    start = log_path.stat().st_size if log_path.exists() else 0  # the log is appended to
    proc = spawn(argv, log_path, env=env, cwd=cwd)

    def announced() -> str | None:
        exited = proc.poll()
        text = log_path.read_bytes()[start:].decode(errors="replace")
        for line in text.splitlines():
            match = _ANNOUNCED_URL.search(line.rstrip())
            if match:
                return match.group(1)
        if exited is not None:
            raise RuntimeError(
                f"{what} exited with {exited} before listening; log tail ({log_path}):\n{text[-3000:]}"
            )
        return None

    try:
        return proc, wait_for(announced, timeout, f"{what} to announce its URL")
    except BaseException:
        stop(proc)
        raise


def listening_ports(pids: set[int] | None = None) -> set[tuple[str, int]]:
    """(ip, port) of TCP listeners, read from /proc (no ss/lsof needed).

    With `pids`, only sockets those processes hold: other users of the machine listen too.
    """
    inodes = None if pids is None else _socket_inodes(pids)
    found: set[tuple[str, int]] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # TCP_LISTEN
                continue
            if inodes is not None and fields[9] not in inodes:
                continue
            addr_hex, port_hex = fields[1].split(":")
            found.add((_decode_ip(addr_hex), int(port_hex, 16)))
    return found


def _socket_inodes(pids: set[int]) -> set[str]:
    inodes: set[str] = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def _decode_ip(addr_hex: str) -> str:
    if len(addr_hex) == 8:
        return socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr_hex)[::-1])
    raw = bytes.fromhex(addr_hex)
    # /proc stores IPv6 as four little-endian 32-bit words.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def descendants(pid: int) -> set[int]:
    """All live descendants of `pid`, from /proc (children files or the ppid field)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The comm field may contain spaces and parens; ppid is the 2nd field after the last ')'.
        fields = stat.rsplit(")", 1)[1].split()
        if fields[0] == "Z":
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists (someone else's counts: EPERM means it does)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
