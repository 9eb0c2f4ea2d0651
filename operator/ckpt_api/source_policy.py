"""Which checkpoint sources an operator sends agents to and an agent pulls from.

A rollout names its source, so whoever may create a CheckpointRollout could point every agent at
any host the pods reach: the cloud metadata service, an internal admin API. A policy is a list of
allowed prefixes (empty: any source), and link-local addresses (169.254.0.0/16, fe80::/10, where
the metadata services live) are refused unless explicitly allowed. The operator checks a rollout's
URI (the CR is Stalled, InvalidSource); the agent checks the URI of every request and, for http
and mooncake sources, every address a host name resolves to before it connects, so a name that
resolves to a refused address (DNS rebinding included) is refused too.

A name says nothing about where it points: whoever controls a zone under an allowed name may point
it at this pod's own loopback or at the node's metadata service. So once there are rules, an
address that is not an ordinary unicast one (loopback, link-local, unspecified, multicast,
reserved; see `special_kind`) is allowed only by an address rule that contains it
(``http://127.0.0.0/8``), never by a name, ``*.suffix`` or ``*`` rule. Private networks are
ordinary here: in-cluster sources live there.

A rule is ``scheme://host[:port][/path-prefix]``; host is a name (``ckpt.example.com``), a
wildcard of subdomains (``*.example.com``), ``*`` (any host) or an address or CIDR
(``10.0.0.0/8``, ``[fd00::]/8``). ``file:///mnt/ckpt`` allows paths under /mnt/ckpt. Path prefixes
match whole segments: ``/ckpt`` allows ``/ckpt/v1`` but not ``/ckpt-other``.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from ckpt_api.constants import SOURCE_SCHEMES

IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_LINK_LOCAL = (ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"))
# Linux connects 0.x.y.z to this host, like loopback.
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
_RULE = re.compile(
    r"(?P<scheme>[a-z]+)://"
    r"(?P<host>\[[0-9A-Fa-f:.]+\](?:/\d{1,3})?|[^/:\[\]]*?(?:/\d{1,3}(?=$|[:/]))?)"
    r"(?::(?P<port>\d{1,5}))?"
    r"(?P<path>/.*)?"
)


class SourceRefused(ValueError):
    """A source the policy does not allow; the message says which rule it misses."""


@dataclass(frozen=True)
class SourceRule:
    scheme: str
    host: str | None  # a lower-case name, "*.suffix", or None with `network` / for any host
    network: IPNetwork | None
    port: int | None
    path: str  # "/" allows every path

    def allows_host(self, host: str) -> bool:
        if self.network is not None:
            address = _address(host)
            return address is not None and address in self.network
        if self.host is None:
            return True
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        return host == self.host

    def allows_path(self, path: str) -> bool:
        if self.path == "/":
            return True
        normal = posixpath.normpath(path or "/")
        return normal == self.path or normal.startswith(self.path + "/")

    def __str__(self) -> str:
        if self.scheme == "file":
            return f"file://{self.path}"
        host = self.host or "*"
        if self.network is not None:
            net = self.network
            whole = net.prefixlen == net.max_prefixlen  # one address, written as such
            address = f"[{net.network_address}]" if net.version == 6 else str(net.network_address)
            host = address if whole else f"{address}/{net.prefixlen}"
        port = f":{self.port}" if self.port is not None else ""
        return f"{self.scheme}://{host}{port}{'' if self.path == '/' else self.path}"


def parse_rule(text: str) -> SourceRule:
    match = _RULE.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"source rule {text!r} is not scheme://host[:port][/path]")
    scheme, host, port, path = match["scheme"], match["host"], match["port"], match["path"] or "/"
    if scheme not in SOURCE_SCHEMES:
        raise ValueError(f"source rule {text!r}: scheme must be one of {', '.join(SOURCE_SCHEMES)}")
    if scheme == "file":
        if host or port:
            raise ValueError(f"source rule {text!r}: a file rule names a path only (file:///path)")
        return SourceRule(scheme, None, None, None, _clean_path(text, path))
    network: IPNetwork | None = None
    name: str | None = None
    if not host:
        raise ValueError(f"source rule {text!r} names no host (use * for any)")
    if host != "*":
        try:
            network = ipaddress.ip_network(host.replace("[", "").replace("]", ""), strict=True)
        except ValueError as exc:
            if any(c in host for c in "[]/") or _address(host) is not None:
                raise ValueError(f"source rule {text!r}: {exc}") from None
            name = host.lower()
    if name is not None and ("*" in name[2:] or ("*" in name and not name.startswith("*."))):
        raise ValueError(f"source rule {text!r}: only a leading '*.' wildcard is allowed")
    number = int(port) if port is not None else None
    if number is not None and not 1 <= number <= 65535:
        raise ValueError(f"source rule {text!r}: port {number} is out of range")
    return SourceRule(scheme, name, network, number, _clean_path(text, path))


def _clean_path(text: str, path: str) -> str:
    normal = posixpath.normpath(path)
    if normal != path.rstrip("/") and path != "/":
        raise ValueError(f"source rule {text!r}: the path must be normalised (no '.', '..' or '//')")
    return normal if normal != "." else "/"


def _address(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def is_link_local(address: IPAddress) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return any((mapped or address) in network for network in _LINK_LOCAL)


def special_kind(address: IPAddress) -> str | None:
    """What makes ``address`` one that only an address rule may allow (None: an ordinary unicast
    address, private ones included). IPv4-mapped IPv6 addresses count as their IPv4 address."""
    plain = getattr(address, "ipv4_mapped", None) or address
    if plain.is_loopback:
        return "loopback"
    if is_link_local(plain):
        return "link-local"
    if plain.is_unspecified or (plain.version == 4 and plain in _THIS_NETWORK):
        return "unspecified"
    if plain.is_multicast:
        return "multicast"
    if plain.is_reserved:
        return "reserved"
    return None


def _rule_allows_address(rule: SourceRule, address: IPAddress) -> bool:
    """A rule that matched the URI allows ``address``: an address rule if it contains it, any
    other rule only if the address is an ordinary one."""
    if rule.network is not None:
        return address in rule.network
    return special_kind(address) is None


@dataclass(frozen=True)
class SourcePolicy:
    rules: tuple[SourceRule, ...] = ()
    allow_link_local: bool = False

    @classmethod
    def parse(cls, rules: list[str] | tuple[str, ...], *, allow_link_local: bool = False) -> SourcePolicy:
        return cls(tuple(parse_rule(r) for r in rules if r.strip()), allow_link_local)

    def _matching(self, scheme: str, host: str, port: int | None, path: str) -> list[SourceRule]:
        return [
            r
            for r in self.rules
            if r.scheme == scheme
            and (r.port is None or r.port == port)
            and (
                scheme == "file" or r.allows_host(host) or (r.network is not None and _address(host) is None)
            )
            and r.allows_path(path)
        ]

    def check_uri(self, uri: str) -> None:
        """Raise SourceRefused unless ``uri`` may be a source. A host name that only a CIDR rule
        can allow passes here; `check_address` decides once it is resolved."""
        parts = urlsplit(uri)
        host = (parts.hostname or "").lower()
        try:
            port = parts.port
        except ValueError:
            raise SourceRefused(f"source {uri!r} has an invalid port") from None
        address = _address(host)
        if address is not None and not self.allow_link_local and is_link_local(address):
            raise SourceRefused(f"source {uri!r} is a link-local address, which sources may not be")
        if not self.rules:
            return
        if not self._matching(parts.scheme, host, port, unquote(parts.path)):
            allowed = ", ".join(str(r) for r in self.rules)
            raise SourceRefused(f"source {uri!r} is not among the allowed sources ({allowed})")
        if address is not None:
            self.check_address(uri, address)

    def check_address(self, uri: str, address: IPAddress) -> None:
        """Raise SourceRefused unless the agent may connect to ``address`` for ``uri``."""
        if not self.allow_link_local and is_link_local(address):
            raise SourceRefused(f"source {uri!r} resolves to the link-local address {address}")
        if not self.rules:
            return
        parts = urlsplit(uri)
        host = (parts.hostname or "").lower()
        matching = self._matching(parts.scheme, host, parts.port, unquote(parts.path))
        if any(_rule_allows_address(r, address) for r in matching):
            return
        kind = special_kind(address)
        if kind is not None:
            raise SourceRefused(
                f"source {uri!r} resolves to the {kind} address {address}, which only an address "
                "rule containing it allows"
            )
        raise SourceRefused(f"source {uri!r} resolves to {address}, outside the allowed sources")
