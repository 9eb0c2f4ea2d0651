"""Private networks of Linux network namespaces for benches (`bench fleet`): a bridge in its
own namespace and, per member, a namespace joined to it by a veth pair whose two ends are
rate-limited with tc (tbf), so each member's uplink and downlink are capped.

No interface, address or route is ever created in the caller's namespace, and every namespace
is named `<prefix>-<member>` with a prefix that embeds the owning PID: `destroy` deletes them
all, and `sweep_stale` deletes those whose owner died without cleaning up. Needs root and
iproute2 (`ip`, `tc`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import dataclass

from ckpt_e2e.procs import pid_alive

NS_PREFIX = "ckfleet"
_OWNED = re.compile(rf"^{NS_PREFIX}(\d+)-")


class NetnsError(RuntimeError):
    pass


def missing_prerequisites() -> str | None:
    """Why namespaces cannot be built here, or None."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (iproute2; scripts/install-system-deps.sh installs it)"
    return None


def _run(*argv: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


def _list_namespaces() -> list[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def sweep_stale() -> list[str]:
    """Delete namespaces left by bench runs whose process is gone (a SIGKILLed run)."""
    removed = []
    for ns in _list_namespaces():
        match = _OWNED.match(ns)
        if match and not pid_alive(int(match.group(1))):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
            removed.append(ns)
    return removed


def tx_bytes(ns: str, dev: str = "eth0") -> int:
    """Bytes `dev` in namespace `ns` has sent (its kernel counter: every frame, headers included).
    Works from inside another bench namespace too: `ip -n` enters `ns` by its name."""
    done = subprocess.run(
        ["ip", "-n", ns, "-j", "-s", "link", "show", "dev", dev], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise NetnsError(f"counters of {dev} in {ns}: {done.stderr.strip() or done.returncode}")
    try:
        return int(json.loads(done.stdout)[0]["stats64"]["tx"]["bytes"])
    except (ValueError, LookupError, TypeError) as exc:
        raise NetnsError(
            f"counters of {dev} in {ns}: unreadable `ip -j` output: {done.stdout[:200]!r}"
        ) from exc


@dataclass(frozen=True)
class Member:
    name: str
    ns: str
    ip: str

    def exec_argv(self, argv: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.ns, *argv]


class Topology:
    def __init__(self, subnet: str = "10.231.0") -> None:
        self.prefix = f"{NS_PREFIX}{os.getpid()}"
        self._subnet = subnet
        self._namespaces: list[str] = []
        self.members: dict[str, Member] = {}
        self._bridge_ns = self._add_namespace("br")
        _run("ip", "-n", self._bridge_ns, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self._bridge_ns, "link", "set", "br0", "up")

    def _add_namespace(self, name: str) -> str:
        ns = f"{self.prefix}-{name}"
        _run("ip", "netns", "add", ns)
        self._namespaces.append(ns)
        _run("ip", "-n", ns, "link", "set", "lo", "up")
        return ns

    def add(self, name: str, rate_mbit: float | None) -> Member:
        """A member at the next address; `rate_mbit` caps both directions of its link."""
        index = len(self.members) + 1
        if index > 250:
            raise NetnsError("at most 250 members")
        ns = self._add_namespace(name)
        port = f"p{index}"  # the bridge-side end, inside the bridge namespace
        _run(
            "ip",
            "-n",
            ns,
            "link",
            "add",
            "eth0",
            "type",
            "veth",
            "peer",
            "name",
            port,
            "netns",
            self._bridge_ns,
        )
        _run("ip", "-n", self._bridge_ns, "link", "set", port, "master", "br0", "up")
        ip = f"{self._subnet}.{index}"
        _run("ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
        _run("ip", "-n", ns, "link", "set", "eth0", "up")
        if rate_mbit is not None:
            for where, dev in ((ns, "eth0"), (self._bridge_ns, port)):
                _shape(where, dev, rate_mbit)
        member = Member(name, ns, ip)
        self.members[name] = member
        return member

    def destroy(self) -> list[str]:
        """Delete every namespace this topology made (their veths and the bridge go with them);
        returns the names that could not be deleted."""
        left = []
        for ns in reversed(self._namespaces):
            done = subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
            if done.returncode != 0 and ns in _list_namespaces():
                left.append(ns)
        self._namespaces.clear()
        return left


def _shape(ns: str, dev: str, rate_mbit: float) -> None:
    rate_bytes = rate_mbit * 1e6 / 8
    # tbf needs a bucket of at least one (GSO-sized) packet; ~10 ms of traffic keeps it smooth.
    burst = max(128 << 10, int(rate_bytes / 100))
    _run("tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "tbf", "rate", f"{rate_mbit:g}mbit",
         "burst", str(burst), "latency", "100ms")  # fmt: skip
