"""The real node's network: a network namespace of its own, joined to the host by one veth pair.

The kubelet, containerd (so the CNI bridge and every pod's veth) and kube-proxy (so its iptables
rules) all live in that namespace, as on a separate machine: nothing the node programs touches
the host's tables, two clusters on one machine cannot fight over `KUBE-*` chains, and deleting
the namespace takes the bridge, the veths and the rules with it.

Addresses, for claimed index N (1..200; a flock per index, so two live clusters never share one):

| what | address |
| --- | --- |
| host end of the veth (`ckrnNh`): apiserver forwarder, checkpoint source | 10.233.N.1/24 |
| node end (`ckrnNn`, in netns `ckpt-rnN`): the kubelet's node IP | 10.233.N.2/24 |
| pod subnet (CNI bridge `ckptbr0` in the netns, gateway .1) | 10.234.N.0/24 |

The host gets one route, pod subnet via the node end, so tests reach pods by IP as the operator
does; the netns forwards (ip_forward there only). The netns has no default route and the host
does not forward: pods reach the host's two addresses and each other, nothing beyond.

A run that died without cleaning up leaves its netns behind; the index's flock dies with it, so
whoever claims the index next deletes the leftovers first.
"""

from __future__ import annotations

import fcntl
import secrets
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, TextIO

_FIRST, _LAST = 1, 200
NETNS_PREFIX = "ckpt-rn"


class NodeNetError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False, timeout=30)
    if check and done.returncode != 0:
        raise NodeNetError(f"ip {' '.join(args)}: {done.stderr.strip() or done.returncode}")
    return done


def netns_exists(name: str) -> bool:
    return (Path("/run/netns") / name).exists()


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def _lock_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "ckpt-e2e-real-nodes"
    path.mkdir(exist_ok=True)
    return path


def stale_claims() -> Iterator[tuple[NodeNetwork, Path | None]]:
    """Every index no live cluster holds that still has something: a netns, or an owner record
    (the real node's directory, written at claim). Each is yielded locked, with that directory,
    for the caller to clean what it owns; then its netns and record go."""
    indexes = {int(f.stem) for f in _lock_dir().glob("*.owner") if f.stem.isdigit()}
    netns_dir = Path("/run/netns")
    for entry in netns_dir.iterdir() if netns_dir.is_dir() else []:
        tail = entry.name.removeprefix(NETNS_PREFIX)
        if entry.name.startswith(NETNS_PREFIX) and tail.isdigit():
            indexes.add(int(tail))
    for index in sorted(indexes):
        handle = open(_lock_dir() / f"{index}.lock", "w")  # noqa: SIM115 - closed by release()
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue  # a live cluster's
        net = NodeNetwork(index, handle)
        try:
            yield net, net.owner()
            net.remove_leftovers()
        finally:
            net.release()


@dataclass
class NodeNetwork:
    index: int
    _lock: TextIO | None = field(default=None, repr=False)
    created: bool = False

    @property
    def netns(self) -> str:
        return f"{NETNS_PREFIX}{self.index}"

    @property
    def netns_path(self) -> Path:
        return Path("/run/netns") / self.netns

    @property
    def host_if(self) -> str:
        return f"ckrn{self.index}h"

    @property
    def node_if(self) -> str:
        return f"ckrn{self.index}n"

    @property
    def host_ip(self) -> str:
        return f"10.233.{self.index}.1"

    @property
    def node_ip(self) -> str:
        return f"10.233.{self.index}.2"

    @property
    def pod_subnet(self) -> str:
        return f"10.234.{self.index}.0/24"

    @property
    def pod_gateway(self) -> str:
        return f"10.234.{self.index}.1"

    bridge: ClassVar[str] = "ckptbr0"  # inside the netns: one per node, so a fixed name

    def exec_argv(self, argv: list[str]) -> list[str]:
        """`argv` inside the node's netns only. nsenter, not `ip netns exec`: the latter also
        gives the command a mount namespace of its own, and the kubelet's volume mounts must be
        seen by containerd and by the host's teardown."""
        return ["nsenter", f"--net={self.netns_path}", "--", *argv]

    # ------------------------------------------------------------------ lifecycle

    @property
    def owner_file(self) -> Path:
        return _lock_dir() / f"{self.index}.owner"

    def owner(self) -> Path | None:
        """The directory of the real node that claimed this index (kept until release)."""
        try:
            return Path(self.owner_file.read_text().strip())
        except OSError:
            return None

    @classmethod
    def claim(cls, owner: Path) -> NodeNetwork:
        """An index no live cluster holds and no dead one left unswept (realnode.sweep_stale);
        its netns leftovers are removed. `owner`, the node's directory, is recorded so a sweep
        after a SIGKILL finds what to clean."""
        lock_dir = _lock_dir()
        candidates = list(range(_FIRST, _LAST + 1))
        secrets.SystemRandom().shuffle(candidates)
        for index in candidates:
            handle = open(lock_dir / f"{index}.lock", "w")  # noqa: SIM115 - held until release()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            net = cls(index, handle)
            if net.owner() is not None:  # a dead run's node, not swept yet: not ours to reuse
                handle.close()
                continue
            net.remove_leftovers()
            net.owner_file.write_text(str(owner))
            return net
        raise NodeNetError(f"no free real-node network index in {_FIRST}..{_LAST}")

    def remove_leftovers(self) -> None:
        if netns_exists(self.netns):
            _ip("netns", "del", self.netns, check=False)
        if link_exists(self.host_if):
            _ip("link", "del", self.host_if, check=False)

    def create(self) -> None:
        self.created = True  # from the first step on, so a failure midway is undone by destroy()
        _ip("netns", "add", self.netns)
        _ip("-n", self.netns, "link", "set", "lo", "up")
        _ip("link", "add", self.host_if, "type", "veth", "peer", "name", self.node_if, "netns", self.netns)
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.host_if)
        _ip("link", "set", self.host_if, "up")
        _ip("-n", self.netns, "addr", "add", f"{self.node_ip}/24", "dev", self.node_if)
        _ip("-n", self.netns, "link", "set", self.node_if, "up")
        _ip("route", "add", self.pod_subnet, "via", self.node_ip, "dev", self.host_if)
        # Routing between pods and the host happens in the node's netns alone.
        sysctl = subprocess.run(
            self.exec_argv(["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]),
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        if sysctl.returncode != 0:
            raise NodeNetError(f"ip_forward in {self.netns}: {sysctl.stderr.strip()}")

    def destroy(self) -> list[str]:
        """Delete the netns (its bridge, pod veths and iptables rules go with it; so do the veth
        pair and the host route); returns what is still there."""
        if self.created:
            _ip("netns", "del", self.netns, check=False)
            if link_exists(self.host_if):  # the pair goes with its netns end; this is belt and braces
                _ip("link", "del", self.host_if, check=False)
            self.created = False
        return self.leftovers()

    def leftovers(self) -> list[str]:
        left = []
        if netns_exists(self.netns):
            left.append(f"netns {self.netns}")
        if link_exists(self.host_if):
            left.append(f"link {self.host_if}")
        routes = _ip("route", "show", self.pod_subnet, check=False).stdout.strip()
        if routes:
            left.append(f"route {routes}")
        return left

    def release(self) -> None:
        """Give the index up; its owner record goes first (what it named is gone or swept)."""
        if self._lock is not None:
            self.owner_file.unlink(missing_ok=True)
            self._lock.close()
            self._lock = None
